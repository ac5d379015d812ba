"""router/tracing.py in process: the spans a request makes, their names, kinds, attributes and statuses, read
from an in-memory exporter beside the OTLP one, which posts to a loopback sink (test_tracing.py runs the real
process against an OTLP receiver: its calls are out of mutmut's reach)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from epd_operator import __version__
from epd_operator.router.backends import Endpoint
from epd_operator.router.failures import BackendRejection, RetryableFailure
from epd_operator.router.http_messages import HttpRequest
from epd_operator.router.tracing import Tracing, tracing_available

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"


@pytest.fixture
def traced(sink):
    tracing = Tracing(sink, sample_ratio=0.25, service_name="router-under-test")
    spans = InMemorySpanExporter()
    tracing.provider.add_span_processor(SimpleSpanProcessor(spans))
    yield tracing, spans
    tracing.shutdown()


def request(path: str = "/v1/chat/completions", **headers: str) -> HttpRequest:
    return HttpRequest("POST", path, "", headers, b"{}", connection=None)  # type: ignore[arg-type]


def test_the_sdk_is_there_and_the_provider_names_the_service(traced):
    tracing, _ = traced
    assert tracing_available()
    attributes = tracing.provider.resource.attributes
    assert (attributes["service.name"], attributes["service.version"]) == ("router-under-test", __version__)
    assert tracing.provider.sampler.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.25}")
    default = Tracing("http://127.0.0.1:9/v1/traces")
    assert default.provider.resource.attributes["service.name"] == "epd-router"
    default.shutdown()  # nothing was traced: nothing to export


def test_a_requests_server_span_follows_the_clients_trace(traced):
    tracing, spans = traced
    trace = tracing.start(request(traceparent=TRACEPARENT), "/v1/chat/completions", "rid-1")
    trace.end(200)
    (span,) = spans.get_finished_spans()
    assert (span.name, span.kind) == ("POST /v1/chat/completions", SpanKind.SERVER)
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE  # the client's sampled trace, whatever the ratio
    assert dict(span.attributes) == {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "url.path": "/v1/chat/completions",
        "url.scheme": "http",
        "gen_ai.operation.name": "chat",
        "epd.request_id": "rid-1",
        "http.response.status_code": 200,
    }
    assert span.status.status_code == StatusCode.UNSET
    assert (span.instrumentation_scope.name, span.instrumentation_scope.version) == ("epd_operator.router", __version__)


@pytest.mark.parametrize(("route", "operation"), [("/v1/completions", "text_completion"), ("/v1/models", "/v1/models")])
def test_the_operation_is_the_routes_genai_name(traced, route, operation):
    tracing, spans = traced
    tracing.start(request(route, traceparent=TRACEPARENT), route, "rid").end(200)
    assert spans.get_finished_spans()[0].attributes["gen_ai.operation.name"] == operation


@pytest.mark.parametrize(
    ("status", "error", "kind", "description"),
    [
        (503, None, "503", "HTTP 503"),
        (500, None, "500", "HTTP 500"),
        (200, "client_gone", "client_gone", "client_gone"),
        (499, None, None, None),
    ],
)
def test_a_request_ends_in_error_on_a_5xx_or_a_named_error(traced, status, error, kind, description):
    tracing, spans = traced
    tracing.start(request(traceparent=TRACEPARENT), "/v1/chat/completions", "rid").end(status, error)
    (span,) = spans.get_finished_spans()
    assert span.attributes["http.response.status_code"] == status
    assert span.attributes.get("error.type") == kind
    assert span.status.status_code == (StatusCode.UNSET if kind is None else StatusCode.ERROR)
    assert span.status.description == description


def test_model_media_and_events_land_on_the_server_span(traced):
    tracing, spans = traced
    trace = tracing.start(request(traceparent=TRACEPARENT), "/v1/chat/completions", "rid")
    trace.set_model(["not", "a", "name"])
    assert trace.model is None
    trace.set_model("qwen")
    trace.encoded(3, 3)
    trace.encoded(3, 1)
    trace.event("retry", {"epd.stage": "decode"})
    trace.end(200)
    (span,) = spans.get_finished_spans()
    assert (trace.model, span.attributes["gen_ai.request.model"], span.attributes["epd.media_items"]) == (
        "qwen",
        "qwen",
        3,
    )
    assert [(e.name, dict(e.attributes)) for e in span.events] == [
        ("encoder_fallback", {"epd.items": 2}),
        ("retry", {"epd.stage": "decode"}),
    ]


def calls(traced, error: BaseException | None, *, model: str | None = "qwen", attributes=None):
    tracing, spans = traced
    trace = tracing.start(request(traceparent=TRACEPARENT), "/v1/chat/completions", "rid")
    if model:
        trace.set_model(model)
    ep = Endpoint("https://10.0.0.9:8443/api", "decode", "pd-0")
    refusal = pytest.raises(type(error)) if error else contextlib.nullcontext()
    with refusal, trace.call("decode", ep, "/v1/chat/completions", attributes) as call:
        headers = call.headers
        if error:
            raise error
        call.answered(200)
    trace.end(200)
    call_span, _ = spans.get_finished_spans()
    return call_span, headers


def test_a_backend_call_is_a_client_span_the_backend_joins(traced):
    span, headers = calls(traced, None, attributes={"epd.rank": 1})
    assert (span.name, span.kind, span.status.status_code) == ("decode", SpanKind.CLIENT, StatusCode.UNSET)
    assert dict(span.attributes) == {
        "http.request.method": "POST",
        "server.address": "10.0.0.9",
        "server.port": 8443,
        "url.full": "https://10.0.0.9:8443/api/v1/chat/completions",
        "epd.stage": "decode",
        "epd.rank": 1,
        "gen_ai.request.model": "qwen",
        "http.response.status_code": 200,
    }
    ids = f"{span.context.trace_id:032x}-{span.context.span_id:016x}"
    assert headers == f"traceparent: 00-{ids}-01\r\n".encode()


def test_a_call_without_a_port_or_a_model(traced):
    tracing, spans = traced
    trace = tracing.start(request(traceparent=TRACEPARENT), "/v1/chat/completions", "rid")
    with trace.call("encode", Endpoint("http://encoder", "encoder", "e-0"), "/v1/chat/completions"):
        pass
    trace.end(200)
    span = spans.get_finished_spans()[0]
    assert (span.attributes["server.address"], span.attributes["server.port"]) == ("encoder", 80)
    assert "gen_ai.request.model" not in span.attributes


@pytest.mark.parametrize(
    ("error", "attributes", "description"),
    [
        (
            RetryableFailure("status", "decode", 503),
            {"http.response.status_code": 503, "error.type": "status"},
            "decode failed (status)",
        ),
        (RetryableFailure("timeout", "decode"), {"error.type": "timeout"}, "decode failed (timeout)"),
        (
            BackendRejection(400, b"", "application/json"),
            {"http.response.status_code": 400, "error.type": "400"},
            "refused with 400",
        ),
        (asyncio.CancelledError(), {"error.type": "cancelled"}, "client went away"),
        (OSError("reset by peer"), {"error.type": "OSError"}, "reset by peer"),
    ],
)
def test_a_failed_call_says_how_it_failed(traced, error, attributes, description):
    span, _ = calls(traced, error)
    seen = {k: v for k, v in span.attributes.items() if k in ("http.response.status_code", "error.type")}
    assert seen == attributes
    assert (span.status.status_code, span.status.description) == (StatusCode.ERROR, description)
    events = [(e.name, e.attributes.get("exception.type"), e.attributes.get("exception.message")) for e in span.events]
    assert events == ([("exception", "OSError", "reset by peer")] if isinstance(error, OSError) else [])


def test_a_clients_tracestate_goes_on_to_the_backend_with_its_traceparent(traced):
    tracing, spans = traced
    trace = tracing.start(request(traceparent=TRACEPARENT, tracestate="vendor=abc"), "/v1/chat/completions", "rid")
    with trace.call("decode", Endpoint("http://10.0.0.9:8000", "decode", "pd-0"), "/v1/chat/completions") as call:
        headers = call.headers
    trace.end(200)
    span = spans.get_finished_spans()[0]
    ids = f"{span.context.trace_id:032x}-{span.context.span_id:016x}"
    assert headers == f"traceparent: 00-{ids}-01\r\ntracestate: vendor=abc\r\n".encode()


def test_without_the_sdk_tracing_is_unavailable_and_refused_clearly(monkeypatch):
    import sys

    from epd_operator.router.tracing import MISSING

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # an import of it fails
    assert not tracing_available()
    with pytest.raises(RuntimeError) as refused:
        Tracing("http://127.0.0.1:9/v1/traces")
    assert str(refused.value) == MISSING
