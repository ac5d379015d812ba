"""Router overhead with tracing off and on (`python -m bench.run --only tracing [--quick]`).

The same harness as the overhead section (bench/overhead.py: fake backends, wrk, the router
pinned to its own core, contenders interleaved cell by cell), with three epd-router builds of
one command line: tracing off (the default), tracing on with every request sampled, and tracing
on with none sampled (spans are still made and traceparents still sent, nothing is exported).
The OTLP endpoint is a sink in this process that answers every export with 200 and counts them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import contenders as C
from . import overhead
from .report import Target, table

FULL = overhead.Plan(topologies=("E+PD", "E/P/D"), images=(1,), streaming=(False, True), concurrency=(1, 16, 64))
QUICK = overhead.Plan(topologies=("E+PD",), images=(1,), streaming=(False,), concurrency=(1, 64), seconds=1)
OFF = C.EPD_ROUTER.name


@dataclass(frozen=True)
class TracedEpdRouter(C.EpdRouter):
    endpoint: str = ""
    sample_ratio: float = 1.0

    def argv(self, topo: C.Topology, port: int) -> list[str]:
        return [
            *super().argv(topo, port),
            "--otlp-traces-endpoint",
            self.endpoint,
            "--trace-sample-ratio",
            str(self.sample_ratio),
        ]


class _Sink(BaseHTTPRequestHandler):
    exports = 0
    received = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        self.rfile.read(length)
        type(self).exports += 1
        type(self).received += length
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def run(quick: bool, log_dir: Path, progress=print) -> tuple[list[Target], str]:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    traced = TracedEpdRouter(
        "epd-router-traced",
        calls_encoder=True,
        note="tracing on, every request sampled",
        endpoint=endpoint,
        sample_ratio=1.0,
    )
    unsampled = TracedEpdRouter(
        "epd-router-unsampled",
        calls_encoder=True,
        note="tracing on, no request sampled",
        endpoint=endpoint,
        sample_ratio=0.0,
    )
    plan = QUICK if quick else FULL
    try:
        result = overhead.run(plan, (C.DIRECT, C.EPD_ROUTER, traced, unsampled), log_dir, progress)
    finally:
        sink.shutdown()
    return [], markdown(result, (traced.name, unsampled.name), _Sink.exports, _Sink.received)


def markdown(result: overhead.OverheadResult, traced: tuple[str, ...], exports: int, received: int) -> str:
    rows = []
    for cell in result.cells:
        if cell.contender not in traced:
            continue
        off = result.cell(cell.topology, cell.images, cell.stream, cell.concurrency, OFF)
        if off is None:
            continue
        rows.append(
            [
                cell.topology,
                "yes" if cell.stream else "no",
                cell.concurrency,
                f"`{cell.contender}`",
                off.router_cpu_ms_per_req,
                cell.router_cpu_ms_per_req,
                cell.router_cpu_ms_per_req / off.router_cpu_ms_per_req if off.router_cpu_ms_per_req else None,
                off.load.p50_ms,
                cell.load.p50_ms,
                off.load.rps,
                cell.load.rps,
            ]
        )
    parts = [
        "epd-router with tracing off (`epd-router`, the default) and on, on the overhead section's harness; the "
        f"OTLP endpoint is a sink in the harness ({exports} exports, {received / 1e6:.1f} MB received). Tracing off "
        "imports nothing of OpenTelemetry and adds one `is None` test per stage to a request.",
        table(
            [
                "topology",
                "stream",
                "conc",
                "tracing on",
                "CPU ms/req off",
                "CPU ms/req on",
                "on ÷ off",
                "p50 ms off",
                "p50 ms on",
                "req/s off",
                "req/s on",
            ],
            rows,
        ),
        "Every cell:\n\n"
        + table(
            ["topology", "stream", "conc", "contender", "req/s", "p50 ms", "p99 ms", "router CPU ms/req", "failed"],
            [
                [
                    c.topology,
                    "yes" if c.stream else "no",
                    c.concurrency,
                    f"`{c.contender}`",
                    c.load.rps,
                    c.load.p50_ms,
                    c.load.p99_ms,
                    c.router_cpu_ms_per_req if c.contender != C.DIRECT.name else None,
                    c.load.failed,
                ]
                for c in result.cells
            ],
        ),
    ]
    if result.missing:
        parts.insert(0, "**Not measured:**\n" + "\n".join(f"- `{n}`: {why}" for n, why in result.missing.items()))
    return "\n\n".join(parts)
