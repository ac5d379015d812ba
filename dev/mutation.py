"""`make mutation`: mutation score of every product module the fast tests reach, per module and per group (mutmut 3).

mutmut mutates a copy of the code and finds the tests that reach each function by running them once;
every mutant then runs only those tests, in a forked worker. Two things about this repository need a
scratch layout (build/mutation/): mutmut names modules from their path and puts only ./, src/ or source/
first on sys.path, while our package lives under operator/ (which the editable install puts on sys.path,
so the tests would import the unmutated code). The scratch tree has the package under src/ and a
pyproject.toml with the [tool.mutmut] section for the chosen groups; the repository's own stays clean.

Only fast tests run inside the loop (the unit tier, and loopback tests that run the code in-process:
no real control plane, no vLLM); the test files are listed per group below. Code that a test reaches
only through a process it starts is not mutated there (the process imports the unmutated package):
NOT_MUTATED names those modules and why.

Groups are measured in separate runs (`make mutation GROUP=kube`): each run replaces its groups'
results, with the commit they were measured at, in bench/results/mutation.json, and the report
(bench/results/mutation.md) is rendered from all of them. It lists every surviving mutant with the
explanation recorded in dev/mutation_survivors.toml (equivalent, or a known gap) or says that it has
none, and names the groups not measured yet. The exit status is 1 when a group of this run scores
under THRESHOLD or a survivor in the report is unexplained.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "epd_operator"
WORK = ROOT / "build" / "mutation"
REPORT = ROOT / "bench" / "results" / "mutation.md"
RESULTS = ROOT / "bench" / "results" / "mutation.json"
SURVIVORS = ROOT / "dev" / "mutation_survivors.toml"
THRESHOLD = 95.0  # per group

# module (relative to epd_operator/) per group, and the test files that may kill its mutants
# The router's own tests that serve requests in-process (unit, and loopback servers on 127.0.0.1).
ROUTER_SERVING_TESTS = [
    "tests/unit/router/test_video_audio.py",
    "tests/unit/router/test_discovery.py",
    "tests/unit/router/test_dp.py",
    "tests/unit/router/test_generations.py",
    "tests/unit/router/test_metrics.py",
    "tests/unit/router/test_metrics_collectors.py",
    "tests/unit/router/test_spill_over.py",
    "tests/loopback/router/test_discovery_kube.py",
    "tests/loopback/router/test_http_server.py",
    "tests/loopback/router/test_http_server_wire.py",
    "tests/unit/router/test_http_messages.py",
    "tests/loopback/router/test_upstream_wire.py",
    "tests/loopback/router/test_upstream.py",
    "tests/loopback/router/test_pipeline.py",
    "tests/loopback/router/test_failures.py",
    "tests/loopback/router/test_bad_input.py",
    "tests/loopback/router/test_dp.py",
    "tests/loopback/router/test_generations.py",
    "tests/loopback/router/test_spill_over.py",
    "tests/loopback/router/test_video_audio.py",
]

GROUPS: dict[str, tuple[list[str], list[str]]] = {
    "render": (
        ["render/transfer.py", "render/vllm.py"],
        [
            "tests/unit/render/test_manifests.py",
            "tests/unit/render/test_transfer.py",
            "tests/unit/render/test_vllm.py",
            "tests/unit/render/test_parallel.py",
        ],
    ),
    "router": (
        ["router/pickers.py", "router/protocol.py", "router/reuse.py"],
        [
            "tests/unit/router/test_pickers.py",
            "tests/unit/router/test_protocol.py",
            "tests/unit/router/test_reuse.py",
            "tests/unit/router/test_video_audio.py",
            "tests/loopback/router/test_video_audio.py",
        ],
    ),
    "controller": (
        ["controller/apply.py", "controller/status.py", "controller/pods.py"],
        [
            "tests/unit/controller/test_apply.py",
            "tests/unit/controller/test_status.py",
            "tests/unit/controller/test_status_pods.py",
            "tests/unit/controller/test_status_autoscaling.py",
            "tests/unit/controller/test_status_keda.py",
            "tests/unit/controller/test_status_lws.py",
        ],
    ),
    "api": (
        ["api/rules.py", "api/validation.py"],
        ["tests/unit/api/test_validation.py", "tests/unit/api/test_rules.py"],
    ),
    "cli": (
        ["cli.py"],
        # not tests/unit/api/test_validation.py: its hundreds of specs through epdctl test the rules, and
        # would run for every mutant of the parser; test_cli.py covers each way epdctl reports a refusal
        ["tests/unit/test_cli.py", "tests/unit/api/test_docs.py", "tests/unit/janitor/test_sidecar.py"],
    ),
    "janitor": (
        ["janitor/deletion.py", "janitor/entries.py", "janitor/sidecar.py"],
        [
            "tests/unit/janitor/test_deletion.py",
            "tests/unit/janitor/test_entries.py",
            "tests/unit/janitor/test_sidecar.py",
            "tests/unit/janitor/test_vanishing.py",
            "tests/loopback/janitor/test_sidecar.py",
        ],
    ),
    "kube": (
        ["kube/client.py", "kube/connections.py", "kube/credentials.py", "kube/resources.py", "kube/watch.py"],
        [
            "tests/unit/kube/test_credentials.py",
            "tests/unit/kube/test_resources.py",
            "tests/unit/kube/test_connections.py",
            "tests/unit/kube/test_watch_request.py",
            "tests/unit/controller/test_apply.py",
            "tests/loopback/kube/test_client.py",
            "tests/loopback/kube/test_watch.py",
            "tests/loopback/kube/test_connections.py",
            "tests/loopback/kube/test_credentials.py",
        ],
    ),
    "controller-runtime": (
        [
            "controller/reconciler.py",
            "controller/leader.py",
            "controller/workqueue.py",
            "controller/cache.py",
            "controller/rollout.py",
            "controller/handlers.py",
            "controller/served_kinds.py",
        ],
        [
            "tests/unit/controller/test_reconciler.py",
            "tests/unit/controller/test_reconciler_runtime.py",
            "tests/unit/controller/test_reconciler_inputs.py",
            "tests/unit/controller/test_reconciler_passes.py",
            "tests/unit/controller/test_runtime_edges.py",
            "tests/unit/controller/test_leader.py",
            "tests/unit/controller/test_leader_renewal.py",
            "tests/unit/controller/test_handlers.py",
            "tests/unit/controller/test_cache.py",
            "tests/unit/controller/test_cache_contents.py",
            "tests/unit/controller/test_rollout.py",
            "tests/unit/controller/test_workqueue.py",
            "tests/unit/controller/test_status.py",
            "tests/unit/controller/test_status_keda.py",
            "tests/unit/controller/test_served_kinds.py",
        ],
    ),
    # The router's HTTP edge and its request flow: one group each, so that each is measured in one sitting.
    "router-edge": (
        ["router/http_server.py", "router/http_messages.py", "router/upstream.py"],
        ROUTER_SERVING_TESTS,
    ),
    "router-flow": (
        ["router/pipeline.py", "router/backends.py", "router/discovery.py", "router/metrics.py"],
        ROUTER_SERVING_TESTS,
    ),
}
# Product modules no group mutates, and why: their behaviour is reached only through a process or the
# real control plane, which run the unmutated package.
NOT_MUTATED: dict[str, str] = {
    "controller/main.py": "the operator's process: kopf's run loop against the API server (tests/integration)",
    "router/main.py": "the router's process entry: flags, uvloop, signals (tests/loopback/router/test_main.py "
    "and test_shutdown.py start it as a process)",
    "janitor/__main__.py": "`python -m epd_operator.janitor`: one call of main(), run as a process",
}
# read by the tests above through the repository root (examples rendered, schemas, chart values, generated docs),
# and dev/,
# which tests/support imports (free ports, the version pins)
ALSO_COPY = ["examples", "crds", "charts", "dev", "docs"]

KILLED = {"killed", "timeout", "caught by type check", "segfault"}


@dataclass
class ModuleResult:
    module: str
    counts: Counter[str] = field(default_factory=Counter)  # mutmut status -> mutants
    status: dict[str, str] = field(default_factory=dict)  # survivor (any status not killed) -> its status
    diffs: dict[str, str] = field(default_factory=dict)  # survivor -> unified diff

    def add(self, name: str, status: str, diff: str | None = None) -> None:
        self.counts[status] += 1
        if status not in KILLED:
            self.status[name] = status
            self.diffs[name] = diff or ""

    def count(self, *statuses: str) -> int:
        return sum(self.counts[s] for s in statuses)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def killed(self) -> int:
        return self.count(*KILLED)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": dict(sorted(self.counts.items())),
            "survivors": {name: {"status": self.status[name], "diff": self.diffs[name]} for name in self.status},
        }

    @classmethod
    def from_json(cls, module: str, data: dict[str, Any]) -> ModuleResult:
        survivors = data.get("survivors", {})
        return cls(
            module,
            Counter(data["counts"]),
            {name: s["status"] for name, s in survivors.items()},
            {name: s["diff"] for name, s in survivors.items()},
        )


@dataclass
class GroupRun:
    """One group's results as measured by one run: where (commit) and how (mutmut, workers, time)."""

    group: str
    run: dict[str, Any]  # commit, dirty, date, mutmut, elapsed_s, jobs, cores, load
    modules: dict[str, ModuleResult]

    @property
    def total(self) -> int:
        return sum(r.total for r in self.modules.values())

    @property
    def killed(self) -> int:
        return sum(r.killed for r in self.modules.values())

    @property
    def score(self) -> float:
        return score(self.killed, self.total)

    def to_json(self) -> dict[str, Any]:
        return {**self.run, "modules": {m: r.to_json() for m, r in self.modules.items()}}

    @classmethod
    def from_json(cls, group: str, data: dict[str, Any]) -> GroupRun:
        run = {k: v for k, v in data.items() if k != "modules"}
        return cls(group, run, {m: ModuleResult.from_json(m, r) for m, r in data["modules"].items()})


