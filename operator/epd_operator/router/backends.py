"""Backend endpoints per tier: in-flight counts, health checks, ejection and re-admission,
and the load each backend reports through its own Prometheus metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import Gauge

from .metrics import RouterMetrics, multiprocess_dir

log = logging.getLogger("epd_router.backends")

ROLES = ("encoder", "prefill", "decode")


@dataclass(frozen=True, slots=True)
class DiscoveredEndpoint:
    """One backend as a discovery source sees it."""

    url: str  # scheme://host:port[/prefix] without a trailing slash (discovery.normalize_url, slice_endpoints)
    ready: bool = True
    pod: str = ""
    ec_zmq: str | None = None  # Mooncake consumer control address, when the connector needs one
    # The pod's compatibility generation (serving.epd.dev/compat-generation); None where discovery
    # knows none (static URLs): then every endpoint is in the one generation None.
    generation: str | None = None
    # Mooncake control addresses per DP rank when known one by one (static URLs, as vLLM's proxy
    # takes them, or the Service's `ec-dp<d>` ports); ranks beyond: derived from `ec_zmq` by the pool.
    ec_zmq_ranks: tuple[str, ...] = ()


# vLLM's data-parallel pinning: an API server in front of DP engines hands a request carrying this
# header to that engine (vLLM 0.32 entrypoints/generate/base/serving.py).
DP_RANK_HEADER = "X-data-parallel-rank"


class Endpoint:
    """One instance work is sent to: a backend, or one data-parallel rank (engine) of a backend."""

    __slots__ = (
        "url",
        "role",
        "key",
        "origin",
        "prefix",
        "pod",
        "ready",
        "healthy",
        "failures",
        "inflight",
        "external_load",
        "ec_zmq",
        "generation",
        "rank",
        "rank_header",
        "_gauge",
    )

    def __init__(
        self,
        url: str,
        role: str,
        pod: str,
        ec_zmq: str | None = None,
        generation: str | None = None,
        rank: int | None = None,
    ) -> None:
        self.url = url  # as discovered: with its scheme, without a trailing slash
        self.role = role
        parts = urlsplit(self.url)
        self.key = (parts.netloc or self.url) + ("" if rank is None else f"#dp{rank}")
        # None: a backend without data parallelism (no header; vLLM balances nothing).
        self.rank = rank
        self.rank_header = b"" if rank is None else f"{DP_RANK_HEADER}: {rank}\r\n".encode()
        # What the raw HTTP client dials (scheme://host:port) and puts before each path.
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.prefix = parts.path
        self.pod = pod
        self.ready = True
        self.healthy = True
        self.failures = 0
        self.inflight = 0
        # Work the backend reported beyond what this router sent it (other router replicas,
        # other workers), measured at the last scrape.
        self.external_load = 0
        self.ec_zmq = ec_zmq
        self.generation = generation
        self._gauge: Gauge | None = None

    @property
    def load(self) -> int:
        return self.inflight + self.external_load

    @property
    def available(self) -> bool:
        return self.ready and self.healthy

    def __repr__(self) -> str:
        return f"Endpoint({self.role} {self.url} load={self.load} available={self.available})"


class Pool:
    """The endpoints of one tier. `available` is a cached list: the hot path only reads it."""

    def __init__(
        self, role: str, metrics: RouterMetrics, eject_after: int = 3, dp_size: int = 1, zmq_rank_stride: int = 1
    ) -> None:
        self.role = role
        self.metrics = metrics
        self.eject_after = eject_after
        # Each backend runs `dp_size` engines: the pool holds one endpoint per (backend, rank), so
        # pickers balance ranks by their own in-flight load. A Mooncake consumer's control port for
        # rank d is its first port + d * zmq_rank_stride (its TP size: ec_port + d*TP + r).
        if dp_size < 1 or zmq_rank_stride < 1:
            raise ValueError("dp_size and zmq_rank_stride must be >= 1")
        self.dp_size = dp_size
        self.zmq_rank_stride = zmq_rank_stride
        self.endpoints: dict[str, Endpoint] = {}
        self.available: list[Endpoint] = []
        # `available` by compatibility generation: a request stays within one (see available_in).
        self.by_generation: dict[str | None, list[Endpoint]] = {}

    def update(self, discovered: list[DiscoveredEndpoint]) -> None:
        """Replace the endpoint set, keeping counters and health of endpoints that stay."""
        fresh: dict[str, Endpoint] = {}
        for d in discovered:
            url = d.url
            for rank in (None,) if self.dp_size == 1 else range(self.dp_size):
                if rank is None:
                    ec_zmq = d.ec_zmq
                else:
                    ec_zmq = (
                        d.ec_zmq_ranks[rank]
                        if rank < len(d.ec_zmq_ranks)
                        else rank_zmq(d.ec_zmq, rank, self.zmq_rank_stride)
                    )
                key = url if rank is None else f"{url}#dp{rank}"
                ep = self.endpoints.get(key) or fresh.get(key)
                if ep is None:
                    ep = Endpoint(url, self.role, d.pod, ec_zmq, d.generation, rank)
                    self._label(ep)
                else:
                    if ep.pod != d.pod:
                        self._forget(ep)
                        ep.pod = d.pod
                        self._label(ep)
                    ep.ec_zmq = ec_zmq
                    ep.generation = d.generation
                # One address may appear in several slices; ready if any says so.
                ep.ready = d.ready or (key in fresh and ep.ready)
                fresh[key] = ep
        for url, ep in self.endpoints.items():
            if url not in fresh:
                self._forget(ep)
        self.endpoints = fresh
        self._refresh()

    def _label(self, ep: Endpoint) -> None:
        gauge = self.metrics.inflight.labels(self.role, ep.key, ep.pod)
        if multiprocess_dir():
            # Other workers read this process's value from its file: keep it current.
            ep._gauge = gauge
            gauge.set(ep.inflight)
        else:
            # One process: read the count when scraped instead of updating it twice a call.
            gauge.set_function(lambda: ep.inflight)
            ep._gauge = None

    def _forget(self, ep: Endpoint) -> None:
        for gauge in (self.metrics.inflight, self.metrics.endpoint_up):
            with contextlib.suppress(KeyError):  # never labelled
                gauge.remove(self.role, ep.key, ep.pod)

    def _refresh(self) -> None:
        self.available = [ep for ep in self.endpoints.values() if ep.available]
        by_generation: dict[str | None, list[Endpoint]] = {}
        for ep in self.available:
            by_generation.setdefault(ep.generation, []).append(ep)
        for gone in self.by_generation.keys() - by_generation.keys():
            self.metrics.forget_generation(self.role, gone)
        for generation, eps in by_generation.items():
            self.metrics.generation_backends.labels(self.role, generation or "").set(len(eps))
        self.by_generation = by_generation
        for ep in self.endpoints.values():
            self.metrics.endpoint_up.labels(self.role, ep.key, ep.pod).set(1 if ep.available else 0)

    def available_in(self, generation: str | None) -> list[Endpoint]:
        """The available endpoints of one compatibility generation."""
        if len(self.by_generation) == 1 and generation in self.by_generation:
            return self.available  # the steady state: one generation, no new list per request
        return self.by_generation.get(generation, [])

    def acquire(self, ep: Endpoint, n: int = 1) -> None:
        ep.inflight += n
        if ep._gauge is not None:
            ep._gauge.inc(n)

    def release(self, ep: Endpoint, n: int = 1) -> None:
        ep.inflight -= n
        if ep._gauge is not None:
            ep._gauge.dec(n)

    def record_failure(self, ep: Endpoint, kind: str) -> None:
        self.metrics.backend_errors.labels(self.role, ep.key, kind).inc()
        ep.failures += 1
        if ep.healthy and ep.failures >= self.eject_after:
            ep.healthy = False
            self.metrics.ejections.labels(self.role, ep.key).inc()
            log.warning("ejected %s %s after %d consecutive failures (%s)", self.role, ep.url, ep.failures, kind)
            self._refresh()

    def record_success(self, ep: Endpoint) -> None:
        ep.failures = 0
        if not ep.healthy:
            ep.healthy = True
            log.info("re-admitted %s %s", self.role, ep.url)
            self._refresh()

    def status(self) -> str:
        """vLLM proxy vocabulary: healthy | unhealthy | empty."""
        if not self.endpoints:
            return "empty"
        return "healthy" if self.available else "unhealthy"

    def describe(self) -> list[dict]:
        return [
            {
                "url": ep.url,
                "pod": ep.pod,
                "generation": ep.generation,
                "ready": ep.ready,
                "healthy": ep.healthy,
                "inflight": ep.inflight,
                "load": ep.load,
                **({} if ep.rank is None else {"rank": ep.rank}),
            }
            for ep in self.endpoints.values()
        ]


def rank_zmq(base: str | None, rank: int, stride: int) -> str | None:
    """The Mooncake control address of DP rank `rank` of a consumer whose rank 0 listens at `base`."""
    if base is None:
        return None
    host, _, port = base.rpartition(":")
    return f"{host}:{int(port) + rank * stride}"


def finishing_consumers(first: Pool, then: Pool | None) -> list[Endpoint]:
    """The EC consumers (PD, or P when a decode tier follows) a request may start on: those whose
    generation has an available instance in the tier that must finish it."""
    if then is None:
        return first.available
    if len(first.by_generation) == 1 and first.by_generation.keys() == then.by_generation.keys():
        return first.available  # the steady state: one generation everywhere
    return [ep for ep in first.available if then.by_generation.get(ep.generation)]


def scraped_queue_depth(text: bytes) -> int | None:
    """vllm:num_requests_running + vllm:num_requests_waiting summed over label sets."""
    depths = scraped_queue_depths(text)
    return sum(depths.values()) if depths else None


def scraped_queue_depths(text: bytes) -> dict[str | None, int]:
    """vllm:num_requests_running + vllm:num_requests_waiting per engine (vLLM labels each DP engine's
    gauges `engine="<rank>"`; None for series without that label). Empty when neither is exported."""
    totals: dict[str | None, float] = {}
    for line in text.splitlines():
        if not line.startswith(b"vllm:num_requests_"):
            continue
        name_end = min((i for i in (line.find(b"{"), line.find(b" ")) if i >= 0), default=-1)
        if line[:name_end] not in (b"vllm:num_requests_running", b"vllm:num_requests_waiting"):
            continue
        labelled = line[name_end : name_end + 1] == b"{"
        labels_end = line.rfind(b"}") + 1 if labelled else name_end
        try:  # the value, then an optional timestamp (the exposition format's `name{labels} value [ms]`)
            value = float(line[labels_end:].split()[0])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value):  # NaN or ±Inf: no queue depth
            continue
        engine = _ENGINE_LABEL.search(line[name_end:labels_end]) if labelled else None
        key = engine.group(1).decode() if engine else None
        totals[key] = totals.get(key, 0.0) + value
    return {key: int(value) for key, value in totals.items()}


_ENGINE_LABEL = re.compile(rb'[{,]\s*engine="([^"]*)"')


class HealthChecker:
    """Probes every endpoint's /health (ejecting and re-admitting) and scrapes /metrics for load."""

    def __init__(
        self,
        pools: list[Pool],
        session: aiohttp.ClientSession,
        interval: float,
        timeout: float,
        scrape_load: bool = True,
    ) -> None:
        self.pools = pools
        self.session = session
        self.interval = interval
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.scrape_load = scrape_load

    async def check(self, pool: Pool, ep: Endpoint, ranks: list[Endpoint] | None = None) -> None:
        """Probe one backend; `ranks` are all its endpoints (one per DP rank), `ep` alone by default.
        One API server answers for every rank, so they are ejected and re-admitted together."""
        ranks = ranks or [ep]
        try:
            async with self.session.get(ep.url + "/health", timeout=self.timeout) as r:
                await r.read()
                ok = r.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            ok = False
        for each in ranks:
            if ok:
                pool.record_success(each)
            else:
                pool.record_failure(each, "health")
        if not ok or not self.scrape_load:
            return
        inflight_before = {each: each.inflight for each in ranks}
        try:
            async with self.session.get(ep.url + "/metrics", timeout=self.timeout) as r:
                depths = scraped_queue_depths(await r.read()) if r.status == 200 else {}
        except (TimeoutError, aiohttp.ClientError, OSError):
            depths = {}
        if not depths:
            return
        for each in ranks:
            if each.rank is None:
                depth = sum(depths.values())
            elif str(each.rank) in depths:
                depth = depths[str(each.rank)]
            else:  # no per-engine series: the backend's total belongs to no one rank
                continue
            each.external_load = max(0, depth - inflight_before[each])

    async def check_all(self) -> None:
        # Endpoints Kubernetes calls unready get no traffic, so they need no probe either.
        probes = []
        for pool in self.pools:
            by_url: dict[str, list[Endpoint]] = {}
            for ep in list(pool.endpoints.values()):
                if ep.ready:
                    by_url.setdefault(ep.url, []).append(ep)
            probes += [self.check(pool, ranks[0], ranks) for ranks in by_url.values()]
        await asyncio.gather(*probes)

    async def run(self) -> None:
        while True:
            try:
                await self.check_all()
            except Exception:  # a probe bug must not stop health checking for good
                log.exception("health check round failed")
            await asyncio.sleep(self.interval)
