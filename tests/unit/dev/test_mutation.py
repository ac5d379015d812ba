"""dev/testing/mutation.py's matching of surviving mutants to their recorded explanations (the mutation run
itself is `make mutation`, not part of the test suite)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dev.testing import mutation

ROOT = Path(__file__).resolve().parents[3]

DIFF = """--- src/epd_operator/router/reuse.py
+++ src/epd_operator/router/reuse.py
@@ -4,4 +4,4 @@
     while len(self._entries) > self.max_items:
-        self._entries.popitem(last=False)
+        self._entries.popitem(last=None)
"""


def test_function_names_from_mutant_names():
    assert mutation.function_of("epd_operator.router.reuse.xǁReuseCacheǁremember__mutmut_8") == "ReuseCache.remember"
    assert mutation.function_of("epd_operator.render.vllm.x_model_path__mutmut_12") == "model_path"


def test_a_survivor_matches_by_the_line_it_mutates_or_the_line_it_writes():
    name = "epd_operator.router.reuse.xǁReuseCacheǁremember__mutmut_8"
    by_line = {
        "module": "router/reuse.py",
        "function": "ReuseCache.remember",
        "line": "self._entries.popitem(last=False)",
    }
    by_mutant = {
        "module": "router/reuse.py",
        "function": "ReuseCache.remember",
        "mutated": "self._entries.popitem(last=None)",
    }
    assert mutation.explain("router/reuse.py", name, DIFF, [by_line]) is by_line
    assert mutation.explain("router/reuse.py", name, DIFF, [by_mutant]) is by_mutant
    other_function = {**by_line, "function": "ReuseCache.recall"}
    other_line = {**by_mutant, "mutated": "self._entries.popitem(last=True)"}
    assert mutation.explain("router/reuse.py", name, DIFF, [other_function, other_line]) is None


def test_every_recorded_explanation_is_complete_and_names_a_module_of_a_group():
    modules = {m for mods, _ in mutation.GROUPS.values() for m in mods}
    entries = tomllib.loads((ROOT / "dev" / "testing" / "mutation_survivors.toml").read_text())["survivor"]
    for entry in entries:
        assert entry["module"] in modules, entry
        assert entry["kind"] in ("equivalent", "gap"), entry
        assert entry["why"].strip() and ("line" in entry) != ("mutated" in entry), entry


def run_of(commit: str) -> dict:
    return {"commit": commit, "dirty": False, "date": "2026-01-02", "mutmut": "3.8.1", "elapsed_s": 60.0}


def module_result(module: str, killed: int, survivors: dict[str, str]) -> mutation.ModuleResult:
    result = mutation.ModuleResult(module)
    for i in range(killed):
        result.add(f"epd_operator.x.x_f__mutmut_{i}", "killed")
    for name, diff in survivors.items():
        result.add(name, "survived", diff)
    return result


def test_results_of_separate_runs_are_stored_per_group_and_read_back(tmp_path):
    name = "epd_operator.router.reuse.xǁReuseCacheǁremember__mutmut_8"
    runs = {
        "router": mutation.GroupRun(
            "router",
            {**run_of("aaaaaaa"), "jobs": 1},
            {"router/reuse.py": module_result("router/reuse.py", 3, {name: DIFF})},
        ),
        "cli": mutation.GroupRun("cli", {**run_of("bbbbbbb"), "jobs": 2}, {"cli.py": module_result("cli.py", 5, {})}),
    }
    path = tmp_path / "mutation.json"
    mutation.save_results(runs, path)
    back = mutation.load_results(path)
    assert list(back) == ["router", "cli"]  # in GROUPS order, whatever order they were measured in
    assert back["router"].run["commit"] == "aaaaaaa" and back["cli"].run["commit"] == "bbbbbbb"
    reuse = back["router"].modules["router/reuse.py"]
    assert (reuse.total, reuse.killed, reuse.count("survived")) == (4, 3, 1)
    assert reuse.diffs == {name: DIFF} and reuse.status == {name: "survived"}
    assert back["cli"].score == 100.0 and back["router"].score == 75.0
    assert mutation.load_results(tmp_path / "absent.json") == {}


def no_mutmut(modules: list[str], package: Path = mutation.PACKAGE) -> dict[str, int]:
    return {}


def test_the_report_names_each_groups_commit_the_unmeasured_groups_and_unexplained_survivors(monkeypatch):
    monkeypatch.setattr(mutation, "load_explanations", lambda: [])
    monkeypatch.setattr(mutation, "count_mutants", no_mutmut)
    name = "epd_operator.router.reuse.xǁReuseCacheǁremember__mutmut_8"
    meta = {"jobs": 1, "cores": 2, "load": 1.5}
    runs = {
        "router": mutation.GroupRun(
            "router", {**run_of("aaaaaaa"), **meta}, {m: module_result(m, 99, {}) for m in mutation.GROUPS["router"][0]}
        ),
        "cli": mutation.GroupRun(
            "cli", {**run_of("bbbbbbb"), **meta}, {"cli.py": module_result("cli.py", 9, {name: DIFF})}
        ),
    }
    text, unexplained = mutation.report(runs)
    assert unexplained == ["cli"]
    groups = table(text, "## Per group")
    assert "`aaaaaaa`, 2026-01-02" in groups["router"][2] and groups["router"][3] == "1.0 on 2 cores, 1 workers"
    assert groups["router"][-2:] == ["100.0%", "none"]
    assert "`bbbbbbb`" in groups["cli"][2] and groups["cli"][-2:] == ["90.0%", "cli.py"]
    for group in set(mutation.GROUPS) - {"router", "cli"}:
        assert groups[group][2] == "not measured yet", group
    assert "**unexplained**" in text and "self._entries.popitem(last=None)" in text
    for module in mutation.NOT_MUTATED:
        assert f"- {module}: " in text


def table(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the table under `heading`, by their first cell."""
    lines = text.split(heading + "\n", 1)[1].splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| ---")]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]  # rows[0]: the header
    return {row[0]: row for row in cells[: next((i for i, r in enumerate(rows[1:]) if not r), len(cells))]}


