"""`make mutation`: mutation score of the pure core, per module and per group (mutmut 3).

mutmut mutates a copy of the code and finds the tests that reach each function by running them once;
every mutant then runs only those tests, in a forked worker. Two things about this repository need a
scratch layout (build/mutation/): mutmut names modules from their path and puts only ./, src/ or source/
first on sys.path, while our package lives under operator/ (which the editable install puts on sys.path,
so the tests would import the unmutated code). The scratch tree has the package under src/ and a
pyproject.toml with the [tool.mutmut] section for the chosen groups; the repository's own stays clean.

Only fast tests run inside the loop (the unit tier, and the router's loopback tests of video and audio;
no real control plane, no vLLM): the test files are listed per group below. The report (bench/results/mutation.md) lists every surviving mutant with
the explanation recorded in dev/mutation_survivors.toml (equivalent, or a known gap) or says that it has
none. The exit status is 1 when a group scores under 90% or a survivor is unexplained.
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "epd_operator"
WORK = ROOT / "build" / "mutation"
REPORT = ROOT / "bench" / "results" / "mutation.md"
SURVIVORS = ROOT / "dev" / "mutation_survivors.toml"
THRESHOLD = 90.0

# module (relative to epd_operator/) per group, and the test files that may kill its mutants
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
        ],
    ),
    "api": (
        ["api/rules.py", "api/validation.py"],
        ["tests/unit/api/test_validation.py", "tests/unit/api/test_rules.py"],
    ),
}
# read by the tests above through the repository root (examples rendered, schemas, chart values), and dev/,
# which tests/support imports (free ports, the version pins)
ALSO_COPY = ["examples", "crds", "charts", "dev"]

KILLED = {"killed", "timeout", "caught by type check", "segfault"}


@dataclass
class ModuleResult:
    module: str
    status: dict[str, str] = field(default_factory=dict)  # mutant name -> mutmut status
    diffs: dict[str, str] = field(default_factory=dict)  # survivor -> unified diff

    def count(self, *statuses: str) -> int:
        return sum(1 for s in self.status.values() if s in statuses)

    @property
    def total(self) -> int:
        return len(self.status)

    @property
    def killed(self) -> int:
        return sum(1 for s in self.status.values() if s in KILLED)


def layout(groups: list[str]) -> None:
    """The scratch tree mutmut runs in: src/epd_operator, the tests, the files they read, the config."""
    if WORK.exists():
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(PACKAGE, WORK / "src" / "epd_operator", ignore=skip)
    shutil.copytree(ROOT / "tests", WORK / "tests", ignore=skip)
    for name in ALSO_COPY:
        shutil.copytree(ROOT / name, WORK / name, ignore=skip)
    modules = [m for g in groups for m in GROUPS[g][0]]
    tests = sorted({t for g in groups for t in GROUPS[g][1] if (ROOT / t).exists()})
    config = {
        "source_paths": ["src"],
        "only_mutate": [f"src/epd_operator/{m}" for m in modules],
        "also_copy": ALSO_COPY,
        "pytest_add_cli_args_test_selection": tests,
        # hypothesis' example database and pytest's cache would carry state from one mutant to the next
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q"],
        "use_git_change_detection": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items()]
    (WORK / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + "\n".join(lines) + "\n")


def run_mutmut(jobs: int) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)]
    # mutmut draws a spinner per mutant: its output goes to a log, printed only when the run fails
    with open(WORK / "mutmut.log", "w") as log:
        done = subprocess.run(cmd, cwd=WORK, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        sys.exit(f"mutmut failed ({done.returncode}), its output:\n{(WORK / 'mutmut.log').read_text()[-5000:]}")


def collect(groups: list[str]) -> dict[str, ModuleResult]:
    """Read mutmut's per-file results, and the diff of every survivor, from the scratch tree."""
    os.chdir(WORK)
    sys.path.insert(0, str(WORK))
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    results: dict[str, ModuleResult] = {}
    for group in groups:
        for module in GROUPS[group][0]:
            path = Path("src/epd_operator") / module
            data = SourceFileMutationData(path=path)
            data.load()
            result = ModuleResult(module)
            for name, code in sorted(data.exit_code_by_key.items(), key=lambda kv: _natural(kv[0])):
                result.status[name] = status_by_exit_code[code]
                if result.status[name] not in KILLED:
                    result.diffs[name] = get_diff_for_mutant(name, path=path)
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


