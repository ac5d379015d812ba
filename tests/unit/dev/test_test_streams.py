"""`make test`'s two pytest runs (dev/test_streams.py): what they select, and when the late_build tests run."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from dev import paths, prometheus_adapter, test_streams
from dev.k8s_binaries import OLDEST
from tests.conftest import TIERS


def selects(expr: str, marks: set[str]) -> bool:
    def has(name: str, /, **_kwargs: str | int | bool | None) -> bool:
        return name in marks

    return Expression.compile(expr).evaluate(has)


@pytest.mark.parametrize("tier, late, long", list(itertools.product(TIERS, (False, True), (False, True))))
def test_every_test_runs_once_but_the_node_tiers_long_experiments(tier: str, late: bool, long: bool):
    marks = {tier} | ({"late_build"} if late else set()) | ({"long"} if long else set())
    for tiers in (test_streams.TIERS, test_streams.TIERS_WITHOUT_LATE):
        runs = [selects(test_streams.NODE, marks), selects(tiers, marks)]
        if tier == "node":
            assert runs == [not long, False]  # a node test needing a late binary builds it on first use
        elif late and tiers == test_streams.TIERS_WITHOUT_LATE:
            assert runs == [False, False]
        else:
            assert runs == [False, True]


def test_the_late_binaries_are_looked_for_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(paths, "CACHE", tmp_path)
    adapter = prometheus_adapter.ADAPTER
    assert test_streams.missing_late_binaries() == [f"kube-apiserver {OLDEST}", f"prometheus-adapter {adapter.version}"]

    apiserver = tmp_path / "k8s" / OLDEST / "kube-apiserver"
    assert adapter.path.is_relative_to(tmp_path)
    for binary in (apiserver, adapter.path):
        binary.parent.mkdir(parents=True)
        binary.write_text("")
        binary.chmod(0o755)
    assert test_streams.missing_late_binaries() == []


def test_the_tiers_run_names_every_tier_folder_but_the_nodes_once():
    assert sorted(test_streams.TIER_FOLDERS) == sorted(f"tests/{t}" for t in TIERS if t != "node")
    assert test_streams.TIER_FOLDERS[-1] == "tests/e2e"
