"""Prometheus metrics of the router.

With `--workers N` every worker process is a separate interpreter, so the metrics use
prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set by main before any
worker starts): each worker writes its values to files in that directory and /metrics
(served by the supervisor on `--metrics-port`, or by any worker on the data port) reads
them all.

Label names never collide with the target labels Prometheus Operator adds to every scraped
series (`pod`, `namespace`, `service`, `endpoint`, `job`, `instance`, `container`): the
backend an endpoint series is about is `backend` (host:port) and `backend_pod` (its pod).

Per-backend gauges in multiprocess mode: prometheus_client cannot remove a label set from
its files, and its `liveall` mode adds a `pid` label. So each worker writes NaN for a backend
it forgot, and the view below drops NaN samples, then sums (in flight) or takes the maximum
(available) over the live workers, without a `pid` label. A worker that exits is marked dead
by the supervisor, which deletes its live-gauge file.
"""

from __future__ import annotations

import functools
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.samples import Sample

from .. import __version__
from . import contract

STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
BACKEND_LABELS = ["role", "backend", "backend_pod"]
INFLIGHT = "epd_router_endpoint_inflight"
AVAILABLE = "epd_router_endpoint_available"
# How the per-worker values of each per-backend gauge combine.
_COMBINE: dict[str, Callable[[Iterable[float]], float]] = {INFLIGHT: sum, AVAILABLE: max}
# The supervisor writes its own pid and its workers' here, one a line, for the process metrics.
PIDS_FILE = "pids"


def multiprocess_dir() -> str | None:
    # main() leaves only this spelling set (prometheus_client also reads a lower-case one: main removes it).
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


class _BackendGauge(Gauge):
    """A per-backend gauge whose removal also works across worker processes (see the module doc)."""

    def remove(self, *labelvalues: object) -> None:
        if not multiprocess_dir():
            super().remove(*labelvalues)
            return
        key = tuple(str(v) for v in labelvalues)
        with self._lock:
            child = self._metrics.pop(key)  # KeyError(key) for a series never labelled, as prometheus_client's own
        assert isinstance(child, Gauge)  # prometheus_client types its children with its own unbound TypeVar
        child.set(math.nan)


class BuildInfo:
    """`<prefix>_build_info{version} 1`: present from the first scrape, before any traffic."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=["version"])
        family.add_metric([__version__], 1)
        yield family


ROUTER_BUILD_INFO = BuildInfo("epd_router_build_info", "epd-router version; always 1")


class ProcessGroupCollector:
    """prometheus_client's process metrics (`process_*`) summed over the supervisor and its workers.

    CPU seconds, memory and open descriptors add up; the start time is the earliest and the
    descriptor limit the largest. No per-process label.
    """

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, Metric] = {}
        values: dict[str, list[float]] = defaultdict(list)
        for pid in self.pids():
            for family in ProcessCollector(pid=_constant(pid), registry=None).collect():
                merged.setdefault(family.name, family)
                values[family.name] += [s.value for s in family.samples]
        for name, family in merged.items():
            numbers = values[name]
            if name.endswith("start_time_seconds"):
                value = min(numbers)
            elif name.endswith("max_fds"):
                value = max(numbers)
            else:
                value = sum(numbers)
            out = Metric(family.name, family.documentation, family.type)
            out.samples = [Sample(family.samples[0].name, {}, value)]
            yield out


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


def _recorded_pids(path: str) -> list[int]:
    try:
        with open(os.path.join(path, PIDS_FILE)) as f:
            return [int(line) for line in f.read().split()]
    except (OSError, ValueError):
        return [os.getpid()]


class MultiProcessView:
    """Every worker's metrics from the multiprocess directory, per-backend gauges combined without `pid`."""

    def __init__(self, path: str) -> None:
        from prometheus_client.multiprocess import MultiProcessCollector

        self.files = MultiProcessCollector(None, path=path)

    def collect(self) -> Iterable[Metric]:
        for family in self.files.collect():
            combine = _COMBINE.get(family.name)
            if family.type != "gauge" or combine is None:
                yield family
                continue
            per_series: dict[tuple, list[float]] = defaultdict(list)
            for s in family.samples:
                if math.isnan(s.value):  # a backend this worker forgot
                    continue
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid"))
                per_series[key].append(s.value)
            out = Metric(family.name, family.documentation, family.type)
            out.samples = [
                Sample(family.name, dict(key), float(combine(vals))) for key, vals in sorted(per_series.items())
            ]
            yield out


