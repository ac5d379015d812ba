"""tests/support/fault_checks.py on hand-made rows: a fault row passes only when it shows what it is
about (a partial apply when the operator was killed, a heartbeat of the restarted kubelet, the kubelet's
pull retries waited for), and a run's faults.json is built once for the tests and the benchmark."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from bench.faults import FACTS
from tests.support.fault_checks import check
from tests.support.fault_table import FaultRecord, Row, record_document

APPLIED = ["ConfigMap/tiny-vl-second-transfer", "Service/tiny-vl-second"]
HELD = ["Deployment/tiny-vl-second-decode", "Deployment/tiny-vl-second-encoder", "Deployment/tiny-vl-second-router"]


def record(name: str, **facts: Any) -> FaultRecord:
    row = Row(name, "fault", "expectation", start=1.0, recovered=2.0, end=3.0, sent=10, facts=facts)
    return FaultRecord([row], load={"clients": 2})


def killed(**changes: Any) -> FaultRecord:
    facts = {
        "applied_at_kill": APPLIED,
        "missing_at_kill": HELD,
        "leader_at_release": "epd-operator-abc_1234",
        "missing_at_release": HELD,
        "missing": [],
        "unexpected": [],
        "pods_per_tier": {"encoder": 1, "decode": 1, "router": 1},
    }
    return record("operator_killed_mid_apply", **{**facts, **changes})


def test_the_operator_killed_row_needs_a_partial_apply_at_the_kill_and_until_the_restarted_one_leads():
    check(killed(), "operator_killed_mid_apply")
    weak: dict[str, Any]
    for weak in (
        {"applied_at_kill": []},  # killed before it began
        {"missing_at_kill": []},  # killed after it had finished: a plain restart
        {"missing_at_release": []},  # the killed one completed it after all
        {"missing": ["Deployment/tiny-vl-second-decode"]},  # the restarted one did not complete it
    ):
        with pytest.raises(AssertionError):
            check(killed(**weak), "operator_killed_mid_apply")


def test_the_kubelet_row_needs_a_heartbeat_of_the_restarted_kubelet():
    facts = {"pods_replaced": [], "container_restarts": 0}
    check(record("kubelet_restarted", **facts, heartbeat_after_restart_s=4.2), "kubelet_restarted")
    with pytest.raises(KeyError):
        check(record("kubelet_restarted", **facts), "kubelet_restarted")


def test_the_missing_image_row_needs_the_kubelets_retries_waited_for():
    facts = {
        "status": "ErrImagePull: not found",
        "warning_events": 1,
        "ready_encoders_while_failing": 2,
        "consumer_generations_while_failing": ["g1"],
        "generation_before": "g1",
        "no_encoder_in_generation": 0,
    }
    check(record("missing_image", **facts, pulls_after_warning=2), "missing_image")
    with pytest.raises(AssertionError):
        check(record("missing_image", **facts, pulls_after_warning=1), "missing_image")


def test_faults_json_is_one_document_for_the_tests_and_the_benchmark():
    since = time.monotonic()
    raw = record_document(killed(), datetime(2026, 1, 1, tzinfo=UTC), since, commit="abc123")
    assert set(raw) == {"started", "commit", "wall", "load_average", "record"}
    assert raw["started"] == "2026-01-01T00:00:00+00:00" and raw["commit"] == "abc123" and raw["wall"] >= 0
    [row] = raw["record"]["rows"]
    assert FACTS[row["name"]](row["facts"]).startswith("killed with 2 objects applied and 3 not; missing none")