def source_state(groups: list[str]) -> dict:
    """The commit the mutated code was copied at, and whether the working tree differed from it there."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    modules = [f"operator/epd_operator/{m}" for g in groups for m in GROUPS[g][0]]
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", *modules))}


def report(groups: list[str], results: dict[str, ModuleResult], run: dict) -> tuple[str, bool]:
    explanations = load_explanations()
    ok = True
    out = [
        "# Mutation score of the pure core",
        "",
        f"`make mutation` (dev/mutation.py, mutmut {version('mutmut')}) on the code of commit `{run['commit']}`"
        + (" plus uncommitted changes in the mutated modules" if run["dirty"] else "")
        + f"; {len(results)} modules, {sum(r.total for r in results.values())} mutants, "
        f"{run['elapsed_s'] / 60:.1f} min with {run['jobs']} workers on {os.cpu_count()} cores "
        f"(load average {run['load']:.1f} at the end: other work shared the machine).",
        "",
        "One mutmut run covers all groups: each mutant ran those of the tests listed per group in",
        "dev/mutation.py that reach the mutated function (no real control plane, no vLLM). Killed includes",
        "timeouts. Every survivor is listed below with why it is left (dev/mutation_survivors.toml).",
        "",
        "| group | module | mutants | killed | survived | no tests | score |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = []
    for group in groups:
        mods = [results[m] for m in GROUPS[group][0]]
        for r in mods:
            out.append(
                f"| {group} | {r.module} | {r.total} | {r.killed} | {r.count('survived')} | "
                f"{r.count('no tests')} | {score(r.killed, r.total):.1f}% |"
            )
        total, killed = sum(r.total for r in mods), sum(r.killed for r in mods)
        s = score(killed, total)
        ok &= s >= THRESHOLD
        out.append(
            f"| **{group}** | all | **{total}** | **{killed}** | **{sum(r.count('survived') for r in mods)}** | "
            f"**{sum(r.count('no tests') for r in mods)}** | **{s:.1f}%** |"
        )
        summary.append(f"{group}: {killed}/{total} = {s:.1f}%")
    out += ["", "## Surviving mutants", ""]
    unexplained = 0
    kinds: Counter[str] = Counter()
    used: set[int] = set()
    for group in groups:
        for module in GROUPS[group][0]:
            r = results[module]
            if not r.diffs:
                continue
            out += [f"### {module}", ""]
            for name, diff in r.diffs.items():
                entry = explain(module, name, diff, explanations)
                if entry is None:
                    unexplained += 1
                    why = "**unexplained**"
                else:
                    used.add(id(entry))
                    kinds[entry["kind"]] += 1
                    why = f"**{entry['kind']}**: {entry['why']}"
                out += [f"- `{name.rpartition('.')[2]}` ({r.status[name]}) {why}", "", "  ```diff"]
                out += ["  " + line for line in diff.strip().splitlines() if not line.startswith(("---", "+++"))]
                out += ["  ```", ""]
    if unexplained:
        ok = False
    # an explanation no survivor matched (its mutant dies, or its code changed) would hide a future survivor
    stale = [e for e in explanations if id(e) not in used and e["module"] in results]
    if stale:
        out += ["## Explanations no survivor matched (remove them from dev/mutation_survivors.toml)", ""]
        out += [f"- {e['module']} {e['function']}: `{e.get('line') or e.get('mutated')}`" for e in stale] + [""]
    out.insert(
        4,
        f"Per group: {'; '.join(summary)}. Survivors: {kinds['equivalent']} equivalent, {kinds['gap']} known "
        f"gaps, {unexplained} unexplained.",
    )
    out.insert(5, "")
    return "\n".join(out).rstrip() + "\n", ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--group", action="append", choices=sorted(GROUPS), help="only these groups (repeatable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--report", type=Path, help=f"where to write the report (default {REPORT} for all groups)")
    parser.add_argument("--reuse", action="store_true", help="report from the last run's results, run nothing")
    args = parser.parse_args(argv)
    groups = args.group or list(GROUPS)
    if not args.reuse:
        start, state = time.monotonic(), source_state(groups)
        layout(groups)
        run_mutmut(args.jobs)
        state.update(elapsed_s=time.monotonic() - start, jobs=args.jobs, load=os.getloadavg()[0])
        (WORK / "run.json").write_text(json.dumps(state))
    run = json.loads((WORK / "run.json").read_text())
    results = collect(groups)
    text, ok = report(groups, results, run)
    target = args.report or (REPORT if groups == list(GROUPS) else WORK / "mutation.md")
    target.write_text(text)
    counts = Counter(s for r in results.values() for s in r.status.values())
    print(f"mutation: {dict(counts)}; report in {target}")
    print(text.split("\n")[4])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
