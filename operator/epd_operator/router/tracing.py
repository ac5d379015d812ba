"""OpenTelemetry traces of the router's requests, exported over OTLP/HTTP (protobuf).

One trace per request: a SERVER span named after the route (`POST /v1/chat/completions`), and
under it a CLIENT span for every backend call (`encode` per encoder call, `prefill`, `decode`,
one more per retry); retries and encoder fallbacks are events on the server span. Every
backend call carries a W3C `traceparent` naming its own span, so the spans vLLM makes with
`--otlp-traces-endpoint` join the trace under it. A client's `traceparent` makes the request's
span a child of the client's.

Off by default. The OpenTelemetry packages are an optional extra (`epd-operator[tracing]`, in
the operator image) and are imported only when tracing is on: with it off the router holds no
tracer, provider or span object, and each request pays one `is None` test per stage.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .. import __version__
from .failures import BackendRejection, RetryableFailure
from .http_messages import LATIN1

if TYPE_CHECKING:
    from .backends import Endpoint
    from .http_messages import HttpRequest

# What vLLM reads from a request (vllm/tracing/utils.py TRACE_HEADERS).
_TRACE_HEADERS = ("traceparent", "tracestate")
# OpenAI routes as GenAI operations (semantic conventions: gen_ai.operation.name).
_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}
MISSING = (
    "--otlp-traces-endpoint needs the OpenTelemetry SDK and its OTLP/HTTP exporter: "
    "pip install 'epd-operator[tracing]' (the operator image has them)"
)


def tracing_available() -> bool:
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


class Tracing:
    """The router process's tracer: built in Router.start only when an OTLP endpoint is set."""

    def __init__(self, endpoint: str, sample_ratio: float = 1.0, service_name: str = "epd-router") -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise RuntimeError(MISSING) from exc
        # A client's sampling decision stands; requests without one are sampled at `sample_ratio`.
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": service_name, "service.version": __version__}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("epd_operator.router", __version__)
        self.propagator = TraceContextTextMapPropagator()
        self.in_context = set_span_in_context
        self.SERVER, self.CLIENT = SpanKind.SERVER, SpanKind.CLIENT
        self.error = lambda description: Status(StatusCode.ERROR, description)

    def start(self, request: HttpRequest, route: str, rid: str) -> RequestTrace:
        headers = request.headers
        carrier = {name: headers[name] for name in _TRACE_HEADERS if name in headers}
        parent = self.propagator.extract(carrier)  # an empty context without the client's headers: a new trace
        span = self.tracer.start_span(
            f"{request.method} {route}",
            context=parent,
            kind=self.SERVER,
            attributes={
                "http.request.method": request.method,
                "http.route": route,
                "url.path": request.path,
                "url.scheme": "http",
                "gen_ai.operation.name": _OPERATIONS.get(route, route),
                "epd.request_id": rid,
            },
        )
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        """Export what is still queued, then stop."""
        self.provider.shutdown()


class RequestTrace:
    """One request's server span; `call` opens a child span for each backend call."""

    __slots__ = ("tracing", "span", "context", "model")

    def __init__(self, tracing: Tracing, span: Any) -> None:
        self.tracing = tracing
        self.span = span
        self.context = tracing.in_context(span)
        self.model: str | None = None

    def set_model(self, model: object) -> None:
        if isinstance(model, str):
            self.model = model
            self.span.set_attribute("gen_ai.request.model", model)

    def event(self, name: str, attributes: dict[str, str | int]) -> None:
        self.span.add_event(name, attributes)

    def encoded(self, items: int, encoded: int) -> None:
        """After the E stage: how many media items went to encoders' output, and how many went raw."""
        self.span.set_attribute("epd.media_items", items)
        if encoded < items:
            self.span.add_event("encoder_fallback", {"epd.items": items - encoded})

    def call(self, stage: str, ep: Endpoint, path: str, attributes: dict[str, str | int] | None = None) -> CallSpan:
        return CallSpan(self, stage, ep, path, attributes or {})

    def end(self, status: int, error: str | None = None) -> None:
        span = self.span
        span.set_attribute("http.response.status_code", status)
        if status >= 500 or error is not None:
            span.set_attribute("error.type", error or str(status))
            span.set_status(self.tracing.error(error or f"HTTP {status}"))
        span.end()


class CallSpan:
    """A backend call's span, used as `with trace.call(...) as call:`; `call.headers` are the
    header lines (traceparent, tracestate) that put the backend's own spans under it."""

    __slots__ = ("span", "headers", "error")

    def __init__(self, trace: RequestTrace, stage: str, ep: Endpoint, path: str, attributes: dict) -> None:
        tracing = trace.tracing
        origin = urlsplit(ep.origin)
        attrs = {
            "http.request.method": "POST",
            "server.address": origin.hostname or "",
            "server.port": origin.port or 80,
            "url.full": ep.origin + ep.prefix + path,
            "epd.stage": stage,
            **attributes,
        }
        if trace.model is not None:
            attrs["gen_ai.request.model"] = trace.model
        self.span = tracing.tracer.start_span(stage, context=trace.context, kind=tracing.CLIENT, attributes=attrs)
        carrier: dict[str, str] = {}
        tracing.propagator.inject(carrier, context=tracing.in_context(self.span))
        self.headers = "".join(f"{name}: {value}\r\n" for name, value in carrier.items()).encode(LATIN1)
        self.error = tracing.error

    def __enter__(self) -> CallSpan:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        span = self.span
        if isinstance(exc, RetryableFailure):
            if exc.kind == "status":
                span.set_attribute("http.response.status_code", exc.status)
            span.set_attribute("error.type", exc.kind)
            span.set_status(self.error(f"{exc.role} failed ({exc.kind})"))
        elif isinstance(exc, BackendRejection):
            span.set_attribute("http.response.status_code", exc.status)
            span.set_attribute("error.type", str(exc.status))
            span.set_status(self.error(f"refused with {exc.status}"))
        elif isinstance(exc, asyncio.CancelledError):
            span.set_attribute("error.type", "cancelled")
            span.set_status(self.error("client went away"))
        elif exc is not None:
            span.record_exception(exc)
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(self.error(str(exc)))
        span.end()

    def answered(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
