"""The fault table on real pods (tests/support/fault_table.py): each fault under steady load through
the router Service, and what it cost the clients.

Two pods in every tier of examples/epd-local-cpu.yaml (vLLM 0.32 for CPU, the router from the
operator image) on the local cluster's real node; chat clients with never-seen images call the
router Service's ClusterIP, one new connection per request. The faults come one after another, each
after the previous one has recovered; every test below checks one row's expectation. `make
bench-faults` runs the same table and writes its figures to bench/results/faults.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.support.fault_table import SECOND, FaultRecord, Row, run_table
from tests.support.mission import Mission, remove
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.long,  # make test-node, not make test
    pytest.mark.timeout(3600),  # two pods per tier start, and several faults restart vLLM pods on two shared cores
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@pytest.fixture(scope="module")
def table(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRecord]:
    tmp = tmp_path_factory.mktemp("faults")
    m = dataclasses.replace(shared_mission, name="tiny-vl")
    started, t = datetime.now(UTC), time.monotonic()
    try:
        record = run_table(m, tmp, say=lambda line: print(line, file=sys.stderr))
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


def _show(row: Row) -> str:
    return json.dumps(dataclasses.asdict(row), indent=1)


def test_one_of_two_encoder_pods_deleted_fails_no_request(table: FaultRecord):
    row = table.row("encoder_pod_deleted")
    assert row.sent > 0 and row.failures == 0, _show(row)


def test_every_encoder_pod_deleted_fails_no_request_and_the_consumer_encodes(table: FaultRecord):
    row = table.row("all_encoders_deleted")
    assert row.sent > 0 and row.failures == 0, _show(row)
    assert row.facts["fallback_requests"] > 0, "requests went to the consumer raw while no encoder was up"
    assert row.recover_s is not None


def test_one_of_two_decode_pods_deleted_fails_only_requests_already_on_it(table: FaultRecord):
    row = table.row("decode_pod_deleted")
    assert row.sent > 0, _show(row)
    assert row.failures == row.failed_started_before, f"a request that started after the fault failed: {_show(row)}"
    assert row.failures <= table.load["clients"], _show(row)


def test_one_of_two_router_pods_deleted_fails_at_most_its_requests_in_flight(table: FaultRecord):
    row = table.row("router_pod_deleted")
    assert row.sent > 0, _show(row)
    assert row.failures == row.failed_started_before, f"a new connection failed: {_show(row)}"
    assert row.failures <= table.load["clients"], _show(row)


def test_a_rolling_image_change_of_every_tier_fails_no_request(table: FaultRecord):
    row = table.row("rolling_image_change")
    assert row.sent > 0 and row.failures == 0, _show(row)
    assert row.facts["generations_seen"] >= 2, "the change made a new generation"


def test_an_image_missing_on_the_node_is_named_and_the_running_encoders_serve(table: FaultRecord):
    row = table.row("missing_image")
    assert row.sent > 0 and row.failures == 0, _show(row)
    assert "ImagePull" in row.facts["status"] and row.facts["warning_events"] == 1, _show(row)
    assert row.facts["ready_encoders_while_failing"] == 2, _show(row)


def test_the_operator_killed_mid_apply_converges_after_its_restart(table: FaultRecord):
    row = table.row("operator_killed_mid_apply")
    assert row.facts["missing"] == [] and row.facts["unexpected"] == [], _show(row)
    assert row.facts["pods_per_tier"] == {"encoder": 1, "decode": 1, "router": 1}, _show(row)
    assert row.failures == 0, f"the serving deployment lost requests: {_show(row)}"


def test_a_control_plane_restart_loses_no_request_and_causes_no_write_storm(table: FaultRecord):
    row = table.row("control_plane_restarted")
    assert row.sent > 0 and row.failures == 0, _show(row)
    writes = row.facts["operator_writes"]
    assert sum(writes.values()) <= 4, f"the operator rewrote what it had applied: {writes}"
    assert row.facts["container_restarts"] == 0, _show(row)


def test_a_kubelet_restart_leaves_the_pods_serving(table: FaultRecord):
    row = table.row("kubelet_restarted")
    assert row.sent > 0 and row.failures == 0, _show(row)
    assert row.facts["pods_replaced"] == [] and row.facts["container_restarts"] == 0, _show(row)