def test_the_report_lists_every_module_of_the_package_measured_or_why_not(monkeypatch):
    monkeypatch.setattr(mutation, "load_explanations", lambda: [])
    monkeypatch.setattr(mutation, "count_mutants", lambda modules, package: {m: len(m) for m in modules})
    meta = {"jobs": 2, "cores": 2, "load": 1.0}
    runs = {"cli": mutation.GroupRun("cli", {**run_of("c"), **meta}, {"cli.py": module_result("cli.py", 19, {})})}
    runs["cli"].modules["cli.py"].add("epd_operator.cli.x_f__mutmut_99", "no tests")
    text = mutation.report(runs)[0]
    modules = table(text, "## Per module")
    assert sorted(modules) == mutation.package_modules()
    assert modules["cli.py"][1:] == ["cli", "yes", "20", "19", "0", "1", "95.0%", "yes"]
    assert modules["render/keda.py"][1:4] == ["render-autoscaling", "not measured yet", str(len("render/keda.py"))]
    # what is not measured yet, counted by mutmut's generator: per module, per group and in all
    autoscaling = table(text, "## Per group")["render-autoscaling"]
    assert autoscaling[1:3] == ["2", "not measured yet"]
    assert autoscaling[4] == str(len("render/keda.py") + len("render/autoscaling.py"))
    waiting = [m for m, row in modules.items() if row[2] == "not measured yet"]
    assert f"not measured yet: {len(waiting)} ({sum(map(len, waiting))} mutants)" in text
    assert modules["controller/main.py"][2] == "not mutated: process entry point (below)"
    assert modules["api/status.py"][2] == "nothing to mutate: no function"


def test_a_module_in_no_group_is_named_in_the_report(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "load_explanations", lambda: [])
    monkeypatch.setattr(mutation, "count_mutants", no_mutmut)
    (tmp_path / "cli.py").write_text("def f():\n    return 1\n")
    (tmp_path / "new.py").write_text("def g():\n    return 2\n")
    (tmp_path / "consts.py").write_text("X = 1\n")
    text, _ = mutation.report({}, package=tmp_path)
    modules = table(text, "## Per module")
    assert sorted(modules) == ["cli.py", "consts.py", "new.py"]
    assert modules["new.py"][1] == "**in no group**" and "**in no group: 1**" in text
    assert modules["cli.py"][1:4] == ["cli", "not measured yet", ""]  # mutmut not installed: no count
    assert modules["consts.py"][2] == "nothing to mutate: no function"


