"""`make mutation`: mutation score of every product module the fast tests reach, per module and per group (mutmut 3).

mutmut mutates a copy of the code and finds the tests that reach each function by running them once;
every mutant then runs only those tests, in a forked worker. Two things about this repository need a
scratch layout (build/mutation/): mutmut names modules from their path and puts only ./, src/ or source/
first on sys.path, while our package lives under operator/ (which the editable install puts on sys.path,
so the tests would import the unmutated code). The scratch tree has the package under src/ and a
pyproject.toml with the [tool.mutmut] section for the chosen groups; the repository's own stays clean.

Only fast tests run inside the loop (the unit tier, and loopback tests that run the code in-process:
no real control plane, no vLLM); the test files are listed per group below. Every module of the package
is in one group, except the process entry points NOT_MUTATED names (a process imports the unmutated
package) and modules that define no function (mutmut mutates function bodies only); coverage_problems()
says what is missing, and tests/unit/dev/test_mutation.py fails on it.

Groups are measured in separate runs (`make mutation GROUP=kube`): each run replaces its groups'
results, with the commit, date and duration of the run, in bench/results/mutation.json, and the report
(bench/results/mutation.md) is rendered from all of them. It lists every module of the package, measured
or why not, every surviving mutant with the explanation recorded in dev/testing/mutation_survivors.toml
(equivalent, or a known gap) or says that it has none. `--stale` lists the stored rows whose modules
changed since their commit. The exit status of a run is 1 when a module of its groups scores under
THRESHOLD or a survivor in the report is unexplained.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = "operator/epd_operator"  # relative to ROOT, as git names its files
PACKAGE = ROOT / PACKAGE_DIR
WORK = ROOT / "build" / "mutation"
REPORT = ROOT / "bench" / "results" / "mutation.md"
RESULTS = ROOT / "bench" / "results" / "mutation.json"
SURVIVORS = ROOT / "dev" / "testing" / "mutation_survivors.toml"
THRESHOLD = 95.0  # per module

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

RENDER_TESTS = [
    "tests/unit/render/test_manifests.py",
    "tests/unit/render/test_boundaries.py",
    "tests/unit/render/test_generation.py",
    "tests/unit/render/test_keda.py",
    "tests/unit/render/test_network_policy.py",
    "tests/unit/render/test_parallel.py",
    "tests/unit/render/test_pod_security.py",
    "tests/unit/render/test_schemas.py",
    "tests/unit/render/test_tracing.py",
    "tests/unit/render/test_transfer.py",
    "tests/unit/render/test_vllm.py",
    "tests/unit/render/test_golden.py",
    "tests/unit/render/test_router_args.py",
    "tests/unit/render/test_pods.py",
]

GROUPS: dict[str, tuple[list[str], list[str]]] = {
    # The connectors' pieces (args, env, ports, the NetworkPolicies' transfer ingress) and vLLM's command line.
    "render": (["render/transfer.py", "render/vllm.py"], RENDER_TESTS),
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
        [
            "controller/apply.py",
            "controller/status.py",
            "controller/status_deployment.py",
            "controller/status_hpa.py",
            "controller/status_keda.py",
            "controller/status_lws.py",
            "controller/pods.py",
        ],
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
    # The request's handlers, calls to the tiers and the spill rule (every loopback test reaches them: the
    # longest group, about 12 s a mutant on 2 cores).
    "router-serving": (
        ["router/server.py", "router/calls.py", "router/context.py", "router/encoding.py"],
        [
            *ROUTER_SERVING_TESTS,
            "tests/loopback/router/test_models_and_health.py",
            "tests/loopback/router/test_tracing_router.py",
            "tests/unit/router/test_encoder_demand.py",
            "tests/loopback/router/test_encoder_demand.py",
        ],
    ),
    # What the router reports of a request beside its answer: failure replies, spans, the encoder demand.
    "router-report": (
        ["router/failures.py", "router/tracing.py", "router/demand.py"],
        [
            "tests/unit/router/test_failures.py",
            "tests/loopback/router/test_tracing_spans.py",
            "tests/loopback/router/test_tracing.py",
            "tests/unit/router/test_demand_peak.py",
            "tests/unit/router/test_encoder_demand.py",
            "tests/loopback/router/test_encoder_demand.py",
            "tests/loopback/router/test_failures.py",
            "tests/loopback/router/test_pipeline.py",
        ],
    ),
    # The router's flags and the config they give, parsed from what the renderer writes.
    "router-config": (
        ["router/config.py", "router/flags.py"],
        [
            "tests/unit/router/test_config.py",
            "tests/unit/router/test_flags.py",
            "tests/unit/router/test_main.py",
            "tests/unit/router/test_spill_over.py",
            "tests/unit/router/test_dp.py",
            "tests/unit/router/test_discovery.py",
            "tests/unit/render/test_manifests.py",
            "tests/unit/render/test_parallel.py",
            "tests/unit/render/test_tracing.py",
        ],
    ),
    # The renderer's modules are reached through render(): every test of tests/unit/render may kill them (the
    # golden comparison of every example's objects among them).
    "render-tiers": (
        [
            "render/manifests.py",
            "render/plan.py",
            "render/vllm_tiers.py",
            "render/pods.py",
            "render/naming.py",
            "render/templating.py",
            "render/generation.py",
            "render/tracing.py",
        ],
        [*RENDER_TESTS, "tests/unit/controller/test_rollout.py"],
    ),
    "render-router": (
        ["render/router_args.py", "render/router_workload.py"],
        [*RENDER_TESTS, "tests/unit/router/test_spill_over.py"],
    ),
    "render-autoscaling": (["render/autoscaling.py", "render/keda.py"], RENDER_TESTS),
    "render-multinode": (["render/lws.py"], RENDER_TESTS),
    "render-policy": (["render/network_policy.py"], RENDER_TESTS),
    # The spec's models by subject and quantities (api: the rules over them), and what is generated from them.
    "api-model": (
        [
            "api/spec.py",
            "api/tiers.py",
            "api/transfer.py",
            "api/router.py",
            "api/network.py",
            "api/fields.py",
            "api/quantity.py",
        ],
        [
            "tests/unit/api/test_validation.py",
            "tests/unit/api/test_fields.py",
            "tests/unit/api/test_rules.py",
            "tests/unit/api/test_quantity.py",
            "tests/unit/api/test_crd.py",
            # the defaults and validators reach the rendered objects of every example
            "tests/unit/render/test_golden.py",
            "tests/unit/render/test_manifests.py",
            "tests/unit/render/test_network_policy.py",
        ],
    ),
    "api-schema": (
        ["api/crd.py", "api/kube_schemas.py", "api/docs.py"],
        [
            "tests/unit/api/test_crd.py",
            "tests/unit/api/test_docs.py",
            "tests/unit/api/test_kube_schemas.py",
            "tests/unit/api/test_fields.py",
            "tests/unit/dev/test_generate.py",
            "tests/unit/support/test_crd_schema.py",
            "tests/unit/render/test_keda.py",
        ],
    ),
    # What the operator reports beside the status: Events and its Prometheus metrics.
    "controller-signals": (
        ["controller/events.py", "controller/metrics.py"],
        [
            "tests/unit/controller/test_events.py",
            "tests/unit/controller/test_metrics.py",
            "tests/unit/controller/test_reconciler.py",
            "tests/unit/controller/test_reconciler_runtime.py",
            "tests/unit/controller/test_reconciler_inputs.py",
            "tests/unit/controller/test_reconciler_passes.py",
            "tests/unit/controller/test_runtime_edges.py",
        ],
    ),
}
# The only product modules no group mutates: process entry points, whose behaviour is the process (flags, signals,
# the run loop), reached through a process or the real control plane, which run the unmutated package. Modules that
# define no function (data classes, constants, re-exports) need no entry: mutmut mutates function bodies only.
NOT_MUTATED: dict[str, str] = {
    "controller/main.py": "the operator's process: kopf's run loop against the API server (tests/integration)",
    "router/main.py": "the router's process entry: flags, uvloop, signals (tests/loopback/router/test_main.py "
    "and test_shutdown.py start it as a process)",
    "janitor/__main__.py": "`python -m epd_operator.janitor`: one call of main(), run as a process",
}
# read by the tests above through the repository root (examples rendered, schemas, chart values, generated docs),
# and dev/,
# which tests/support imports (free ports, the version pins)
ALSO_COPY = ["examples", "crds", "charts", "dev", "docs", "bench"]

# Seconds a test may run in a mutation run (pytest-timeout). A mutant that makes a loopback test wait for an
# answer that never comes spends no CPU, so mutmut's CPU-time limit never stops it: a limit far above any
# listed test's run fails it instead, and the mutant counts as killed. router-serving's mutants hang its
# handlers most often; its slowest test takes 3 s (the demand window's sleeps), so 8 s there. The limit ends
# the mutant's test process (pytest-timeout's thread method, exit 1): the signal method raises in whatever
# frame runs, and inside an event loop's callback asyncio catches and logs it and the test goes on waiting.
TEST_TIMEOUT_S = 20
GROUP_TEST_TIMEOUT_S = {"router-serving": 8}

KILLED = {"killed", "timeout", "caught by type check", "segfault"}


def package_modules(package: Path = PACKAGE) -> list[str]:
    """Every module of the package, relative to it ('router/pickers.py')."""
    return sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _functions(tree: ast.Module) -> list[str]:
    """What mutmut mutates: the module-level functions and the methods of module-level classes."""
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = [node.name for node in tree.body if isinstance(node, defs)]
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names += [f"{node.name}.{m.name}" for m in node.body if isinstance(m, defs)]
    return names


def has_functions(path: Path) -> bool:
    """Whether mutmut has anything to mutate in a module (a data class, constants or re-exports: nothing)."""
    return bool(_functions(ast.parse(path.read_text())))


def is_entry_point(path: Path) -> bool:
    """A process entry point: `__main__.py`, or a module that defines `main()`."""
    return path.name == "__main__.py" or "main" in _functions(ast.parse(path.read_text()))


def count_mutants(modules: list[str], package: Path = PACKAGE) -> dict[str, int]:
    """How many mutants mutmut makes of each module: its own generator over the source, no test run (seconds for
    the package). Empty without mutmut (the `mutation` extra): the report then gives no count for what it has
    not measured."""
    try:
        from mutmut import configuration
        from mutmut.mutation.file_mutation import mutate_file_contents
    except ImportError:
        return {}
    here = Path.cwd()
    # The generator reads mutmut's config (patterns not to mutate) from the working directory's pyproject.toml.
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["src"]\n')
        os.chdir(scratch)
        configuration._config = None
        try:
            return {m: len(mutate_file_contents(m, (package / m).read_text()).mutant_names) for m in modules}
        finally:
            configuration._config = None
            os.chdir(here)


def coverage_problems(
    package: Path = PACKAGE,
    groups: dict[str, tuple[list[str], list[str]]] | None = None,
    not_mutated: dict[str, str] | None = None,
    root: Path = ROOT,
) -> list[str]:
    """What keeps the groups from covering the package, each with what to do about it: a module with functions in
    no group, a module in two places, a group module with nothing to mutate, a named module or test file that does
    not exist, a NOT_MUTATED module that is not a process entry point. Empty when the groups cover the package."""
    groups = GROUPS if groups is None else groups
    not_mutated = NOT_MUTATED if not_mutated is None else not_mutated
    modules = package_modules(package)
    where: dict[str, list[str]] = {}
    for group, (mods, _) in groups.items():
        for module in mods:
            where.setdefault(module, []).append(f"group {group}")
    for module in not_mutated:
        where.setdefault(module, []).append("NOT_MUTATED")
    problems = []
    for module in modules:
        places, mutable = where.get(module, []), has_functions(package / module)
        if not places and mutable:
            problems.append(
                f"{module} is in no mutation group: add it in dev/testing/mutation.py's GROUPS to the group of its subject "
                "(or a new group) with the test files that reach it (those that import it or what calls it), then "
                "measure that group (make mutation GROUP=<group>); until then the report lists it as not measured yet"
            )
        if len(places) > 1:
            problems.append(f"{module} is in {' and '.join(places)}: keep it in one")
        if not mutable and any(place.startswith("group ") for place in places):
            problems.append(
                f"{module} defines no function, so mutmut mutates nothing there: remove it from {places[0]}"
            )
        if module in not_mutated and not is_entry_point(package / module):
            problems.append(
                f"{module} is in NOT_MUTATED, which is for process entry points only (__main__.py or a module "
                "with main()): put it in a group"
            )
    for module in sorted(set(where) - set(modules)):
        problems.append(
            f"{module} is in {' and '.join(where[module])} of dev/testing/mutation.py but not in {package.name}/: "
            "remove it there (or name the module its code moved to), and its entries in dev/testing/mutation_survivors.toml"
        )
    for group, (_, tests) in groups.items():
        problems += [
            f"{test}, a test file of group {group}, does not exist: remove it from the group (or name the file "
            "its tests moved to)"
            for test in tests
            if not (root / test).is_file()
        ]
    return problems


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


def per_test_limit(groups: list[str]) -> int:
    """The per-test limit of a run of `groups`: the longest any of them allows."""
    return max(GROUP_TEST_TIMEOUT_S.get(g, TEST_TIMEOUT_S) for g in groups)


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
    # The package's data files where the repository has them (operator/epd_operator/...): the freshness test
    # of the generated files compares kube_schemas.json there. No module: the tests import src/'s mutants.
    data = shutil.ignore_patterns("__pycache__", "*.pyc", "*.py")
    shutil.copytree(PACKAGE, work / PACKAGE_DIR, ignore=data)
    tests = sorted({t for g in groups for t in GROUPS[g][1] if (ROOT / t).exists()})
    config = {
        "source_paths": ["src"],
        "only_mutate": [f"src/epd_operator/{m}" for m in modules],
        "also_copy": [*ALSO_COPY, PACKAGE_DIR.split("/")[0]],
        "pytest_add_cli_args_test_selection": tests,
        # hypothesis' example database and pytest's cache would carry state from one mutant to the next.
        "pytest_add_cli_args": [
            "-p",
            "no:cacheprovider",
            "-q",
            "--timeout",
            str(per_test_limit(groups)),
            "--timeout-method",
            "thread",
        ],
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


def meets_bar(killed: int, total: int) -> bool:
    return 100 * killed >= THRESHOLD * total


def shown(killed: int, total: int) -> str:
    """A score rounded down to a tenth, so that 94.96% reads 94.9%, never a 95.0% under the bar."""
    return f"{(1000 * killed // total) / 10 if total else 100.0:.1f}%"


def source_state(groups: list[str]) -> dict[str, Any]:
    """The commit the mutated code was copied at, and whether the working tree differed from it there."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    modules = [f"{PACKAGE_DIR}/{m}" for g in groups for m in GROUPS[g][0]]
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", *modules))}


