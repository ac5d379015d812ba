"""Prometheus metrics of one operator process (served on `--metrics-port`, path `/metrics`).

Each operator instance owns its registry, so two operators in one test process never share counts.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "epd_operator_reconciles", "Reconcile passes over one EPDDeployment, by kind (full|status) and result.",
            ["kind", "result"], registry=self.registry)
        self.errors = Counter(
            "epd_operator_reconcile_errors", "Reconcile passes that failed and were queued for a retry.",
            ["kind"], registry=self.registry)
        self.duration = Histogram(
            "epd_operator_reconcile_duration_seconds", "Duration of one reconcile pass.", ["kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry)
        self.writes = Counter(
            "epd_operator_api_writes", "Mutating API requests sent (zero in steady state, Lease renewals aside).",
            ["verb", "kind"], registry=self.registry)
        self.drift = Counter(
            "epd_operator_drift_repairs", "Children restored because someone changed what the operator applies.",
            ["kind"], registry=self.registry)
        self.leader = Gauge("epd_operator_leader", "1 while this replica holds the leader Lease and acts.",
                            registry=self.registry)
        self.managed = Gauge("epd_operator_epddeployments", "EPDDeployments this operator currently watches.",
                             registry=self.registry)

    def count_write(self, verb: str, kind: str) -> None:
        self.writes.labels(verb=verb, kind=kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
