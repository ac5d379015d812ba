"""tests/support/fault_checks.py on hand-made rows: a fault row passes only when it shows what it is
about (a partial apply when the operator was killed, a heartbeat of the restarted kubelet, the kubelet's
pull retries waited for), and a run's faults.json is built once for the tests and the benchmark."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from bench.faults import FACTS
from tests.support.fault_checks import MISSING_WORDS, check
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


def lost(name: str, **changes: Any) -> FaultRecord:
    """A metric-source row as the table records it: the HPA's reason, the status naming what is missing,
    one Warning and one Normal Event, the encoder tier at 2 throughout."""
    status = (
        "encoder autoscaling inactive: the HPA cannot read epd_router_encoder_demand from the custom metrics API: "
        f"{MISSING_WORDS[name]}; the HPA holds the tier at 2 replicas until it reads its metrics again; "
        "FailedGetObjectMetric, in the HPA's words in status.tiers.encoder.autoscaling.conditions"
    )
    facts = {
        "reason": "FailedGetObjectMetric",
        "status": status,
        "warning_events": [status],
        "normal_events": 1,
        "replicas_before": 2,
        "replicas_seen": [2],
        "ready_min": 2,
        "outage_s": 60.2,
        "inactive_after_s": 2.1,
        "active_again_after_s": 3.0,
        "serving_again_after_s": 1.0,
        "spilled_items": 0.0,
        "raw_requests": 0.0,
    }
    return record(name, **{**facts, **changes})


@pytest.mark.parametrize("name", ["prometheus_lost", "adapter_lost"])
def test_a_metric_source_row_needs_the_cause_named_the_tier_held_and_autoscaling_back(name: str):
    check(lost(name), name)
    other = next(n for n in MISSING_WORDS if n != name)
    weak: dict[str, Any]
    for weak in (
        {"replicas_seen": [1, 2]},  # the tier dropped meanwhile
        {"replicas_seen": [2, 3]},  # ... or flapped up
        {"ready_min": 1},  # a pod stopped serving
        {"status": lost(other).rows[0].facts["status"], "warning_events": [lost(other).rows[0].facts["status"]]},
        {"warning_events": []},  # no Event
        {"warning_events": [lost(name).rows[0].facts["status"]] * 2},  # the same words twice
        {"normal_events": 0},  # never said it was back
        {"outage_s": 20.0},  # not a minute away
    ):
        with pytest.raises(AssertionError):
            check(lost(name, **weak), name)
    failed = lost(name)
    failed.rows[0].failed = {"HTTP 503": 1}
    with pytest.raises(AssertionError):
        check(failed, name)
    words = FACTS[name](lost(name).rows[0].facts)
    assert words.startswith("status: `encoder autoscaling inactive") and "1 Warning Event" in words


def test_autoscaling_events_count_every_event_of_the_same_words():
    """The operator posts each Event as an object of its own: two with the same words are two posts."""
    from types import SimpleNamespace

    from tests.support.fault_table import FaultTable

    said = "every autoscaler computes its replica count from its metrics"
    events = [
        {"type": "Normal", "reason": "AutoscalingActive", "message": said, "count": 1},
        {"type": "Normal", "reason": "AutoscalingActive", "message": said, "count": 1},
        {"type": "Warning", "reason": "AutoscalingInactive", "message": "lost", "series": {"count": 3}},
        {"type": "Normal", "reason": "Ready", "message": "ready", "count": 1},
    ]
    kube = SimpleNamespace(events=lambda kind, name: events)
    table = FaultTable(SimpleNamespace(kube=kube, cluster=None, name="vl"), None, print, {})  # type: ignore[arg-type]
    assert table.autoscaling_events() == {
        ("Normal", "AutoscalingActive", said): 2,
        ("Warning", "AutoscalingInactive", "lost"): 3,
    }
