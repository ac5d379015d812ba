"""Prometheus metrics of the router.

With `--workers N` every worker process is a separate interpreter, so the metrics use
prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by main before
this module is imported) and any worker's /metrics reports the sum over all workers.
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.requests = Counter("epd_router_requests", "Requests answered, by route and HTTP status", ["route", "status"], registry=reg)
        self.stage_seconds = Histogram(
            "epd_router_stage_seconds",
            "Latency per stage: encode, prefill, decode, total, ttfb (time to first byte to the client)",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=reg,
        )
        self.items = Counter(
            "epd_router_items",
            "Media items by outcome: encoded (by an encoder), reused (router cache), fallback (sent raw to the consumer)",
            ["outcome"],
            registry=reg,
        )
        self.fallback_requests = Counter(
            "epd_router_encoder_fallback_requests",
            "Requests whose media went raw to the consumer, by reason (no_encoder, encoder_failed)",
            ["reason"],
            registry=reg,
        )
        self.retries = Counter("epd_router_retries", "Retries by stage and reason", ["stage", "reason"], registry=reg)
        self.inflight = Gauge(
            "epd_router_endpoint_inflight",
            "Work the router has in flight per endpoint (media items for encoders, requests otherwise)",
            ["role", "endpoint", "pod"],
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.backend_errors = Counter(
            "epd_router_backend_errors", "Failed backend calls by role, endpoint and kind", ["role", "endpoint", "kind"], registry=reg
        )
        self.ejections = Counter("epd_router_ejections", "Endpoints ejected after consecutive failures", ["role", "endpoint"], registry=reg)
        self.endpoint_up = Gauge(
            "epd_router_endpoint_available",
            "1 while the endpoint is ready and not ejected",
            ["role", "endpoint", "pod"],
            registry=reg,
            multiprocess_mode="liveall",
        )
        # Label children are looked up once per combination: .labels() is not free.
        self._stage = {}
        self._items = {}
        self._requests = {}

    def observe_stage(self, stage: str, seconds: float) -> None:
        child = self._stage.get(stage)
        if child is None:
            child = self._stage[stage] = self.stage_seconds.labels(stage)
        child.observe(seconds)

    def count_items(self, outcome: str, n: int = 1) -> None:
        if n:
            child = self._items.get(outcome)
            if child is None:
                child = self._items[outcome] = self.items.labels(outcome)
            child.inc(n)

    def count_request(self, route: str, status: int) -> None:
        key = (route, status)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = self.requests.labels(route, str(status))
        child.inc()

    def exposition(self) -> tuple[bytes, str]:
        path = multiprocess_dir()
        if path:
            from prometheus_client import multiprocess

            reg = CollectorRegistry()
            multiprocess.MultiProcessCollector(reg, path=path)
            return generate_latest(reg), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
