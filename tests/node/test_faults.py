"""The fault table on real pods (tests/support/fault_table.py): each fault under steady load through
the router Service, and what it cost the clients.

examples/epd-local-cpu.yaml (vLLM 0.32 for CPU, the router from the operator image) on the local
cluster's real node; chat clients with never-seen images call the router Service's ClusterIP, one new
connection per request. The faults come one after another, each after the previous one has
recovered, and every row's expectation is checked. The rows that restart no vLLM pod run on one
encoder, one prefill+decode pod and two routers (minutes); the whole table, on two pods in every tier,
is marked `long` (tens of minutes), and `make bench-faults` writes its figures to
bench/results/faults.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.fault_table import (
    EVERY_TIER_TWICE,
    QUICK_REPLICAS,
    QUICK_ROWS,
    ROWS,
    SECOND,
    FaultRecord,
    Row,
    run_table,
)
from tests.support.mission import Mission, remove
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.timeout(3600),  # the whole table restarts vLLM pods one after another on two shared cores
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


def _run(m: Mission, tmp: Path, rows: tuple[str, ...], replicas: dict[str, int]) -> Iterator[FaultRecord]:
    m = dataclasses.replace(m, name="tiny-vl")
    started, t = datetime.now(UTC), time.monotonic()
    try:
        record = run_table(m, tmp, say=lambda line: print(line, file=sys.stderr), rows=rows, replicas=replicas)
        raw = {
            "started": started.isoformat(),
            "wall": time.monotonic() - t,
            "load_average": list(os.getloadavg()),
            "record": record.to_json(),
        }
        (tmp / "faults.json").write_text(json.dumps(raw, indent=1))
        print(f"fault record (python -m bench.faults --from-record): {tmp / 'faults.json'}", file=sys.stderr)
        yield record
    finally:
        remove(m, m.name, SECOND)


@pytest.fixture(scope="module")
def quick(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRecord]:
    yield from _run(shared_mission, tmp_path_factory.mktemp("faults-quick"), QUICK_ROWS, QUICK_REPLICAS)


@pytest.fixture(scope="module")
def table(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRecord]:
    yield from _run(shared_mission, tmp_path_factory.mktemp("faults"), ROWS, EVERY_TIER_TWICE)


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
    assert row.facts["ready_encoders_while_failing"] == 2, _show(row)
    # Encoders first: the consumers stay on their generation, with their encoders, while the new one fails.
    assert row.facts["consumer_generations_while_failing"] == [row.facts["generation_before"]], _show(row)
    assert row.facts["no_encoder_in_generation"] == 0, _show(row)


def _operator_killed_mid_apply(record: FaultRecord, row: Row) -> None:
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
    assert row.facts["pods_replaced"] == [] and row.facts["container_restarts"] == 0, _show(row)


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
}


@pytest.mark.parametrize("name", QUICK_ROWS)
def test_a_fault_that_restarts_no_vllm_pod_costs_what_its_row_allows(quick: FaultRecord, name: str):
    row = quick.row(name)
    assert "error" not in row.facts, _show(row)
    CHECKS[name](quick, row)


@pytest.mark.long
@pytest.mark.parametrize("name", ROWS)
def test_every_fault_costs_what_its_row_allows(table: FaultRecord, name: str):
    row = table.row(name)
    assert "error" not in row.facts, _show(row)
    CHECKS[name](table, row)
