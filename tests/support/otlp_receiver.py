"""An OTLP/HTTP trace receiver for tests: an aiohttp server on 127.0.0.1 that decodes what an
exporter POSTs to /v1/traces (protobuf `ExportTraceServiceRequest`, opentelemetry-proto) into
plain `ReceivedSpan`s, so tests check the span tree a real exporter sent."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

KINDS = {
    Span.SPAN_KIND_SERVER: "server",
    Span.SPAN_KIND_CLIENT: "client",
    Span.SPAN_KIND_INTERNAL: "internal",
    Span.SPAN_KIND_PRODUCER: "producer",
    Span.SPAN_KIND_CONSUMER: "consumer",
}


def _value(v: AnyValue) -> object:
    which = v.WhichOneof("value")
    return None if which is None else getattr(v, which)


@dataclass
class ReceivedSpan:
    service: str
    trace_id: str  # 32 hex digits, as in traceparent
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root span
    name: str
    kind: str
    attributes: dict
    events: list[tuple[str, dict]]
    status_code: int  # 0 unset, 1 ok, 2 error


@dataclass
class OTLPReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    url: str = ""  # the traces endpoint: http://127.0.0.1:PORT/v1/traces

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1/traces"
        return self.url

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _export(self, request: web.Request) -> web.Response:
        data = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        export = ExportTraceServiceRequest.FromString(data)
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            service=str(resource.get("service.name", "")),
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            name=s.name,
                            kind=KINDS.get(s.kind, str(s.kind)),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            events=[(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in s.events],
                            status_code=s.status.code,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def wait_for(self, predicate, what: str, timeout: float = 15.0) -> list[ReceivedSpan]:
        """Spans once `predicate(spans)` holds; fails naming `what` and what did arrive."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate(self.spans):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            got = [(s.name, s.trace_id[:8]) for s in self.spans]
            raise AssertionError(f"no {what} within {timeout} s; received spans: {got}") from None
        return self.spans

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]


@contextmanager
def receiver_in_thread() -> Iterator[OTLPReceiver]:
    """A receiver on its own event loop thread, for synchronous tests (real vLLM e2e)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    rx = OTLPReceiver()
    asyncio.run_coroutine_threadsafe(rx.start(), loop).result(10)
    try:
        yield rx
    finally:
        asyncio.run_coroutine_threadsafe(rx.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def wait_for_spans(rx: OTLPReceiver, predicate, what: str, timeout: float = 60.0) -> list[ReceivedSpan]:
    """`OTLPReceiver.wait_for` for synchronous tests."""
    deadline = time.monotonic() + timeout
    while not predicate(list(rx.spans)):
        if time.monotonic() > deadline:
            got = [(s.service, s.name, s.trace_id[:8]) for s in rx.spans]
            raise AssertionError(f"no {what} within {timeout} s; received spans: {got}")
        time.sleep(0.1)
    return list(rx.spans)