def test_scores_are_rounded_down_so_a_score_under_the_bar_never_reads_95():
    assert mutation.shown(659, 694) == "94.9%" and not mutation.meets_bar(659, 694)
    assert mutation.shown(19, 20) == "95.0%" and mutation.meets_bar(19, 20)
    assert mutation.shown(0, 0) == "100.0%"


def test_the_minutes_of_a_run_that_measured_several_groups_name_them_and_old_rows_say_not_recorded():
    shared = {**run_of("a"), "jobs": 2, "cores": 2, "load": 1.0, "elapsed_s": 690.0}
    runs = {
        "kube": mutation.GroupRun("kube", dict(shared), {}),
        "router-flow": mutation.GroupRun("router-flow", dict(shared), {}),
        "cli": mutation.GroupRun("cli", {"commit": "b", "dirty": False}, {}),
    }
    assert mutation._minutes("kube", runs) == "11.5 on 2 cores, 2 workers (one run with router-flow)"
    assert mutation._minutes("cli", runs) == "not recorded"
    assert (
        mutation._measured_at(runs["cli"].run) == "`b`, not recorded, mutmut not recorded, load not recorded at the end"
    )


def test_stale_rows_name_the_modules_changed_since_their_commit_and_every_other_reason():
    def changed(commit: str, paths: list[str]) -> list[str] | None:
        if commit == "gone":
            return None
        return paths[:1] if commit == "old" else []

    grouped = {m: module_result(m, 1, {}) for m in mutation.GROUPS["router"][0]}
    runs = {
        "router": mutation.GroupRun("router", run_of("old"), grouped),
        "cli": mutation.GroupRun("cli", run_of("new"), {"cli.py": module_result("cli.py", 1, {})}),
        "api": mutation.GroupRun("api", run_of("gone"), {"api/rules.py": module_result("api/rules.py", 1, {})}),
        "janitor": mutation.GroupRun("janitor", {**run_of("new"), "dirty": True}, {}),
        "retired": mutation.GroupRun("retired", run_of("new"), {}),
    }
    stale = mutation.stale_rows(runs, changed)
    assert stale == {
        "router": f"changed since old: {mutation.GROUPS['router'][0][0]}",
        "api": "its module list in dev/testing/mutation.py changed; this repository does not hold its commit gone",
        "janitor": "its module list in dev/testing/mutation.py changed; measured with uncommitted changes",
        "retired": "no longer a group of dev/testing/mutation.py",
    }
    text = mutation.stale_text(runs, stale)
    assert "router (measured at old): changed since old" in text and "4 of 5 measured groups stale" in text


def test_stale_lists_without_running_anything_and_never_fails(tmp_path, monkeypatch, capsys):
    results = tmp_path / "m.json"
    mutation.save_results(
        {"cli": mutation.GroupRun("cli", run_of("x"), {"cli.py": module_result("cli.py", 1, {})})}, results
    )
    monkeypatch.setattr(mutation, "changed_since", lambda commit, paths: [paths[0]])
    assert mutation.main(["--stale", "--results", str(results)]) == 0
    assert "cli (measured at x): changed since x: cli.py" in capsys.readouterr().out
    assert not (tmp_path / "m.md").exists()


def test_a_run_fails_for_its_own_groups_under_the_bar(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "load_explanations", lambda: [])
    monkeypatch.setattr(mutation, "count_mutants", no_mutmut)
    meta = {"jobs": 1, "cores": 2, "load": 1.5}
    runs = {
        "cli": mutation.GroupRun("cli", {**run_of("b"), **meta}, {"cli.py": module_result("cli.py", 100, {})}),
        "kube": mutation.GroupRun(
            "kube", {**run_of("c"), **meta}, {"kube/client.py": module_result("kube/client.py", 94, {})}
        ),
    }
    for i in range(6):  # 94 of 100 killed
        runs["kube"].modules["kube/client.py"].add(f"epd_operator.kube.client.x_g__mutmut_{i}", "no tests")
    results, report = tmp_path / "m.json", tmp_path / "m.md"
    mutation.save_results(runs, results)
    argv = ["--reuse", "--results", str(results), "--report", str(report)]
    assert mutation.main([*argv, "--group", "cli"]) == 0
    assert mutation.main(argv) == 1  # kube: 94 of 100
    assert "kube/client.py" in report.read_text()