def changed_since(commit: str, paths: list[str], root: Path = ROOT) -> list[str] | None:
    """Those of `paths` (relative to `root`) whose content differs between `commit` and the working tree; None when
    the repository does not hold `commit`."""
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=root, capture_output=True)
    if known.returncode:
        return None
    diff = subprocess.run(
        ["git", "diff", "--name-only", commit, "--", *paths], cwd=root, capture_output=True, text=True, check=True
    )
    return sorted(diff.stdout.split())


def stale_rows(
    runs: dict[str, GroupRun], changed: Callable[[str, list[str]], list[str] | None] | None = None
) -> dict[str, str]:
    """The measured groups whose figures may not describe the code any more, each with why: a module changed since
    the commit it was measured at (or the run had uncommitted changes, or the repository lacks that commit), or the
    group's module list changed."""
    changed = changed or changed_since
    stale: dict[str, str] = {}
    for group, g in runs.items():
        reasons = []
        if group not in GROUPS:
            reasons.append("no longer a group of dev/testing/mutation.py")
        elif set(g.modules) != set(GROUPS[group][0]):
            reasons.append("its module list in dev/testing/mutation.py changed")
        if g.run.get("dirty"):
            reasons.append("measured with uncommitted changes")
        commit = g.run["commit"]
        files = changed(commit, [f"{PACKAGE_DIR}/{m}" for m in g.modules])
        if files is None:
            reasons.append(f"this repository does not hold its commit {commit}")
        elif files:
            modules = ", ".join(f.removeprefix(f"{PACKAGE_DIR}/") for f in files)
            reasons.append(f"changed since {commit}: {modules}")
        if reasons:
            stale[group] = "; ".join(reasons)
    return stale


