"""Prometheus metrics of one operator process (served on `--metrics-port`, path `/metrics`).

Each operator instance owns its registry, so two operators in one test process never share counts.
Label names never collide with Prometheus Operator's target labels (`namespace`, `pod`, ...): an
EPDDeployment is `epd_namespace`/`epd_name`.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from .. import __version__
from ..api.status import Phase

CONTENT_TYPE = CONTENT_TYPE_LATEST
PHASES: tuple[str, ...] = typing.get_args(Phase)


BUILD_INFO = ("epd_operator_build_info", "epd-operator version; always 1")  # name, help
# Upper bounds (seconds) of epd_operator_reconcile_duration_seconds: a status pass takes milliseconds, a full pass
# that writes children up to seconds against a slow API server.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _BuildInfo:
    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(*BUILD_INFO, labels=["version"])
        family.add_metric([__version__], 1)
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "epd_operator_reconciles",
            "Reconcile passes over one EPDDeployment, by kind (full|status) and result.",
            ["kind", "result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "epd_operator_reconcile_errors",
            "Reconcile passes that failed and were queued for a retry.",
            ["kind"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "epd_operator_reconcile_duration_seconds",
            "Duration of one reconcile pass.",
            ["kind"],
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.writes = Counter(
            "epd_operator_api_writes",
            "Mutating API requests sent (zero in steady state, Lease renewals aside).",
            ["verb", "kind"],
            registry=self.registry,
        )
        self.drift = Counter(
            "epd_operator_drift_repairs",
            "Children restored because someone changed what the operator applies.",
            ["kind"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "epd_operator_leader", "1 while this replica holds the leader Lease and acts.", registry=self.registry
        )
        self.managed = Gauge(
            "epd_operator_epddeployments", "EPDDeployments this operator currently watches.", registry=self.registry
        )
        # Read from the reconciler's cache at each scrape (set_function): what its memory holds.
        self.cache_objects = Gauge(
            "epd_operator_cache_objects",
            "Objects in the reconciler's watch-fed cache (EPDDeployments, children, pods).",
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            "epd_operator_cache_bytes",
            "Size of the objects in the reconciler's cache, as the compact JSON it keeps.",
            registry=self.registry,
        )
        self.phase = Gauge(
            "epd_operator_deployment_phase",
            "Phase of each EPDDeployment: one series per phase, 1 for the current one (set by the leader).",
            ["epd_namespace", "epd_name", "phase"],
            registry=self.registry,
        )
        self.generation_ready_pods = Gauge(
            "epd_operator_generation_ready_pods",
            "Ready vLLM pods per compatibility generation and tier: a generation's capacity, since the router pairs "
            "tiers only within one (two generations while a change of image, model or connector rolls out).",
            ["epd_namespace", "epd_name", "generation", "tier"],
            registry=self.registry,
        )
        self._generation_series: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self.registry.register(_BuildInfo())
        ProcessCollector(registry=self.registry)

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        """Record `phase` as the EPDDeployment's current one (call after each status computation)."""
        for candidate in PHASES:
            self.phase.labels(namespace, name, candidate).set(1 if candidate == phase else 0)

    def set_generations(self, namespace: str, name: str, ready: dict[str, dict[str, int]]) -> None:
        """Ready pods by generation and tier; the series of a generation that is gone are removed."""
        series = {(generation, tier) for generation, tiers in ready.items() for tier in tiers}
        for generation, tier in self._generation_series.get((namespace, name), set()) - series:
            self.generation_ready_pods.remove(namespace, name, generation, tier)  # set by an earlier call
        for generation, tiers in ready.items():
            for tier, count in tiers.items():
                self.generation_ready_pods.labels(namespace, name, generation, tier).set(count)
        self._generation_series[(namespace, name)] = series

    def forget(self, namespace: str, name: str) -> None:
        """Drop the series of a deleted EPDDeployment (or one this replica stops acting for)."""
        for candidate in PHASES:
            self.phase.remove(namespace, name, candidate)  # prometheus_client ignores a series never set
        self.set_generations(namespace, name, {})

    def count_write(self, verb: str, kind: str) -> None:
        self.writes.labels(verb=verb, kind=kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
