"""``make test``'s test run, once its caches are built: two pytest runs side by side.

- **the tiers** (every tier but the node's) on the terminal, the e2e tier last;
- **the node tier's quick part** (``-m "node and not long"``) beside them, its output in ``build/test-node.log``,
  printed whole when it ends. Its mission loop, which starts vLLM pods, comes first, while the other tiers
  (unit, loopback, helm, integration: about one core busy) run; the e2e tier's vLLM servers start later.

Why: apart from the e2e tier's vLLM starts, neither run keeps both cores busy on its own (the tiers wait on
servers and control planes, the node tier on its pods), so side by side they take less than one after the other,
and the e2e tier's vLLM starts least beside the node tier's when they come last. The node run is at nice 10, so its
control plane yields to the tiers' processes, whose timeouts are the tighter ones; the node itself (kubelet,
containerd, kube-proxy, the pods) runs in the node's cgroup, which the kernel weighs against the tiers'
processes as one process of nice 0. Running the e2e tier only once the node tier has finished, so that vLLM
never starts in both at once, only adds the e2e tier's minutes: the node tier went no faster
(docs/development.md#tests).

The tests marked ``late_build`` need a binary nothing else needs and whose cold build would take a cold run
past its time budget (the oldest supported kube-apiserver for tests/integration/test_crd_install.py,
prometheus-adapter for tests/integration/test_autoscaling_adapter.py, the LeaderWorkerSet controller for
tests/integration/test_lws_controller.py, KEDA's operator and metrics server for
tests/integration/test_keda_controller.py): they run when ``make k8s`` has built those binaries, and otherwise
``make test`` leaves them out of both runs and names them and the command that builds them.

Each run writes a JUnit report (``build/test-tiers.xml``, ``build/test-node.xml``); at the end the skip
counts of every tier are printed. With ``CI=true``, a tier that should run on this machine and skipped
entirely fails the run: a CI machine that lost a tool (root, containerd, a cache) must not print "passed"
over a tier that never ran. Every tier but the node's should run wherever ``make test`` does (it builds
what they need first); the node tier where a real node can start (``dev/node/real_node.py``'s ``unavailable``).

Exit status: 0 when both runs passed (and, in CI, no tier skipped whole), else the first failing run's
pytest status, or 1 for a tier skipped whole.

    python -m dev.testing.test_streams        # what `make test` runs after `make lint`
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import NoReturn

from dev.builds import k8s_binaries
from dev.builds.k8s_binaries import OLDEST
from dev.lifetimes import GroupReaper
from dev.node import real_node
from dev.parts import keda, lws, prometheus_adapter
from dev.paths import REPO

BUILD = REPO / "build"
NODE_LOG = BUILD / "test-node.log"
TIERS_REPORT = BUILD / "test-tiers.xml"
NODE_REPORT = BUILD / "test-node.xml"
PYTEST = [sys.executable, "-m", "pytest"]
# The two pytest runs, by marker: together they select every test but the node tier's long experiments,
# each once; without the late binaries, the tiers' run leaves out the late_build tests
# (tests/unit/dev/test_test_streams.py).
NODE = "node and not long"
NODE_WITHOUT_LATE = "node and not long and not late_build"
TIERS = "not node"
TIERS_WITHOUT_LATE = "not node and not late_build"
# The tiers' folders in the order their run takes them: the e2e tier, which starts vLLM servers on both
# cores, last; the others keep about one core busy while the node tier starts its cluster and the mission
# loop's vLLM pods (tests/unit/dev/test_test_streams.py checks that every tier but the node's is here).
TIER_FOLDERS = ("tests/unit", "tests/loopback", "tests/helm", "tests/integration", "tests/e2e")


def missing_late_binaries() -> list[str]:
    """The late binaries not in the cache, by name."""
    missing = []
    if not k8s_binaries.built(OLDEST, ("kube-apiserver",)):
        missing.append(f"kube-apiserver {OLDEST}")
    if not prometheus_adapter.ADAPTER.built():
        missing.append(f"prometheus-adapter {prometheus_adapter.ADAPTER.version}")
    if not lws.MANAGER.built():
        missing.append(f"the LeaderWorkerSet controller {lws.MANAGER.version}")
    if not keda.Keda().built():
        missing.append(f"KEDA {keda.VERSION}")
    return missing


@dataclasses.dataclass
class Counts:
    """One tier's tests in a run: how many, how many skipped, how many failed (errors included)."""

    tests: int = 0
    skipped: int = 0
    failed: int = 0


