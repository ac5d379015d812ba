"""`make test`'s two pytest runs (dev/testing/test_streams.py): what they select, and when the late_build tests run."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from dev import paths
from dev.builds.k8s_binaries import OLDEST
from dev.parts import keda, lws, prometheus_adapter
from dev.testing import test_streams
from tests.conftest import TIERS


def selects(expr: str, marks: set[str]) -> bool:
    def has(name: str, /, **_kwargs: str | int | bool | None) -> bool:
        return name in marks

    return Expression.compile(expr).evaluate(has)


@pytest.mark.parametrize("tier, late, long", list(itertools.product(TIERS, (False, True), (False, True))))
def test_every_test_runs_once_but_the_node_tiers_long_experiments(tier: str, late: bool, long: bool):
    marks = {tier} | ({"late_build"} if late else set()) | ({"long"} if long else set())
    for node, tiers in (
        (test_streams.NODE, test_streams.TIERS),
        (test_streams.NODE_WITHOUT_LATE, test_streams.TIERS_WITHOUT_LATE),
    ):
        runs = [selects(node, marks), selects(tiers, marks)]
        without_late = tiers == test_streams.TIERS_WITHOUT_LATE
        if tier == "node":
            assert runs == [not long and not (late and without_late), False]
        elif late and without_late:
            assert runs == [False, False]
        else:
            assert runs == [False, True]


def test_the_late_binaries_are_looked_for_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(paths, "CACHE", tmp_path)
    adapter, manager = prometheus_adapter.ADAPTER, lws.MANAGER
    assert test_streams.missing_late_binaries() == [
        f"kube-apiserver {OLDEST}",
        f"prometheus-adapter {adapter.version}",
        f"the LeaderWorkerSet controller {manager.version}",
        f"KEDA {keda.VERSION}",
    ]

    apiserver = tmp_path / "k8s" / OLDEST / "kube-apiserver"
    keda_binaries = [b.path for b in keda.BINARIES]
    assert len(keda_binaries) == 3  # its operator, metrics server and webhooks: any missing keeps its test out
    assert all(b.path.is_relative_to(tmp_path) for b in (adapter, manager, *keda.BINARIES))
    for binary in (apiserver, adapter.path, manager.path, keda_binaries[0]):
        binary.parent.mkdir(parents=True, exist_ok=True)
        binary.write_text("")
        binary.chmod(0o755)
    assert test_streams.missing_late_binaries() == [f"KEDA {keda.VERSION}"]
    for binary in keda_binaries[1:]:
        binary.write_text("")
        binary.chmod(0o755)
    assert test_streams.missing_late_binaries() == []


def test_the_tiers_run_names_every_tier_folder_but_the_nodes_once():
    assert sorted(test_streams.TIER_FOLDERS) == sorted(f"tests/{t}" for t in TIERS if t != "node")
    assert test_streams.TIER_FOLDERS[-1] == "tests/e2e"


REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.unit.test_cli" name="test_a"/>
<testcase classname="tests.unit.dev.test_plan" name="test_b"><skipped message="no"/></testcase>
<testcase classname="tests.node.test_real_node" name="test_c"><skipped message="a real node needs root"/></testcase>
<testcase classname="tests.node.test_faults" name="test_d"><skipped message="a real node needs root"/></testcase>
<testcase classname="tests.loopback.router.test_main" name="test_e"><failure message="boom"/></testcase>
</testsuite></testsuites>
"""


def test_the_junit_report_is_counted_per_tier(tmp_path: Path):
    report = tmp_path / "report.xml"
    report.write_text(REPORT)
    assert test_streams.tier_counts(report) == {
        "unit": test_streams.Counts(tests=2, skipped=1),
        "node": test_streams.Counts(tests=2, skipped=2),
        "loopback": test_streams.Counts(tests=1, failed=1),
    }
    assert test_streams.tier_counts(tmp_path / "none.xml") == {}


def test_in_ci_a_tier_that_should_run_here_and_skipped_whole_fails_the_run():
    counts = {"unit": test_streams.Counts(tests=2, skipped=1), "node": test_streams.Counts(tests=2, skipped=2)}
    should_run: dict[str, str | None] = {"unit": None, "node": None}
    lines, ok = test_streams.skip_verdict(counts, should_run, ci=True)
    assert not ok
    assert lines == [
        "unit: 1 ran, 1 skipped of 2",
        "node: 0 ran, 2 skipped of 2 -- it should run on this machine but skipped whole (CI=true: fails the run)",
    ]
    # Outside CI the same run passes, the skips printed.
    lines, ok = test_streams.skip_verdict(counts, should_run, ci=False)
    assert ok and lines[1].endswith("skipped whole")
    # Where the node tier cannot run (no root, no containerd, a cgroup layout it refuses), its skips are expected.
    lines, ok = test_streams.skip_verdict(counts, {"unit": None, "node": "a real node needs root"}, ci=True)
    assert ok and lines[1] == "node: 0 ran, 2 skipped of 2 (cannot run here: a real node needs root)"
    # A tier that reported nothing at all (its folder left out, a collection error) did not run either.
    lines, ok = test_streams.skip_verdict({}, {"helm": None}, ci=True)
    assert not ok and "reported no test" in lines[0]
