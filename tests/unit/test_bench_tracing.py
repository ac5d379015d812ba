"""The tracing section of the benchmark, without running it: its traced router's command line is
one epd-router accepts, and its OTLP sink takes a real exporter's export."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from bench import contenders as C
from bench import tracing as bench_tracing
from epd_operator.router.main import build_parser, config_from_args


def test_the_traced_contender_is_a_command_line_the_router_accepts():
    topo = C.Topology("E/P/D", encoder="http://127.0.0.1:1", decode="http://127.0.0.1:3", prefill="http://127.0.0.1:2")
    traced = bench_tracing.TracedEpdRouter(
        "t", calls_encoder=True, endpoint="http://127.0.0.1:4/v1/traces", sample_ratio=0.0
    )
    argv = traced.argv(topo, 8000)
    cfg = config_from_args(build_parser().parse_args(argv[1:]))
    assert (cfg.otlp_traces_endpoint, cfg.trace_sample_ratio) == ("http://127.0.0.1:4/v1/traces", 0.0)
    assert cfg.prefill_urls == [topo.prefill] and cfg.workers == 1


def test_the_sink_answers_a_real_otlp_export():
    sink = ThreadingHTTPServer(("127.0.0.1", 0), bench_tracing._Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    before = bench_tracing._Sink.exports
    try:
        provider = TracerProvider()
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{sink.server_address[1]}/v1/traces", timeout=5)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.get_tracer("bench").start_span("request").end()  # exported at once, and it must succeed
        provider.shutdown()
    finally:
        sink.shutdown()
    assert bench_tracing._Sink.exports == before + 1