def tier_counts(report: Path) -> dict[str, Counts]:
    """Per tier (``tests/<tier>``), from a pytest JUnit report; empty when there is none."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return {}
    counts: dict[str, Counts] = {}
    for case in root.iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        if len(parts) < 2 or parts[0] != "tests":
            continue
        tier = counts.setdefault(parts[1], Counts())
        tier.tests += 1
        if case.find("skipped") is not None:
            tier.skipped += 1
        elif case.find("failure") is not None or case.find("error") is not None:
            tier.failed += 1
    return counts


def skip_verdict(
    counts: Mapping[str, Counts], should_run: Mapping[str, str | None], ci: bool
) -> tuple[list[str], bool]:
    """Lines naming each tier's skips, and whether the run may pass: in CI, not when a tier that should
    run here (``should_run[tier]`` None; else why it cannot) skipped every test or reported none."""
    lines, ok = [], True
    for tier, why_not in should_run.items():
        c = counts.get(tier, Counts())
        line = f"{tier}: {c.tests - c.skipped} ran, {c.skipped} skipped of {c.tests}"
        if why_not is not None:
            line += f" (cannot run here: {why_not})"
        elif c.tests == 0 or c.skipped == c.tests:
            line += " -- it should run on this machine but " + ("reported no test" if c.tests == 0 else "skipped whole")
            if ci:
                line += " (CI=true: fails the run)"
                ok = False
        lines.append(line)
    return lines, ok


def say(msg: str) -> None:
    print(f"[make test] {msg}", flush=True)


def main() -> int:
    BUILD.mkdir(exist_ok=True)
    for stale in (NODE_LOG, TIERS_REPORT, NODE_REPORT):
        stale.unlink(missing_ok=True)
    missing = missing_late_binaries()
    if missing:
        say(
            f"not built: {', '.join(missing)}; the tests marked late_build (-m late_build) do not run: "
            "`make k8s` builds them (long Go builds), then `make test` runs them"
        )
    say(f"the node tier's quick part runs beside the other tiers; its output: {NODE_LOG}")
    reaper = GroupReaper()  # however this process ends, the node run ends with it
    with NODE_LOG.open("wb") as log:
        # Its own session: signalled as a group by this process, not by the terminal. No cache provider:
        # the tiers' run owns .pytest_cache.
        node = subprocess.Popen(
            [
                "nice",
                "-n",
                "10",
                *PYTEST,
                "-m",
                NODE_WITHOUT_LATE if missing else NODE,
                "-p",
                "no:cacheprovider",
                f"--junitxml={NODE_REPORT}",
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    reaper.watch(node.pid)

    def stop_node(signum: int, _frame: FrameType | None) -> NoReturn:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGTERM)  # its fixtures' reapers stop the cluster it started
            node.wait()
        reaper.forget(node.pid)
        reaper.close()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop_node)
    try:
        tiers_run = [
            *PYTEST,
            "-m",
            TIERS_WITHOUT_LATE if missing else TIERS,
            f"--junitxml={TIERS_REPORT}",
            *TIER_FOLDERS,
        ]
        tiers = subprocess.run(tiers_run, cwd=REPO).returncode
        if node.poll() is None:
            say(f"the other tiers are done; waiting for the node tier ({NODE_LOG})")
        node_status = node.wait()
        reaper.forget(node.pid)
        reaper.close()
    except KeyboardInterrupt:
        stop_node(signal.SIGINT, None)
    say("the node tier's quick part:")
    sys.stdout.write(NODE_LOG.read_text(errors="replace"))
    counts = {**tier_counts(TIERS_REPORT), **tier_counts(NODE_REPORT)}
    should_run: dict[str, str | None] = {folder.removeprefix("tests/"): None for folder in TIER_FOLDERS}
    should_run["node"] = real_node.unavailable()
    lines, skips_ok = skip_verdict(counts, should_run, os.environ.get("CI", "").lower() == "true")
    say("tests per tier: " + "; ".join(lines))
    runs = (("the tiers", tiers), ("the node tier", node_status))
    failed = {run: status for run, status in runs if status != 0}
    if failed:
        say("failed: " + ", ".join(f"{run} (exit {status})" for run, status in failed.items()))
        return next(iter(failed.values()))
    if not skips_ok:
        say("failed: a tier that should run on this machine skipped whole (see above)")
        return 1
    late = f"; not run: -m late_build ({', '.join(missing)})" if missing else ""
    say(f"passed: the tiers and the node tier's quick part{late}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
