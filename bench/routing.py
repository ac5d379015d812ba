"""Routing quality: the real router in front of N encoders that are slow on a cache miss.

Each fake encoder serves one batch at a time (a GPU) and keeps what it encoded: an
item it has seen costs `hit_ms`, a new one `miss_ms`. Requests (one image each, Zipf
over a catalogue) arrive open-loop at a fixed rate, identical for every policy (same
seed). The router under test is the real `epd-router` process pinned to its own core
(so the real pickers, load accounting and reuse cache decide), plus vLLM's proxy
(round-robin per item) as the reference.

Per policy: encoder calls per distinct image (items the router sent to any encoder),
encodes per distinct image (cache misses: the real work), the busiest encoder against
the mean (items served and busy time), and request latency p50/p99.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from dev.ports import free_port

from . import contenders as C
from .backends import COMPLETION, encoder_report
from .overhead import ROUTER_CORE
from .procs import start_server
from .report import Target, table
from .workload import chat_request


@dataclass(frozen=True)
class Plan:
    encoders: int = 4
    requests: int = 600
    catalogue: int = 200  # images that can be drawn; the distinct ones actually drawn are counted
    zipf_s: float = 1.0
    rate: float = 80.0  # requests per second, Poisson arrivals
    miss_ms: float = 25.0
    hit_ms: float = 2.0
    seed: int = 7


WARMUP = 20  # requests, not counted

FULL = Plan()
QUICK = Plan(requests=500, rate=125.0)

# label, contender, extra flags
POLICIES = (
    # The workload's images are http(s) URLs: reusing them is what a deployment that declares its media
    # URLs immutable (spec.router.trust.immutableMediaURLs) gets; without it only content-addressed items are reused.
    (
        "cache-aware + reuse",
        C.EPD_ROUTER,
        ["--encoder-policy", "cache-aware", "--reuse-ttl", "600", "--immutable-media-urls"],
    ),
    ("cache-aware", C.EPD_ROUTER, ["--encoder-policy", "cache-aware"]),
    ("least-loaded", C.EPD_ROUTER, ["--encoder-policy", "least-loaded"]),
    ("round-robin", C.EPD_ROUTER, ["--encoder-policy", "round-robin"]),
    ("vLLM proxy (round-robin per item)", C.VLLM_PROXY, []),
)


class SlowEncoder:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.gpu = asyncio.Lock()
        self.seen: set[str] = set()
        self.items = 0
        self.misses = 0
        self.busy_s = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        report = encoder_report(body)
        uuids = list(report["ec_transfer_params"])
        async with self.gpu:
            new = [u for u in uuids if u not in self.seen]
            service = (len(new) * self.plan.miss_ms + (len(uuids) - len(new)) * self.plan.hit_ms) / 1000
            await asyncio.sleep(service)
            self.seen.update(new)
            self.items += len(uuids)
            self.misses += len(new)
            self.busy_s += service
        return web.json_response(report)


@dataclass
class PolicyResult:
    label: str
    distinct: int
    latencies_ms: list[float]
    failed: int
    items: list[int]
    misses: list[int]
    busy_s: list[float]

    def pct(self, q: float) -> float:
        s = sorted(self.latencies_ms)
        return s[min(len(s) - 1, int(q / 100 * len(s)))] if s else float("nan")

    @property
    def calls_per_distinct(self) -> float:
        return sum(self.items) / self.distinct

    @property
    def encodes_per_distinct(self) -> float:
        return sum(self.misses) / self.distinct

    @staticmethod
    def _peak(values) -> float:
        mean = sum(values) / len(values)
        return max(values) / mean if mean else float("nan")

    @property
    def peak_items(self) -> float:
        return self._peak(self.items)

    @property
    def peak_busy(self) -> float:
        return self._peak(self.busy_s)


@dataclass
class RoutingResult:
    plan: Plan
    workload: list[int]
    policies: list[PolicyResult] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def distinct(self) -> int:
        return len(set(self.workload))


def zipf_workload(plan: Plan) -> list[int]:
    rng = random.Random(plan.seed)
    weights = [1 / k**plan.zipf_s for k in range(1, plan.catalogue + 1)]
    return rng.choices(range(plan.catalogue), weights=weights, k=plan.requests)


async def _serve(plan: Plan) -> tuple[list[SlowEncoder], list[web.AppRunner], list[str], str]:
    async def decode(_request):
        return web.Response(body=COMPLETION, content_type="application/json")

    async def health(_request):
        return web.json_response({"status": "ok"})

    async def serve(chat_handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat_handler)
        app.router.add_get("/health", health)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    runners: list[web.AppRunner] = []
    encoders = [SlowEncoder(plan) for _ in range(plan.encoders)]
    urls = [await serve(enc.handle) for enc in encoders]
    return encoders, runners, urls, await serve(decode)


async def _drive(url: str, plan: Plan, workload: list[int]) -> tuple[list[float], int]:
    rng = random.Random(plan.seed + 1)
    latencies: list[float] = []
    failed = 0

    async def one(session: aiohttp.ClientSession, image: int) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            async with session.post(url, json=chat_request([image], stream=False)) as r:
                await r.read()
                ok = r.status == 200
        except aiohttp.ClientError:
            ok = False
        if ok:
            latencies.append(1000 * (time.perf_counter() - t0))
        else:
            failed += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = []
        next_at = time.perf_counter()
        for image in workload:
            next_at += rng.expovariate(plan.rate)
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(session, image)))
        await asyncio.gather(*tasks)
    return latencies, failed


async def _run_policy(label, contender, flags, plan, workload, log_dir) -> PolicyResult:
    encoders, runners, urls, decode_url = await _serve(plan)
    proc = None
    try:
        topo = C.Topology("E+PD", encoder=",".join(urls), decode=decode_url)
        proc, port = await asyncio.to_thread(
            start_server,
            f"routing-{label.split()[0]}-{len(flags)}",
            lambda p: [*contender.argv(topo, p), *flags],
            ROUTER_CORE,
            log_dir,
        )
        url = f"http://127.0.0.1:{port}{C.CHAT_PATH}"
        # Warm the router's connection pools with images outside the catalogue, then count from zero.
        await _drive(url, dataclasses.replace(plan, rate=plan.rate / 2), [plan.catalogue + i for i in range(WARMUP)])
        for enc in encoders:
            enc.items = enc.misses = 0
            enc.busy_s = 0.0
        latencies, failed = await _drive(url, plan, workload)
        return PolicyResult(
            label,
            len(set(workload)),
            latencies,
            failed,
            items=[e.items for e in encoders],
            misses=[e.misses for e in encoders],
            busy_s=[e.busy_s for e in encoders],
        )
    finally:
        if proc:
            proc.stop()
        for runner in runners:
            await runner.cleanup()


def run(plan: Plan, log_dir: Path, progress=print) -> RoutingResult:
    workload = zipf_workload(plan)
    result = RoutingResult(plan, workload)
    if result.distinct < 100:
        raise ValueError(f"the workload draws only {result.distinct} distinct images; the benchmark needs >= 100")
    for label, contender, flags in POLICIES:
        try:
            r = asyncio.run(_run_policy(label, contender, flags, plan, workload, log_dir))
        except Exception as e:  # a policy that cannot run is reported, not fatal
            result.missing[label] = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
            progress(f"  {label}: NOT measured: {result.missing[label]}")
            continue
        result.policies.append(r)
        progress(
            f"  {label:34} calls/distinct {r.calls_per_distinct:5.2f} encodes/distinct {r.encodes_per_distinct:5.2f} "
            f"peak/mean items {r.peak_items:4.2f} busy {r.peak_busy:4.2f} p50 {r.pct(50):6.1f} ms p99 {r.pct(99):6.1f} ms "
            f"failed {r.failed}"
        )
    return result


def targets(result: RoutingResult) -> list[Target]:
    section = "routing quality"
    best = next((p for p in result.policies if p.label == POLICIES[0][0]), None)
    return [
        Target(
            section,
            "cache-aware + reuse: encoder calls per distinct image",
            "≤ 1.05",
            f"{best.calls_per_distinct:.3f}" if best else "–",
            None if best is None else best.calls_per_distinct <= 1.05,
        ),
        Target(
            section,
            "cache-aware + reuse: busiest encoder vs mean (items served)",
            "≤ 1.25×",
            f"{best.peak_items:.2f}× (busy time {best.peak_busy:.2f}×)" if best else "–",
            None if best is None else best.peak_items <= 1.25,
        ),
    ]


def markdown(result: RoutingResult) -> str:
    p = result.plan
    intro = (
        f"The real `epd-router` (and vLLM's proxy for reference) pinned to core {ROUTER_CORE}, in front of "
        f"{p.encoders} fake encoders (one batch at a time each; {p.miss_ms:g} ms per item not yet encoded on that "
        f"encoder, {p.hit_ms:g} ms per item it already has) and one PD. Workload: {p.requests} requests, one image "
        f"each, Zipf(s={p.zipf_s:g}) over {p.catalogue} images ({result.distinct} distinct drawn), Poisson arrivals at "
        f"{p.rate:g} req/s, the same sequence for every policy. Reuse = `--reuse-ttl 600 --immutable-media-urls` (the "
        "router remembers what an encoder reported and skips the encoder for a repeated image; the images are URLs, so "
        "the deployment declares them immutable, `spec.router.trust.immutableMediaURLs`). `encoder calls` counts items the router sent "
        "to any encoder; `encodes` the ones an encoder had not seen (the real work); the busiest encoder is compared "
        "with the mean over the measured requests (20 warm-up requests with other images are not counted)."
    )
    parts = [intro]
    if result.missing:
        parts.append("**Not measured:**\n" + "\n".join(f"- {n}: {why}" for n, why in result.missing.items()))
    parts.append(
        table(
            [
                "policy",
                "encoder calls / distinct image",
                "encodes (misses) / distinct image",
                "busiest encoder / mean (items)",
                "busiest / mean (busy time)",
                "items per encoder",
                "p50 ms",
                "p99 ms",
                "failed",
            ],
            [
                [
                    f"{r.label}",
                    r.calls_per_distinct,
                    r.encodes_per_distinct,
                    r.peak_items,
                    r.peak_busy,
                    " / ".join(map(str, r.items)),
                    r.pct(50),
                    r.pct(99),
                    r.failed,
                ]
                for r in result.policies
            ],
        )
    )
    return "\n\n".join(parts)