def load_results(path: Path = RESULTS) -> dict[str, GroupRun]:
    if not path.exists():
        return {}
    return {g: GroupRun.from_json(g, data) for g, data in json.loads(path.read_text()).items()}


def save_results(runs: dict[str, GroupRun], path: Path = RESULTS) -> None:
    """Groups in GROUPS order (then any no longer listed), so that the file diffs well between runs."""
    order = [g for g in GROUPS if g in runs] + sorted(g for g in runs if g not in GROUPS)
    path.write_text(json.dumps({g: runs[g].to_json() for g in order}, indent=1, ensure_ascii=False) + "\n")


def layout(work: Path, groups: list[str], modules: list[str]) -> None:
    """The scratch tree mutmut runs in: src/epd_operator, the tests, the files they read, the config."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, work / "src" / "epd_operator", ignore=skip)
    shutil.copytree(ROOT / "tests", work / "tests", ignore=skip)
    for name in ALSO_COPY:
        shutil.copytree(ROOT / name, work / name, ignore=skip)
    tests = sorted({t for g in groups for t in GROUPS[g][1] if (ROOT / t).exists()})
    config = {
        "source_paths": ["src"],
        "only_mutate": [f"src/epd_operator/{m}" for m in modules],
        "also_copy": ALSO_COPY,
        "pytest_add_cli_args_test_selection": tests,
        # hypothesis' example database and pytest's cache would carry state from one mutant to the next.
        # A mutant that makes a loopback test wait for an answer that never comes spends no CPU, so
        # mutmut's CPU-time limit never stops it: a per-test limit far above any listed test's run
        # (the slowest take about a second) fails it instead, and the mutant counts as killed.
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q", "--timeout", "20"],
        "use_git_change_detection": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    (work / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + "\n".join(lines) + "\n")


def run_mutmut(work: Path, jobs: int) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)]
    # mutmut draws a spinner per mutant: its output goes to a log, printed only when the run fails
    with open(work / "mutmut.log", "w") as log:
        done = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"mutmut failed ({done.returncode}), its output:\n{(work / 'mutmut.log').read_text()[-5000:]}")


def collect(work: Path, modules: list[str]) -> dict[str, ModuleResult]:
    """Read mutmut's per-file results, and the diff of every survivor, from the scratch tree."""
    os.chdir(work)
    sys.path.insert(0, str(work))
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    results: dict[str, ModuleResult] = {}
    for module in modules:
        path = Path("src/epd_operator") / module
        data = SourceFileMutationData(path=path)
        data.load()
        result = ModuleResult(module)
        for name, code in sorted(data.exit_code_by_key.items(), key=lambda kv: _natural(kv[0])):
            status = status_by_exit_code[code]
            result.add(name, status, None if status in KILLED else get_diff_for_mutant(name, path=path))
        results[module] = result
    os.chdir(ROOT)
    return results


