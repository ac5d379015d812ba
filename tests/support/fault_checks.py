"""What each fault row of the table (tests/support/fault_table.py) must show, in its figures and facts:
the expectation a row states in words, as assertions. Used by tests/node/test_faults.py (the whole
table and the metric-source rows) and tests/node/test_mission_loop.py (the rows that restart no vLLM pod)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from tests.support.fault_table import FaultRecord, Row


def _show(row: Row) -> str:
    return json.dumps(dataclasses.asdict(row), indent=1)


def _no_failure(record: FaultRecord, row: Row) -> None:
    assert row.sent > 0 and row.failures == 0, _show(row)


def _encoder_pod_deleted(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)


def _all_encoders_deleted(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)
    assert row.facts["fallback_requests"] > 0, "requests went to the consumer raw while no encoder was up"


def _only_requests_in_flight_fail(record: FaultRecord, row: Row) -> None:
    assert row.sent > 0, _show(row)
    assert row.failures == row.failed_started_before, f"a request that started after the fault failed: {_show(row)}"
    assert row.failures <= record.load["clients"], _show(row)


def _rolling_image_change(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)
    assert row.facts["generations_seen"] >= 2, "the change made a new generation"


def _missing_image(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)
    assert "ImagePull" in row.facts["status"] and row.facts["warning_events"] == 1, _show(row)
    assert row.facts["pulls_after_warning"] >= 2, f"the kubelet's retries were not waited for: {_show(row)}"
    assert row.facts["ready_encoders_while_failing"] == 2, _show(row)
    # Encoders first: the consumers stay on their generation, with their encoders, while the new one fails.
    assert row.facts["consumer_generations_while_failing"] == [row.facts["generation_before"]], _show(row)
    assert row.facts["no_encoder_in_generation"] == 0, _show(row)


def _operator_killed_mid_apply(record: FaultRecord, row: Row) -> None:
    # Killed mid-apply: some objects applied, the Deployments not; still so when the restarted one led.
    assert row.facts["applied_at_kill"] and row.facts["missing_at_kill"], f"no partial apply at the kill: {_show(row)}"
    assert any(o.startswith("Deployment/") for o in row.facts["missing_at_release"]), _show(row)
    assert row.facts["leader_at_release"], _show(row)
    # The restarted operator completed it.
    assert row.facts["missing"] == [] and row.facts["unexpected"] == [], _show(row)
    assert row.facts["pods_per_tier"] == {"encoder": 1, "decode": 1, "router": 1}, _show(row)
    assert row.failures == 0, f"the serving deployment lost requests: {_show(row)}"


def _control_plane_restarted(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)
    writes = row.facts["operator_writes"]
    assert sum(writes.values()) <= 4, f"the operator rewrote what it had applied: {writes}"
    assert row.facts["container_restarts"] == 0, _show(row)
    # A Lease it could not renew meanwhile makes it stand by, not exit: its container never restarts.
    assert row.facts["operator_restarted"] is False, _show(row)


def _kubelet_restarted(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)
    assert row.facts["heartbeat_after_restart_s"] > 0, f"no heartbeat of the restarted kubelet: {_show(row)}"
    assert row.facts["pods_replaced"] == [] and row.facts["container_restarts"] == 0, _show(row)


# What the EPDDeployment's status must name when each metric source is away (controller/status_hpa.py's words
# for the answer the HPA quotes).
MISSING_WORDS = {
    "prometheus_lost": "the adapter answers but cannot query its source (Prometheus",
    "adapter_lost": "its APIService's server, the adapter, does not answer",
}


def _metric_source_lost(record: FaultRecord, row: Row) -> None:
    _no_failure(record, row)
    # Named: the HPA's own reason, what is missing, that the tier is held; one Warning per distinct message.
    assert row.facts["reason"] == "FailedGetObjectMetric", _show(row)
    assert MISSING_WORDS[row.name] in row.facts["status"], _show(row)
    assert "the HPA holds the tier at" in row.facts["status"], _show(row)
    warnings = row.facts["warning_events"]
    assert warnings and len(warnings) == len(set(warnings)), f"no Warning, or one repeated: {_show(row)}"
    assert row.facts["status"] in warnings, _show(row)
    # Neither flaps nor drops: the encoder tier keeps the replicas it had, every pod Ready, throughout.
    assert row.facts["replicas_before"] >= 1, _show(row)
    assert row.facts["replicas_seen"] == [row.facts["replicas_before"]], _show(row)
    assert row.facts["ready_min"] == row.facts["replicas_before"], _show(row)
    # Back on its own: active again (and said so) once the source serves again, the source away a minute.
    assert row.facts["outage_s"] >= 55 and row.recovered is not None, _show(row)
    assert row.facts["normal_events"] >= 1, _show(row)


CHECKS: dict[str, Callable[[FaultRecord, Row], None]] = {
    "encoder_pod_deleted": _encoder_pod_deleted,
    "all_encoders_deleted": _all_encoders_deleted,
    "decode_pod_deleted": _only_requests_in_flight_fail,
    "router_pod_deleted": _only_requests_in_flight_fail,
    "rolling_image_change": _rolling_image_change,
    "missing_image": _missing_image,
    "operator_killed_mid_apply": _operator_killed_mid_apply,
    "control_plane_restarted": _control_plane_restarted,
    "kubelet_restarted": _kubelet_restarted,
    "prometheus_lost": _metric_source_lost,
    "adapter_lost": _metric_source_lost,
}


def check(record: FaultRecord, name: str) -> None:
    """The row completed and shows what its expectation says."""
    row = record.row(name)
    assert "error" not in row.facts, _show(row)
    CHECKS[name](record, row)
