"""The fault table on real pods (tests/support/fault_table.py): each fault under steady load through
the router Service, and what it cost the clients.

examples/epd-local-cpu.yaml (vLLM 0.32 for CPU, the router from the operator image) with two pods in
every tier on the local cluster's real node; chat clients with never-seen images call the router
Service's ClusterIP, one new connection per request. The faults come one after another, each after
the previous one has recovered, and every row's expectation (tests/support/fault_checks.py) is
checked. Then the metric-source rows (Prometheus, then prometheus-adapter, stopped for a minute under load)
on a deployment of their own, the encoder tier autoscaled by its HPA. Tens of minutes: marked `long`;
`make bench-faults` writes its figures to bench/results/faults.md. The rows that restart no vLLM pod
also run in the mission loop (tests/node/test_mission_loop.py), on its deployment, in `make test`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

import pytest

from tests.support.fault_checks import check
from tests.support.fault_table import (
    EVERY_TIER_TWICE,
    METRIC_AUTOSCALING,
    METRIC_CLIENTS,
    METRIC_REPLICAS,
    METRIC_ROWS,
    ROWS,
    SECOND,
    FaultRecord,
    run_recorded,
)
from tests.support.mission import Mission, remove
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.long,  # tens of minutes: `-m "not long"` leaves it out
    pytest.mark.timeout(3600),  # the whole table restarts vLLM pods one after another on two shared cores
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@pytest.fixture(scope="module")
def table(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRecord]:
    m = dataclasses.replace(shared_mission, name="tiny-vl")
    try:
        yield run_recorded(
            m, tmp_path_factory.mktemp("faults"), lambda line: print(line, file=sys.stderr), ROWS, EVERY_TIER_TWICE
        )
    finally:
        remove(m, m.name, SECOND)


@pytest.mark.parametrize("name", ROWS)
def test_every_fault_costs_what_its_row_allows(table: FaultRecord, name: str):
    check(table, name)


@pytest.fixture(scope="module")
def metric_rows(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultRecord]:
    m = dataclasses.replace(shared_mission, name="tiny-vl")
    try:
        yield run_recorded(
            m,
            tmp_path_factory.mktemp("metric-faults"),
            lambda line: print(line, file=sys.stderr),
            METRIC_ROWS,
            METRIC_REPLICAS,
            clients=METRIC_CLIENTS,
            encoder_autoscaling=METRIC_AUTOSCALING,
        )
    finally:
        remove(m, m.name)


@pytest.mark.parametrize("name", METRIC_ROWS)
def test_a_lost_metric_source_is_named_holds_the_tier_and_recovers(metric_rows: FaultRecord, name: str):
    check(metric_rows, name)