def _natural(name: str) -> tuple[str, int]:
    head, _, number = name.rpartition("__mutmut_")
    return head, int(number) if number.isdigit() else 0


def function_of(name: str) -> str:
    """'epd_operator.router.reuse.xǁReuseCacheǁget__mutmut_3' -> 'ReuseCache.get'."""
    mangled = name.rpartition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("xǁ"):
        return ".".join(part for part in mangled[2:].split("ǁ") if part)
    return mangled.removeprefix("x_")


def diff_lines(diff: str, sign: str) -> list[str]:
    """The lines a diff removes ('-') or adds ('+'), stripped."""
    return [line[1:].strip() for line in diff.splitlines() if line.startswith(sign) and not line.startswith(sign * 3)]


def load_explanations() -> list[dict]:
    return tomllib.loads(SURVIVORS.read_text()).get("survivor", []) if SURVIVORS.exists() else []


def explain(module: str, name: str, diff: str, explanations: list[dict]) -> dict | None:
    """The recorded explanation of a survivor: same module and function, and either the source line
    it mutates (`line`: every mutant of that line) or the mutated line itself (`mutated`). Mutant
    numbers move whenever the code does; the lines do not."""
    func, removed, added = function_of(name), diff_lines(diff, "-"), diff_lines(diff, "+")
    for entry in explanations:
        if entry["module"] != module or entry["function"] != func:
            continue
        if ("line" in entry and entry["line"].strip() in removed) or (
            "mutated" in entry and entry["mutated"].strip() in added
        ):
            return entry
    return None


