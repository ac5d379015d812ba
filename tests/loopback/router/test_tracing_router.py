"""A traced router in process: the encoder stage's spans (one client span per encoder call, with its item
count) and the spill-over event on the request's span, read from an in-memory exporter beside the OTLP one
(which posts to a loopback sink that accepts everything)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.support.router_stack import router_stack

CHAT = "/v1/chat/completions"


def chat(*urls: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, *parts]}]}


def recording(router) -> InMemorySpanExporter:
    spans = InMemorySpanExporter()
    assert router.tracing is not None
    router.tracing.provider.add_span_processor(SimpleSpanProcessor(spans))
    return spans


async def test_each_encoder_call_is_a_client_span_naming_its_items(sink):
    async with router_stack(encoders=1, otlp_traces_endpoint=sink, trace_sample_ratio=1.0) as s:
        spans = recording(s.router)
        assert (await s.post(CHAT, chat("https://img/a.png", "https://img/b.png"))).status == 200
        calls = [x for x in spans.get_finished_spans() if x.kind is SpanKind.CLIENT]
        encode = [x for x in calls if (x.attributes or {}).get("epd.stage") == "encode"]
        assert [(x.attributes or {})["epd.items"] for x in encode] == [2]  # both items in one call to the one encoder


async def test_a_spill_is_an_event_of_the_requests_span_with_its_reason_and_items(sink):
    async with router_stack(
        encoders=1, spill_encoder_inflight=1, otlp_traces_endpoint=sink, trace_sample_ratio=1.0
    ) as s:
        spans = recording(s.router)
        s.encoders[0].knobs.delay = 0.5
        busy = asyncio.create_task(s.post(CHAT, chat("https://img/a.png")))
        async with asyncio.timeout(5):
            while not all(ep.inflight for ep in s.router.encoders.endpoints.values()):
                await asyncio.sleep(0.01)
        assert (await s.post(CHAT, chat("https://img/c.png", "https://img/d.png"))).status == 200
        assert (await busy).status == 200
        events = [e for x in spans.get_finished_spans() for e in x.events if e.name == "encoder_spill"]
        assert [dict(e.attributes or {}) for e in events] == [{"epd.reason": "encoders_busy", "epd.items": 2}]


def server_span(spans: InMemorySpanExporter):
    (span,) = [x for x in spans.get_finished_spans() if x.kind is SpanKind.SERVER]
    return span, dict(span.attributes or {})


async def test_the_requests_span_names_its_route_and_model(sink):
    async with router_stack(encoders=0, otlp_traces_endpoint=sink, trace_sample_ratio=1.0) as s:
        spans = recording(s.router)
        assert (await s.post(CHAT, chat())).status == 200
        span, attributes = server_span(spans)
        assert span.name == f"POST {CHAT}"
        assert (attributes["http.route"], attributes["gen_ai.request.model"]) == (CHAT, "m")
        assert attributes["http.response.status_code"] == 200


async def test_a_refused_request_ends_its_span_with_the_status_it_got(sink):
    async with router_stack(encoders=0, otlp_traces_endpoint=sink, trace_sample_ratio=1.0) as s:
        spans = recording(s.router)
        refused = {**chat(), "messages": []}
        assert (await s.post(CHAT, refused)).status == 400
        _, attributes = server_span(spans)
        assert (attributes["http.route"], attributes["http.response.status_code"]) == (CHAT, 400)
        assert attributes["gen_ai.request.model"] == "m"  # read before the body was judged


async def test_a_client_that_leaves_is_a_499_on_its_route_and_its_span(sink):
    async with router_stack(encoders=0, otlp_traces_endpoint=sink, trace_sample_ratio=1.0) as s:
        spans = recording(s.router)
        s.decodes[0].knobs.delay = 30
        asked = asyncio.create_task(s.post(CHAT, chat()))
        async with asyncio.timeout(5):
            while not s.decodes[0].received:
                await asyncio.sleep(0.01)
            asked.cancel()
            while not spans.get_finished_spans():
                await asyncio.sleep(0.01)
        _, attributes = server_span(spans)
        assert (attributes["http.response.status_code"], attributes["error.type"]) == (499, "client_closed")
        counted = s.router.metrics.registry.get_sample_value(
            "epd_router_requests_total", {"route": CHAT, "status": "499"}
        )
        assert counted == 1


async def test_a_router_error_is_a_500_whose_span_says_so(sink):
    async with router_stack(encoders=0, otlp_traces_endpoint=sink, trace_sample_ratio=1.0) as s:
        spans = recording(s.router)

        async def broken(ctx):
            raise RuntimeError("a bug")

        s.router.pipeline.run = broken
        assert (await s.post(CHAT, chat())).status == 500
        span, attributes = server_span(spans)
        assert (attributes["http.response.status_code"], attributes["error.type"]) == (500, "router_error")
        assert span.status.description == "router_error"


async def test_a_sample_ratio_of_zero_records_no_request(sink):
    async with router_stack(encoders=0, otlp_traces_endpoint=sink, trace_sample_ratio=0.0) as s:
        spans = recording(s.router)
        assert (await s.post(CHAT, chat())).status == 200
        assert spans.get_finished_spans() == ()