def test_a_run_of_some_modules_names_modules_of_its_groups_and_writes_outside_the_committed_results(tmp_path, capsys):
    elsewhere = ["--results", str(tmp_path / "m.json"), "--report", str(tmp_path / "m.md")]
    with pytest.raises(SystemExit):
        mutation.main(["--group", "cli", "--module", "router/upstream.py", *elsewhere])
    assert "--module router/upstream.py: not a module of cli" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mutation.main(["--group", "router-edge", "--module", "router/upstream.py"])
    assert "give --results and --report outside bench/results" in capsys.readouterr().err


def test_every_module_of_the_package_is_in_a_mutation_group_or_is_a_process_entry_point():
    problems = mutation.coverage_problems()
    assert not problems, "dev/testing/mutation.py does not cover operator/epd_operator:\n- " + "\n- ".join(problems)


def test_coverage_problems_name_each_gap_and_what_to_do(tmp_path):
    package, root = tmp_path / "pkg", tmp_path
    (package / "sub").mkdir(parents=True)
    for name, code in {
        "grouped.py": "def f():\n    return 1\n",
        "twice.py": "class C:\n    def m(self):\n        return 1\n",
        "forgotten.py": "async def g():\n    return 2\n",
        "sub/__init__.py": "from .consts import X\n",
        "sub/consts.py": "X = 1\n",
        "main.py": "def main():\n    pass\n",
        "__main__.py": "from .main import main\nmain()\n",
        "helper.py": "def h():\n    return 3\n",
    }.items():
        (package / name).write_text(code)
    (root / "t.py").write_text("")
    groups = {
        "a": (["grouped.py", "twice.py", "sub/consts.py"], ["t.py"]),
        "b": (["twice.py", "gone.py"], ["t.py", "missing_test.py"]),
    }
    not_mutated = {"main.py": "a process", "__main__.py": "a process", "helper.py": "not a process"}
    problems = mutation.coverage_problems(package, groups, not_mutated, root)
    assert [p.split(" ", 1)[0] for p in problems] == [
        "forgotten.py",  # in no group
        "helper.py",  # NOT_MUTATED but no entry point
        "sub/consts.py",  # in a group, nothing to mutate
        "twice.py",  # in two groups
        "gone.py",  # no such module
        "missing_test.py,",
    ]
    assert "add it in dev/testing/mutation.py's GROUPS" in problems[0] and "make mutation GROUP=" in problems[0]
    assert "process entry points only" in problems[1] and "remove it from group a" in problems[2]
    assert "group a and group b" in problems[3] and "remove it there" in problems[4]


def test_mutants_are_counted_by_mutmuts_own_generator_in_functions_only(tmp_path):
    pytest.importorskip("mutmut", reason="the mutation extra: .venv/bin/pip install -e '.[test,mutation]'")
    (tmp_path / "f.py").write_text("LIMIT = 1 + 2\n\n\ndef f(a):\n    return a + LIMIT\n")
    (tmp_path / "consts.py").write_text("LIMIT = 1 + 2\n")
    here = Path.cwd()
    counts = mutation.count_mutants(["f.py", "consts.py"], tmp_path)
    assert counts["f.py"] > 0 and counts["consts.py"] == 0, counts  # module-level code is never mutated
    assert Path.cwd() == here


def test_each_test_has_its_groups_limit_and_a_run_of_several_the_longest():
    assert mutation.per_test_limit(["router-serving"]) == 8
    assert mutation.per_test_limit(["kube"]) == mutation.TEST_TIMEOUT_S == 20
    assert mutation.per_test_limit(["router-serving", "kube"]) == 20
