"""The tracing section of the benchmark, without running it: its OTLP sink takes a real exporter's export over HTTP."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from bench import tracing as bench_tracing


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
        sink.server_close()
    assert bench_tracing._Sink.exports == before + 1