def multiprocess_registry(path: str) -> CollectorRegistry:
    """What /metrics reports when several workers share the metrics directory `path`."""
    reg = CollectorRegistry()
    reg.register(MultiProcessView(path))
    reg.register(ROUTER_BUILD_INFO)
    reg.register(ProcessGroupCollector(lambda: _recorded_pids(path)))
    return reg


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.requests = Counter(
            "epd_router_requests", "Requests answered, by route and HTTP status", ["route", "status"], registry=reg
        )
        self.stage_seconds = Histogram(
            "epd_router_stage_seconds",
            "Latency per stage: encode, prefill, decode, total, ttfb (time to first byte to the client)",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=reg,
        )
        self.items = Counter(
            "epd_router_items",
            "Media items by outcome: encoded (by an encoder), reused (router cache), fallback (sent raw to the consumer: "
            "no encoder, or it failed), spilled (sent raw to the consumer while every encoder was busy)",
            ["outcome"],
            registry=reg,
        )
        self.fallback_requests = Counter(
            "epd_router_encoder_fallback_requests",
            "Requests whose media went raw to the consumer, by reason (no_encoder, no_encoder_in_generation, encoder_failed)",
            ["reason"],
            registry=reg,
        )
        self.spilled_items = Counter(
            "epd_router_spilled_items",
            "Media items sent raw to the consumer instead of queuing on encoders (spill-over), by reason "
            "(encoders_busy: every encoder at the spill-over bound)",
            ["reason"],
            registry=reg,
        )
        self.spilled_requests = Counter(
            "epd_router_spilled_requests",
            "Requests whose new media items all went raw to the consumer by spill-over, by reason",
            ["reason"],
            registry=reg,
        )
        self.retries = Counter("epd_router_retries", "Retries by stage and reason", ["stage", "reason"], registry=reg)
        self.kv_handoffs = Counter(
            "epd_router_kv_handoffs",
            "E/P/D decode attempts by what became of prefill's KV: pulled (decode answered with prefill's "
            "kv_transfer_params), failed (decode failed on them: vLLM fails a request whose KV load failed), "
            "missing (prefill answered without kv_transfer_params: decode computed the prompt itself)",
            ["outcome"],
            registry=reg,
        )
        self.inflight = _BackendGauge(
            INFLIGHT,
            "Work the router has in flight per backend (media items for encoders, requests otherwise)",
            BACKEND_LABELS,
            registry=reg,
            multiprocess_mode="liveall",  # combined without `pid` by MultiProcessView
        )
        self.encoder_demand = Gauge(
            contract.ENCODER_DEMAND_METRIC,
            "The most media items this router wanted encoded and had not finished at once over the last "
            "--demand-window seconds: on an encoder, or sent raw to the consumer (spilled, or no encoder of the "
            "request's generation) until the consumer answers; items that are not encoder work (audio carried "
            "in a video) or whose encoder failed are left out",
            [contract.DEMAND_DEPLOYMENT_LABEL],
            registry=reg,
            multiprocess_mode="livesum",  # the router's demand: every worker's, summed
        )
        self.backend_errors = Counter(
            "epd_router_backend_errors",
            "Failed backend calls by role, backend and kind",
            ["role", "backend", "kind"],
            registry=reg,
        )
        self.ejections = Counter(
            "epd_router_ejections", "Backends ejected after consecutive failures", ["role", "backend"], registry=reg
        )
        self.endpoint_up = _BackendGauge(
            AVAILABLE,
            "1 while the backend is ready and not ejected",
            BACKEND_LABELS,
            registry=reg,
            multiprocess_mode="liveall",  # combined without `pid` by MultiProcessView
        )
        self.generation_backends = Gauge(
            "epd_router_generation_backends",
            "Available backends per role and compatibility generation (the router pairs tiers within one)",
            ["role", "generation"],
            registry=reg,
            multiprocess_mode="livemax",  # every worker discovers the same backends
        )
        if registry is None:
            reg.register(ROUTER_BUILD_INFO)
            ProcessCollector(registry=reg)
        # Label children are looked up once per combination: .labels() is not free.
        self._stage_child = functools.cache(self.stage_seconds.labels)
        self._items_child = functools.cache(self.items.labels)
        self._requests_child = functools.cache(self.requests.labels)

    def forget_generation(self, role: str, generation: str | None) -> None:
        self.generation_backends.remove(role, generation or "")  # prometheus_client ignores a series never set

    def observe_stage(self, stage: str, seconds: float) -> None:
        self._stage_child(stage).observe(seconds)

    def count_items(self, outcome: str, n: int) -> None:
        if n:
            self._items_child(outcome).inc(n)

    def count_request(self, route: str, status: int) -> None:
        self._requests_child(route, str(status)).inc()

    def exposition_registry(self) -> CollectorRegistry:
        path = multiprocess_dir()
        return multiprocess_registry(path) if path else self.registry

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.exposition_registry()), CONTENT_TYPE_LATEST
