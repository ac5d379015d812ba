"""Router overhead: every contender against the same fast backends, in one run.

Core layout (2 cores): each router is pinned to ROUTER_CORE; the fake backends and wrk
share LOAD_CORE. All routers of a topology run at once and the contenders are
interleaved cell by cell, so a drift in the machine's background load hits all of them
alike. Idle routers cost next to nothing (vllm-router's health checks aside).

Per cell (topology × images × streaming × concurrency × contender) the report gets:
req/s, p50/p99, router CPU per 1000 requests (from /proc, whole process tree), the load
generator's CPU, how busy the load core was, and encoder/prefill calls per request
counted by the backends (proof the work was done). Peak RSS per router at the end.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dev.ports import free_port

from . import contenders as C
from .loadgen import LoadResult, run_wrk
from .procs import Proc, cpu_seconds, peak_rss_mib, start, start_server, wait_http
from .report import Target, table
from .workload import chat_request, write_bodies

ROUTER_CORE = 0
LOAD_CORE = 1


@dataclass(frozen=True)
class Plan:
    topologies: tuple[str, ...] = ("E+PD", "E/P/D")
    images: tuple[int, ...] = (1, 4)
    streaming: tuple[bool, ...] = (False, True)
    concurrency: tuple[int, ...] = (1, 16, 64)
    seconds: int = 2  # wrk takes whole seconds
    warmup_seconds: int = 1


FULL = Plan()
QUICK = Plan(topologies=("E+PD",), images=(1,), concurrency=(1, 64), seconds=1, warmup_seconds=1)


@dataclass
class Cell:
    topology: str
    images: int
    stream: bool
    concurrency: int
    contender: str
    load: LoadResult
    router_cpu_s: float
    backend_cpu_s: float
    encoder_calls: int
    prefill_calls: int

    @property
    def router_cpu_ms_per_req(self) -> float:
        return 1000 * self.router_cpu_s / self.load.requests if self.load.requests else float("nan")

    @property
    def load_core_busy(self) -> float:
        return (self.backend_cpu_s + self.load.loadgen_cpu_s) / self.load.seconds

    def as_dict(self) -> dict:
        return {
            "topology": self.topology,
            "images": self.images,
            "stream": self.stream,
            "concurrency": self.concurrency,
            "contender": self.contender,
            "rps": self.load.rps,
            "p50_ms": self.load.p50_ms,
            "p99_ms": self.load.p99_ms,
            "failed": self.load.failed,
            "requests": self.load.requests,
            "router_cpu_ms_per_req": self.router_cpu_ms_per_req,
            "loadgen_cpu_s": self.load.loadgen_cpu_s,
            "load_core_busy": self.load_core_busy,
            "encoder_calls_per_req": self.encoder_calls / max(1, self.load.requests),
            "prefill_calls_per_req": self.prefill_calls / max(1, self.load.requests),
        }


@dataclass
class OverheadResult:
    plan: Plan
    cells: list[Cell] = field(default_factory=list)
    peak_rss_mib: dict[str, dict[str, float]] = field(default_factory=dict)  # topology -> contender -> MiB
    missing: dict[str, str] = field(default_factory=dict)  # contender -> why it was not measured

    def cell(self, topology: str, images: int, stream: bool, concurrency: int, contender: str) -> Cell | None:
        for c in self.cells:
            if (c.topology, c.images, c.stream, c.concurrency, c.contender) == (
                topology,
                images,
                stream,
                concurrency,
                contender,
            ):
                return c
        return None


def _backend_stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(f"{url}/_stats", timeout=5) as resp:
        return json.load(resp)


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _smoke(contender: C.Contender, url: str, topo: C.Topology, stats_url: str) -> None:
    """One real request through the contender: it answers 200 and calls what it should."""
    before = _backend_stats(stats_url)
    status, body = _post(url, chat_request([0], stream=False))
    if status != 200:
        raise RuntimeError(f"smoke request answered {status}: {body[:300]!r}")
    after = _backend_stats(stats_url)
    if contender.calls_encoder and after.get("encoder", 0) <= before.get("encoder", 0):
        raise RuntimeError("smoke request reached decode without an encoder call")
    if topo.prefill and contender.name != "direct" and after.get("prefill", 0) <= before.get("prefill", 0):
        raise RuntimeError("smoke request in E/P/D made no prefill call")


def run(plan: Plan, contenders: tuple[C.Contender, ...], log_dir: Path, progress=print) -> OverheadResult:
    result = OverheadResult(plan)
    workdir = Path(tempfile.mkdtemp(prefix="epd-bench-"))
    for topo_name in plan.topologies:
        roles = ("encoder", "prefill", "decode") if topo_name == "E/P/D" else ("encoder", "decode")
        ports = {role: free_port() for role in roles}
        url = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
        topo = C.Topology(topo_name, encoder=url["encoder"], decode=url["decode"], prefill=url.get("prefill"))
        tag = topo_name.replace("/", "").replace("+", "")
        backend = start(
            f"backends-{tag}",
            [sys.executable, "-m", "bench.backends", *[a for role, p in ports.items() for a in (f"--{role}", str(p))]],
            LOAD_CORE,
            log_dir,
        )
        procs: dict[str, Proc] = {}
        try:
            wait_http(backend, f"{topo.decode}/health", timeout=30)
            urls = _start_contenders(contenders, topo, tag, procs, result, log_dir, progress)
            for images in plan.images:
                for stream in plan.streaming:
                    bodies = write_bodies(workdir / f"{tag}-{images}-{int(stream)}.jsonl", images, stream)
                    for conc in plan.concurrency:
                        for name, target in list(urls.items()):
                            try:
                                cell = _measure(
                                    topo_name,
                                    images,
                                    stream,
                                    conc,
                                    name,
                                    target,
                                    procs.get(name),
                                    backend,
                                    bodies,
                                    plan,
                                    topo.decode,
                                )
                            except Exception as e:  # e.g. the router died: report it, measure the others
                                _give_up(result, name, f"{topo_name}: failed during the run: {_one_line(e)}", progress)
                                del urls[name]
                                continue
                            result.cells.append(cell)
                            progress(
                                f"  {topo_name:5} img={images} stream={int(stream)} c={conc:<3} {name:13} "
                                f"{cell.load.rps:8.0f} req/s p50 {cell.load.p50_ms:6.2f} ms p99 {cell.load.p99_ms:6.2f} ms "
                                f"cpu {cell.router_cpu_ms_per_req:5.3f} ms/req fail {cell.load.failed}"
                            )
            result.peak_rss_mib[topo_name] = {name: peak_rss_mib(p.pid) for name, p in procs.items() if p.alive()}
        finally:
            for proc in procs.values():
                proc.stop()
            backend.stop()
    return result


def _start_contenders(
    contenders, topo: C.Topology, tag: str, procs: dict[str, Proc], result: OverheadResult, log_dir: Path, progress
) -> dict[str, str]:
    """Start every contender that is not already known broken; returns the URL to load each one."""
    urls: dict[str, str] = {}
    for contender in contenders:
        if contender.name in result.missing:
            continue
        if contender.argv(topo, 0) is None:
            urls[contender.name] = topo.decode + C.CHAT_PATH
            continue
        try:
            proc, port = start_server(
                f"{contender.name}-{tag}", lambda p, c=contender: c.argv(topo, p), ROUTER_CORE, log_dir
            )
            procs[contender.name] = proc
            chat = f"http://127.0.0.1:{port}{C.CHAT_PATH}"
            _smoke(contender, chat, topo, topo.decode)
        except Exception as e:  # a contender that cannot run is reported, not fatal
            _give_up(result, contender.name, f"{topo.name}: {_one_line(e)}", progress)
            if contender.name in procs:
                procs.pop(contender.name).stop()
            continue
        urls[contender.name] = chat
        progress(f"  {contender.name} ready ({topo.name})")
    return urls


def _one_line(error: Exception, limit: int = 400) -> str:
    """An error (a process's log tail included) as one Markdown-safe line."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = " | ".join(dict.fromkeys(lines)) or repr(error)
    return text if len(text) <= limit else text[: limit // 3] + " … " + text[-2 * limit // 3 :]


def _give_up(result: OverheadResult, name: str, why: str, progress) -> None:
    result.missing[name] = why
    progress(f"  {name} NOT measured: {why}")


def _measure(topology, images, stream, conc, name, url, proc, backend, bodies, plan, stats_url) -> Cell:
    run_wrk(url, bodies, conc, plan.warmup_seconds, LOAD_CORE)
    before = _backend_stats(stats_url)
    cpu0 = cpu_seconds(proc.pid) if proc else 0.0
    bcpu0 = cpu_seconds(backend.pid)
    load = run_wrk(url, bodies, conc, plan.seconds, LOAD_CORE)
    cpu1 = cpu_seconds(proc.pid) if proc else 0.0
    bcpu1 = cpu_seconds(backend.pid)
    after = _backend_stats(stats_url)
    return Cell(
        topology,
        images,
        stream,
        conc,
        name,
        load,
        router_cpu_s=cpu1 - cpu0,
        backend_cpu_s=bcpu1 - bcpu0,
        encoder_calls=after.get("encoder", 0) - before.get("encoder", 0),
        prefill_calls=after.get("prefill", 0) - before.get("prefill", 0),
    )


# ---- report -----------------------------------------------------------------------------

REFERENCE = ("E+PD", 1, False)  # the scenario the issue's targets and reference figures use
OURS, PROXY = C.EPD_ROUTER.name, C.VLLM_PROXY.name


@dataclass
class TargetMeasures:
    """The three router-overhead target measures of one contender in the reference scenario."""

    added_p50_ms: float | None  # over direct, at the lowest concurrency
    cpu_vs_proxy: list[tuple[int, float]]  # (concurrency, CPU per request / the proxy's)
    rps_vs_proxy: float | None  # at the highest concurrency
    rps: float | None = None
    proxy_rps: float | None = None

    @property
    def worst_cpu_vs_proxy(self) -> float | None:
        return max((r for _, r in self.cpu_vs_proxy), default=None)


def target_measures(result: OverheadResult, name: str) -> TargetMeasures:
    topo, images, stream = REFERENCE
    concs = result.plan.concurrency
    lo, hi = min(concs), max(concs)

    def get(conc: int, who: str) -> Cell | None:
        return result.cell(topo, images, stream, conc, who)

    mine, direct = get(lo, name), get(lo, C.DIRECT.name)
    added = mine.load.p50_ms - direct.load.p50_ms if mine and direct else None
    cpu = [
        (conc, get(conc, name).router_cpu_ms_per_req / get(conc, PROXY).router_cpu_ms_per_req)
        for conc in concs
        if get(conc, name) and get(conc, PROXY) and get(conc, PROXY).router_cpu_ms_per_req > 0
    ]
    mine, proxy = get(hi, name), get(hi, PROXY)
    if mine and proxy and proxy.load.rps:
        return TargetMeasures(added, cpu, mine.load.rps / proxy.load.rps, mine.load.rps, proxy.load.rps)
    return TargetMeasures(added, cpu, None)


def targets(result: OverheadResult) -> list[Target]:
    lo, hi = min(result.plan.concurrency), max(result.plan.concurrency)
    m = target_measures(result, OURS)
    section = "router overhead (E+PD, 1 image, non-streaming)"
    worst = m.worst_cpu_vs_proxy
    return [
        Target(
            section,
            f"added p50 over direct at concurrency {lo}",
            "≤ 0.5 ms",
            f"{m.added_p50_ms:.3f} ms" if m.added_p50_ms is not None else "–",
            None if m.added_p50_ms is None else m.added_p50_ms <= 0.5,
        ),
        Target(
            section,
            "router CPU per request vs vLLM proxy (worst concurrency)",
            "≤ 0.333×",
            ", ".join(f"{r:.2f}× @c={c}" for c, r in m.cpu_vs_proxy) or "–",
            None if worst is None else worst <= 1 / 3,
        ),
        Target(
            section,
            f"throughput vs vLLM proxy at concurrency {hi}",
            "≥ 3×",
            f"{m.rps_vs_proxy:.2f}× ({m.rps:,.0f} vs {m.proxy_rps:,.0f} req/s)" if m.rps_vs_proxy else "–",
            None if m.rps_vs_proxy is None else m.rps_vs_proxy >= 3,
        ),
    ]


def _targets_by_contender(result: OverheadResult) -> str:
    lo, hi = min(result.plan.concurrency), max(result.plan.concurrency)
    rows = []
    for c in C.ALL:
        if c.name in (C.DIRECT.name, PROXY):
            continue
        m = target_measures(result, c.name)
        if m.added_p50_ms is None:
            continue
        rows.append([f"`{c.name}`", m.added_p50_ms, m.worst_cpu_vs_proxy, m.rps_vs_proxy])
    return (
        "The three targets measured on every contender (E+PD, 1 image, non-streaming): how far a router with no "
        "logic gets on each HTTP stack, next to ours. `vllm-router` makes no encoder call, so its row is a reference, "
        "not a like-for-like result.\n\n"
        + table(
            [
                "contender",
                f"added p50 ms @c={lo} (≤ 0.5)",
                "CPU/req ÷ proxy's, worst (≤ 0.333)",
                f"req/s ÷ proxy's @c={hi} (≥ 3)",
            ],
            rows,
        )
    )


def markdown(result: OverheadResult) -> str:
    parts = []
    if result.missing:
        parts.append("**Not measured:**\n" + "\n".join(f"- `{n}`: {why}" for n, why in result.missing.items()))
    by_scenario: dict[tuple, list[Cell]] = {}
    for c in result.cells:
        by_scenario.setdefault((c.topology, c.images, c.stream, c.concurrency), []).append(c)
    rows = []
    for (topo, images, stream, conc), cells in by_scenario.items():
        direct = next((c for c in cells if c.contender == C.DIRECT.name), None)
        for c in cells:
            added = c.load.p50_ms - direct.load.p50_ms if direct and c is not direct else None
            rows.append(
                [
                    topo,
                    images,
                    "yes" if stream else "no",
                    conc,
                    f"`{c.contender}`",
                    c.load.rps,
                    c.load.p50_ms,
                    c.load.p99_ms,
                    added,
                    c.router_cpu_ms_per_req if c.contender != C.DIRECT.name else None,
                    c.encoder_calls / max(1, c.load.requests),
                    c.prefill_calls / max(1, c.load.requests),
                    f"{100 * c.load_core_busy:.0f}%",
                    c.load.loadgen_cpu_s,
                    c.load.failed,
                ]
            )
    parts.append(
        table(
            [
                "topology",
                "images",
                "stream",
                "conc",
                "contender",
                "req/s",
                "p50 ms",
                "p99 ms",
                "added p50 ms",
                "router CPU s /1000 req",
                "E calls/req",
                "P calls/req",
                "load core busy",
                "wrk CPU s",
                "failed",
            ],
            rows,
        )
    )
    parts.append(
        "Ours vs vLLM's proxy, per scenario (ratios; lower CPU and added latency are better):\n\n"
        + table(
            [
                "topology",
                "images",
                "stream",
                "conc",
                "added p50 ours / proxy (ms)",
                "CPU per req ours/proxy",
                "req/s ours/proxy",
                "CPU per req aiohttp-floor/proxy",
                "CPU per req raw-floor/proxy",
            ],
            [
                [
                    t,
                    i,
                    "yes" if s else "no",
                    n,
                    f"{_added(result, t, i, s, n, OURS):.2f} / {_added(result, t, i, s, n, PROXY):.2f}",
                    _ratio(result, t, i, s, n, "router_cpu_ms_per_req"),
                    _ratio(result, t, i, s, n, "rps"),
                    _ratio(result, t, i, s, n, "router_cpu_ms_per_req", C.AIOHTTP_FLOOR.name),
                    _ratio(result, t, i, s, n, "router_cpu_ms_per_req", C.RAW_FLOOR.name),
                ]
                for (t, i, s, n) in by_scenario
                if result.cell(t, i, s, n, OURS)
                and result.cell(t, i, s, n, PROXY)
                and result.cell(t, i, s, n, C.DIRECT.name)
            ],
        )
    )
    parts.append(_targets_by_contender(result))
    parts.append(_reference_check(result))
    rss_rows = [[topo, f"`{name}`", mib] for topo, per in result.peak_rss_mib.items() for name, mib in per.items()]
    parts.append(
        "Peak RSS of each router process tree (VmHWM, after all its cells):\n\n"
        + table(["topology", "router", "peak RSS MiB"], rss_rows)
    )
    return "\n\n".join(parts)


def _added(result, t, i, s, n, name) -> float:
    return result.cell(t, i, s, n, name).load.p50_ms - result.cell(t, i, s, n, C.DIRECT.name).load.p50_ms


def _ratio(result, t, i, s, n, metric: str, name: str = OURS) -> float:
    a, b = result.cell(t, i, s, n, name), result.cell(t, i, s, n, PROXY)
    if a is None:
        return float("nan")
    value = (lambda c: c.load.rps) if metric == "rps" else (lambda c: c.router_cpu_ms_per_req)
    return value(a) / value(b) if value(b) else float("nan")


# The issue's figures from one earlier run (E+PD, 1 image): a sanity check that this machine
# and these backends put the known contenders where that run did.
ISSUE_FIGURES = {
    PROXY: {"added_p50_c1": 0.93, "cpu_ms": 0.71, "max_rps": 1400},
    C.VLLM_ROUTER.name: {"added_p50_c1": 0.22, "cpu_ms": 0.08, "max_rps": None},
}


def _reference_check(result: OverheadResult) -> str:
    topo, images, stream = REFERENCE
    lo, hi = min(result.plan.concurrency), max(result.plan.concurrency)
    direct = result.cell(topo, images, stream, lo, C.DIRECT.name)
    rows = []
    for name in (PROXY, C.VLLM_PROXY_QUIET.name, C.VLLM_ROUTER.name, OURS, C.AIOHTTP_FLOOR.name, C.RAW_FLOOR.name):
        c1, chi = result.cell(topo, images, stream, lo, name), result.cell(topo, images, stream, hi, name)
        if not (c1 and chi and direct):
            continue
        ref = ISSUE_FIGURES.get(name, {})
        rows.append(
            [
                f"`{name}`",
                c1.load.p50_ms - direct.load.p50_ms,
                ref.get("added_p50_c1"),
                c1.router_cpu_ms_per_req,
                chi.router_cpu_ms_per_req,
                ref.get("cpu_ms"),
                chi.load.rps,
                ref.get("max_rps"),
            ]
        )
    return (
        "This run next to the issue's reference figures (E+PD, 1 image, non-streaming; the issue does not say at "
        "which concurrency its CPU figure was taken):\n\n"
        + table(
            [
                "router",
                f"added p50 ms @c={lo}",
                "issue",
                f"CPU ms/req @c={lo}",
                f"CPU ms/req @c={hi}",
                "issue",
                f"req/s @c={hi}",
                "issue",
            ],
            rows,
        )
    )