def stale_text(runs: dict[str, GroupRun], stale: dict[str, str]) -> str:
    """What `make mutation STALE=1` prints."""
    lines = [f"{group} (measured at {runs[group].run['commit']}): {why}" for group, why in stale.items()]
    never = [g for g in GROUPS if g not in runs]
    lines += [
        f"{len(stale)} of {len(runs)} measured groups stale: measure one again with make mutation GROUP=<group>.",
        "Never measured: " + (", ".join(never) if never else "none") + ".",
    ]
    return "\n".join(lines) + "\n"


def _recorded(run: dict[str, Any], key: str, form: str) -> str:
    return form.format(run[key]) if run.get(key) is not None else "not recorded"


def _minutes(group: str, runs: dict[str, GroupRun]) -> str:
    """The run's minutes on its cores; a run that measured several groups at once is named with the others."""
    run = runs[group].run
    if run.get("elapsed_s") is None:
        return "not recorded"
    text = (
        f"{run['elapsed_s'] / 60:.1f} on {_recorded(run, 'cores', '{}')} cores, {_recorded(run, 'jobs', '{}')} workers"
    )
    together = [g for g, other in runs.items() if g != group and other.run == run]
    return text + (f" (one run with {', '.join(together)})" if together else "")


def _measured_at(run: dict[str, Any]) -> str:
    return (
        f"`{run['commit']}`{' + uncommitted changes' if run.get('dirty') else ''}, {_recorded(run, 'date', '{}')}, "
        f"mutmut {_recorded(run, 'mutmut', '{}')}, load {_recorded(run, 'load', '{:.1f}')} at the end"
    )


