"""dev/mutation.py's matching of surviving mutants to their recorded explanations (the mutation run
itself is `make mutation`, not part of the test suite)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dev import mutation

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
    entries = tomllib.loads((ROOT / "dev" / "mutation_survivors.toml").read_text())["survivor"]
    for entry in entries:
        assert entry["module"] in modules, entry
        assert entry["kind"] in ("equivalent", "gap"), entry
        assert entry["why"].strip() and ("line" in entry) != ("mutated" in entry), entry


def test_every_group_test_file_exists():
    for _, tests in mutation.GROUPS.values():
        for test in tests:
            assert (ROOT / test).is_file(), test


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


def test_the_report_names_each_groups_commit_the_unmeasured_groups_and_unexplained_survivors(monkeypatch):
    monkeypatch.setattr(mutation, "load_explanations", lambda: [])
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
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if "| `" in line}
    assert "`aaaaaaa`" in rows["router"] and "| 100.0% | yes |" in rows["router"]
    assert "`bbbbbbb`" in rows["cli"] and "| 90.0% | **no** |" in rows["cli"]
    (missing,) = [line for line in text.splitlines() if line.startswith("Not measured yet: ")]
    assert set(missing.removeprefix("Not measured yet: ").rstrip(".").split(", ")) == set(mutation.GROUPS) - {
        "router",
        "cli",
    }
    assert "**unexplained**" in text and "self._entries.popitem(last=None)" in text
    for module in mutation.NOT_MUTATED:
        assert f"- {module}: " in text


def test_a_run_fails_for_its_own_groups_under_the_bar(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "load_explanations", lambda: [])
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


def test_modules_not_mutated_are_in_no_group():
    grouped = {m for mods, _ in mutation.GROUPS.values() for m in mods}
    assert not grouped & set(mutation.NOT_MUTATED)
    for module in [*grouped, *mutation.NOT_MUTATED]:
        assert (mutation.PACKAGE / module).is_file(), module