def score(killed: int, total: int) -> float:
    return 100.0 * killed / total if total else 100.0


def source_state(groups: list[str]) -> dict[str, Any]:
    """The commit the mutated code was copied at, and whether the working tree differed from it there."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    modules = [f"operator/epd_operator/{m}" for g in groups for m in GROUPS[g][0]]
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", *modules))}


def _run_line(run: dict[str, Any]) -> str:
    return (
        f"`{run['commit']}`{' + uncommitted changes' if run['dirty'] else ''}, {run['date']}, "
        f"mutmut {run['mutmut']}, {run['elapsed_s'] / 60:.1f} min with {run['jobs']} workers on {run['cores']} cores "
        f"(load {run['load']:.1f} at the end)"
    )


def report(runs: dict[str, GroupRun]) -> tuple[str, list[str]]:
    """The report of every measured group, and the groups whose survivors are not all explained."""
    explanations = load_explanations()
    measured = [g for g in GROUPS if g in runs]
    missing = [g for g in GROUPS if g not in runs]
    out = [
        "# Mutation score",
        "",
        "`make mutation` (dev/mutation.py) mutates each module of a group and runs, per mutant, those of the",
        "group's tests listed in dev/mutation.py that reach the mutated function (the unit tier and in-process",
        "loopback tests: no real control plane, no vLLM). Groups are measured in separate runs; each row says",
        "at which commit. Killed includes timeouts. Every survivor is listed below with why it is left",
        f"(dev/mutation_survivors.toml). The bar is {THRESHOLD:.0f}% per group.",
        "",
        "| group | measured at | mutants | killed | survived | no tests | score | meets the bar |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for group in measured:
        g = runs[group]
        out.append(
            f"| {group} | {_run_line(g.run)} | {g.total} | {g.killed} | "
            f"{sum(m.count('survived') for m in g.modules.values())} | "
            f"{sum(m.count('no tests') for m in g.modules.values())} | {g.score:.1f}% | "
            f"{'yes' if g.score >= THRESHOLD else '**no**'} |"
        )
    out += ["", "Not measured yet: " + (", ".join(missing) if missing else "none (every group is measured)") + "."]
    stale_groups = [g for g in measured if set(runs[g].modules) != set(GROUPS[g][0])]
    if stale_groups:
        out += [
            "",
            "Measured with another module list than dev/mutation.py's now (run again): "
            + ", ".join(stale_groups)
            + ".",
        ]
    out += ["", "Modules no group mutates (reached only through a process or the real control plane):", ""]
    out += [f"- {module}: {why}" for module, why in NOT_MUTATED.items()]
    out += [
        "",
        "## Per module",
        "",
        "| group | module | mutants | killed | survived | no tests | score |",
        "|---|---|---|---|---|---|---|",
    ]
    for group in measured:
        for r in runs[group].modules.values():
            out.append(
                f"| {group} | {r.module} | {r.total} | {r.killed} | {r.count('survived')} | "
                f"{r.count('no tests')} | {score(r.killed, r.total):.1f}% |"
            )
    out += ["", "## Surviving mutants", ""]
    unexplained: list[str] = []
    kinds: Counter[str] = Counter()
    used: set[int] = set()
    for group in measured:
        for r in runs[group].modules.values():
            if not r.diffs:
                continue
            out += [f"### {r.module} ({group})", ""]
            for name, diff in r.diffs.items():
                entry = explain(r.module, name, diff, explanations)
                if entry is None:
                    unexplained.append(group)
                    why = "**unexplained**"
                else:
                    used.add(id(entry))
                    kinds[entry["kind"]] += 1
                    why = f"**{entry['kind']}**: {entry['why']}"
                out += [f"- `{name.rpartition('.')[2]}` ({r.status[name]}) {why}", "", "  ```diff"]
                out += ["  " + line for line in diff.strip().splitlines() if not line.startswith(("---", "+++"))]
                out += ["  ```", ""]
    # an explanation no survivor matched (its mutant dies, or its code changed) would hide a future survivor
    mutated = {m for g in measured for m in runs[g].modules}
    stale = [e for e in explanations if id(e) not in used and e["module"] in mutated]
    if stale:
        out += ["## Explanations no survivor matched (remove them from dev/mutation_survivors.toml)", ""]
        out += [f"- {e['module']} {e['function']}: `{e.get('line') or e.get('mutated')}`" for e in stale] + [""]
    summary = "; ".join(f"{g}: {runs[g].killed}/{runs[g].total} = {runs[g].score:.1f}%" for g in measured)
    out[2:2] = [
        f"Per group: {summary or 'none measured'}. Survivors: {kinds['equivalent']} equivalent, "
        f"{kinds['gap']} known gaps, {len(unexplained)} unexplained.",
        "",
    ]
    return "\n".join(out).rstrip() + "\n", sorted(set(unexplained))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group", action="append", choices=sorted(GROUPS), help="only these groups (repeatable)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 2, help="mutants run at once (mutmut's --max-children)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="per-group results, updated by a run")
    parser.add_argument("--report", type=Path, default=REPORT, help="where to write the report")
    parser.add_argument("--reuse", action="store_true", help="report from the stored results, run nothing")
    parser.add_argument(
        "--module",
        action="append",
        help="mutate only these modules of the chosen groups (repeatable): a partial measure, so --results and "
        "--report must name files other than the committed ones",
    )
    parser.add_argument("--work", type=Path, default=WORK, help="the scratch tree (one per concurrent run)")
    args = parser.parse_args(argv)
    runs = load_results(args.results)
    groups = args.group or (list(runs) if args.reuse else list(GROUPS))
    modules = [m for g in groups for m in GROUPS[g][0] if not args.module or m in args.module]
    if args.module:
        unknown = sorted(set(args.module) - set(modules))
        if unknown:
            parser.error(f"--module {', '.join(unknown)}: not a module of {', '.join(groups)}")
        if args.results.resolve() == RESULTS or args.report.resolve() == REPORT:
            parser.error("--module measures part of a group: give --results and --report outside bench/results")
    if not args.reuse:
        start, state = time.monotonic(), source_state(groups)
        layout(args.work, groups, modules)
        run_mutmut(args.work, args.jobs)
        state.update(
            date=datetime.date.today().isoformat(),
            mutmut=version("mutmut"),
            elapsed_s=round(time.monotonic() - start, 1),
            jobs=args.jobs,
            cores=os.cpu_count(),
            load=round(os.getloadavg()[0], 2),
        )
        results = collect(args.work, modules)
        for group in groups:
            runs[group] = GroupRun(group, state, {m: results[m] for m in GROUPS[group][0] if m in results})
        save_results(runs, args.results)
    text, unexplained = report(runs)
    args.report.write_text(text)
    for group in groups:
        if group in runs:
            counts = sum((r.counts for r in runs[group].modules.values()), Counter())
            print(f"mutation {group}: {runs[group].score:.1f}% {dict(counts)}")
    print(f"results in {args.results}, report in {args.report}")
    failing = [g for g in groups if g in runs and (runs[g].score < THRESHOLD or g in unexplained)]
    if failing:
        print(f"under {THRESHOLD:.0f}% or with unexplained survivors: {', '.join(failing)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