def _figures(r: ModuleResult) -> str:
    return (
        f"{r.total} | {r.killed} | {r.count('survived')} | {r.count('no tests')} | {shown(r.killed, r.total)} | "
        f"{'yes' if meets_bar(r.killed, r.total) else '**no**'}"
    )


def report(runs: dict[str, GroupRun], package: Path = PACKAGE) -> tuple[str, list[str]]:
    """The report of every module of the package (measured or not, and why not), and the groups whose survivors are
    not all explained."""
    explanations = load_explanations()
    measured = [g for g in GROUPS if g in runs]
    modules = package_modules(package)
    group_of = {m: g for g, (mods, _) in GROUPS.items() for m in mods}
    result_of = {m: runs[g].modules[m] for m, g in group_of.items() if g in runs and m in runs[g].modules}
    no_functions = [m for m in modules if m not in group_of and m not in NOT_MUTATED and not has_functions(package / m)]
    no_group = [m for m in modules if m not in group_of and m not in NOT_MUTATED and m not in no_functions]
    waiting = [m for m in modules if m in group_of and m not in result_of]
    to_come = count_mutants(waiting, package)
    under = [m for m in modules if m in result_of and not meets_bar(result_of[m].killed, result_of[m].total)]
    out = [
        "# Mutation score",
        "",
        f"Reach: of the package's {len(modules)} modules, {len(group_of)} are in mutation groups and "
        f"{len(result_of)} of those are measured ({sum(r.total for r in result_of.values())} mutants); "
        f"not measured yet: {len(waiting)}"
        + (f" ({sum(to_come.values())} mutants)" if to_come else "")
        + (f"; **in no group: {len(no_group)}**" if no_group else "")
        + f". Not mutated: {len(NOT_MUTATED)} process entry points; nothing to mutate in {len(no_functions)} modules "
        f"without functions. Under the {THRESHOLD:.0f}% bar: "
        + (", ".join(f"{m} ({shown(result_of[m].killed, result_of[m].total)})" for m in under) or "none")
        + ".",
        "",
        "`make mutation` (dev/testing/mutation.py) mutates each module of a group and runs, per mutant, those of the",
        "group's tests listed in dev/testing/mutation.py that reach the mutated function (the unit tier and in-process",
        "loopback tests: no real control plane, no vLLM). Groups are measured in separate runs; each row says",
        "at which commit and date, and how long its run took. A row describes the code of its commit:",
        "`make mutation STALE=1` lists the rows whose modules changed since. Killed includes timeouts; scores",
        f"are rounded down. The bar is {THRESHOLD:.0f}% per module. For what is not measured yet, the mutants are",
        "those a run would make (mutmut's generator, no test run). Every survivor is listed below with why it is",
        "left (dev/testing/mutation_survivors.toml).",
        "",
        "## Per group",
        "",
        "| group | modules | measured at | minutes | mutants | killed | survived | no tests | score | modules under the bar |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for group, (mods, _) in GROUPS.items():
        if group not in runs:
            mutants = sum(to_come[m] for m in mods if m in to_come) if to_come else ""
            out.append(f"| {group} | {len(mods)} | not measured yet | | {mutants} | | | | | |")
            continue
        g = runs[group]
        weak = [m for m in g.modules if not meets_bar(g.modules[m].killed, g.modules[m].total)]
        out.append(
            f"| {group} | {len(g.modules)} | {_measured_at(g.run)} | {_minutes(group, runs)} | {g.total} | {g.killed} | "
            f"{sum(m.count('survived') for m in g.modules.values())} | "
            f"{sum(m.count('no tests') for m in g.modules.values())} | {shown(g.killed, g.total)} | "
            f"{', '.join(weak) or 'none'} |"
        )
    relisted = [g for g in measured if set(runs[g].modules) != set(GROUPS[g][0])]
    if relisted:
        out += [
            "",
            "Measured with another module list than dev/testing/mutation.py's now (run again): "
            + ", ".join(relisted)
            + ".",
        ]
    out += [
        "",
        "## Per module",
        "",
        "Every module of the package: its group and figures, or why it has none.",
        "",
        "| module | group | measured | mutants | killed | survived | no tests | score | meets the bar |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for module in modules:
        if module in result_of:
            out.append(f"| {module} | {group_of[module]} | yes | {_figures(result_of[module])} |")
        elif module in group_of:
            out.append(f"| {module} | {group_of[module]} | not measured yet | {to_come.get(module, '')} | | | | | |")
        elif module in NOT_MUTATED:
            out.append(f"| {module} | | not mutated: process entry point (below) | | | | | | |")
        elif module in no_functions:
            out.append(f"| {module} | | nothing to mutate: no function | | | | | | |")
        else:
            out.append(f"| {module} | **in no group** | no | | | | | | |")
    out += ["", "Process entry points no group mutates (reached only through a process or the real control plane):", ""]
    out += [f"- {module}: {why}" for module, why in NOT_MUTATED.items()]
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
        out += ["## Explanations no survivor matched (remove them from dev/testing/mutation_survivors.toml)", ""]
        out += [f"- {e['module']} {e['function']}: `{e.get('line') or e.get('mutated')}`" for e in stale] + [""]
    out[2] += (
        f" Survivors: {kinds['equivalent']} equivalent, {kinds['gap']} known gaps, {len(unexplained)} unexplained."
    )
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
        "--stale",
        action="store_true",
        help="list the stored groups whose modules changed since the commit they were measured at; run nothing",
    )
    parser.add_argument(
        "--module",
        action="append",
        help="mutate only these modules of the chosen groups (repeatable): a partial measure, so --results and "
        "--report must name files other than the committed ones",
    )
    parser.add_argument("--work", type=Path, default=WORK, help="the scratch tree (one per concurrent run)")
    args = parser.parse_args(argv)
    runs = load_results(args.results)
    if args.stale:
        print(stale_text(runs, stale_rows(runs)), end="")
        return 0
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
        runs = load_results(args.results)  # read again: a concurrent run (another --work) may have saved since
        for group in groups:
            runs[group] = GroupRun(group, state, {m: results[m] for m in GROUPS[group][0] if m in results})
        save_results(runs, args.results)
    text, unexplained = report(runs)
    args.report.write_text(text)
    for group in groups:
        if group in runs:
            counts = sum((r.counts for r in runs[group].modules.values()), Counter())
            print(f"mutation {group}: {shown(runs[group].killed, runs[group].total)} {dict(counts)}")
    for problem in coverage_problems():
        print(f"coverage: {problem}")
    print(f"results in {args.results}, report in {args.report}")
    failing = [
        g
        for g in groups
        if g in runs and (g in unexplained or not all(meets_bar(r.killed, r.total) for r in runs[g].modules.values()))
    ]
    if failing:
        print(f"a module under {THRESHOLD:.0f}% or unexplained survivors in: {', '.join(failing)}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
