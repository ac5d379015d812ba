"""Traces: the real `epd-router` process exports its spans over OTLP/HTTP to an in-test receiver,
and every scripted vLLM backend receives a traceparent naming the span of its own call."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import orjson

from dev.ports import free_port
from tests.support.fake_vllm import FakeVLLM
from tests.support.otlp_receiver import OTLPReceiver, ReceivedSpan
from tests.support.router_stack import router_argv, router_stack

CHAT = "/v1/chat/completions"
CHAT_SPAN = "POST /v1/chat/completions"
IMG = {"type": "image_url", "image_url": {"url": "https://img/a.png"}}
REQUEST = {
    "model": "fake-model",
    "max_tokens": 4,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, IMG]}],
}


@asynccontextmanager
async def fakes(*roles: str):
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(FakeVLLM(role, f"{role}{i}")) for i, role in enumerate(roles)]


@asynccontextmanager
async def receiver():
    rx = OTLPReceiver()
    await rx.start()
    try:
        yield rx
    finally:
        await rx.stop()


@asynccontextmanager
async def router_process(*args: str):
    """`python -m epd_operator.router.main` on a free port; stopped with SIGTERM (which exports
    the spans still queued). Spans are also exported every 50 ms while it runs."""
    port = free_port()
    env = {**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    proc = await asyncio.create_subprocess_exec(
        *router_argv(port, "--health-interval", "0", "--log-level", "warning", *args),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                if proc.returncode is not None:
                    break
                try:
                    async with session.get(url + "/livez") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the router did not answer /livez within 30 s")
        stderr = await proc.stderr.read() if proc.returncode is not None and proc.stderr else b""
        assert proc.returncode is None, f"the router exited: {stderr.decode()[-2000:]}"
        yield url
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def post(url: str, doc: dict, headers: dict | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + CHAT, data=orjson.dumps(doc), headers=headers) as r,
    ):
        return r.status, await r.read()


def traceparent(fake: FakeVLLM, index: int = 0) -> tuple[str, str, str]:
    """(trace id, parent span id, flags) from what the fake received."""
    header = fake.received[index].headers.get("traceparent")
    assert header, f"{fake.name} received no traceparent: {dict(fake.received[index].headers)}"
    version, trace_id, span_id, flags = header.split("-")
    assert version == "00"
    return trace_id, span_id, flags


def tree(rx: OTLPReceiver, stages: set[str]) -> tuple[ReceivedSpan, dict[str, list[ReceivedSpan]]]:
    """The one request span and its children by name; checks parentage and the trace id."""
    [server] = [s for s in rx.spans if s.name == CHAT_SPAN]
    assert server.kind == "server" and server.service == "epd-router"
    children: dict[str, list[ReceivedSpan]] = {}
    for span in rx.trace(server.trace_id):
        if span is not server:
            assert span.parent_id == server.span_id, f"{span.name} is not a child of the request span"
            assert span.kind == "client"
            children.setdefault(span.name, []).append(span)
    assert set(children) == stages, f"children {sorted(children)}, expected {sorted(stages)}"
    assert len(rx.spans) == 1 + sum(len(v) for v in children.values()), "spans outside the request's trace"
    return server, children


def joined(fake: FakeVLLM, span: ReceivedSpan, index: int = 0) -> None:
    trace_id, parent, flags = traceparent(fake, index)
    assert (trace_id, parent) == (span.trace_id, span.span_id), f"{fake.name}'s traceparent is not its {span.name} span"
    assert int(flags, 16) & 1, f"{fake.name} was told the request is not sampled ({flags})"


async def test_an_e_pd_request_is_one_trace_with_encode_and_decode_spans_the_backends_join():
    async with fakes("encoder", "pd") as (enc, pd), receiver() as rx:
        async with router_process(
            "--encode-servers-urls", enc.url, "--decode-servers-urls", pd.url, "--otlp-traces-endpoint", rx.url
        ) as url:
            status, _ = await post(url, REQUEST)
            assert status == 200
            await rx.wait_for(lambda spans: len(spans) >= 3, "E+PD request trace")
        server, children = tree(rx, {"encode", "decode"})
        assert server.parent_id == ""
        assert server.attributes["http.response.status_code"] == 200
        assert server.attributes["gen_ai.request.model"] == "fake-model"
        assert server.attributes["gen_ai.operation.name"] == "chat"
        assert server.attributes["epd.media_items"] == 1
        [encode], [decode] = children["encode"], children["decode"]
        assert encode.attributes["url.full"] == enc.url + CHAT and encode.attributes["epd.items"] == 1
        assert decode.attributes["http.response.status_code"] == 200
        assert decode.attributes["server.port"] == int(pd.url.rsplit(":", 1)[1])
        joined(enc, encode)
        joined(pd, decode)


async def test_an_e_p_d_request_has_encode_prefill_and_decode_spans_under_the_clients_trace():
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with fakes("encoder", "prefill", "decode") as (enc, pre, dec), receiver() as rx:
        async with router_process(
            "--encode-servers-urls",
            enc.url,
            "--prefill-servers-urls",
            pre.url,
            "--decode-servers-urls",
            dec.url,
            "--otlp-traces-endpoint",
            rx.url,
        ) as url:
            status, _ = await post(url, REQUEST, {"traceparent": f"00-{client_trace}-{client_span}-01"})
            assert status == 200
            await rx.wait_for(lambda spans: len(spans) >= 4, "E/P/D request trace")
        server, children = tree(rx, {"encode", "prefill", "decode"})
        assert (server.trace_id, server.parent_id) == (client_trace, client_span), (
            "the client's traceparent was not continued"
        )
        for fake, stage in ((enc, "encode"), (pre, "prefill"), (dec, "decode")):
            [span] = children[stage]
            joined(fake, span)


async def test_a_retry_is_an_event_and_each_attempt_a_span():
    async with fakes("encoder", "pd") as (enc, pd), receiver() as rx:
        # The first attempt (metadata-only) gets a 500; the retry, with the media, goes to the same
        # instance (it is alone) and is answered.
        pd.knobs.fail_next = 1
        async with router_process(
            "--encode-servers-urls", enc.url, "--decode-servers-urls", pd.url, "--otlp-traces-endpoint", rx.url
        ) as url:
            status, _ = await post(url, REQUEST)
            assert status == 200
            await rx.wait_for(lambda spans: len(spans) >= 4, "trace with a retried decode")
        server, children = tree(rx, {"encode", "decode"})
        assert ("retry", {"epd.stage": "decode", "epd.reason": "metadata_rejected"}) in server.events
        failed, answered = children["decode"]
        assert failed.status_code == 2 and failed.attributes["http.response.status_code"] == 500
        assert answered.status_code != 2 and answered.attributes["http.response.status_code"] == 200
        joined(pd, failed, 0)
        joined(pd, answered, 1)


async def test_unsampled_requests_export_nothing_and_tell_the_backends_so():
    async with fakes("encoder", "pd") as (enc, pd), receiver() as rx:
        async with router_process(
            "--encode-servers-urls",
            enc.url,
            "--decode-servers-urls",
            pd.url,
            "--otlp-traces-endpoint",
            rx.url,
            "--trace-sample-ratio",
            "0",
        ) as url:
            status, _ = await post(url, REQUEST)
            assert status == 200
        # The router has exited, so its exporter has flushed: nothing was sent.
        assert rx.spans == []
        assert not int(traceparent(pd)[2], 16) & 1, "the backend must see the request is not sampled"


async def test_tracing_off_sends_no_traceparent_and_builds_no_tracer():
    async with router_stack(encoders=1) as s:
        assert s.router.tracing is None
        r = await s.post(CHAT, REQUEST)
        assert r.status == 200
        for fake in s.all_backends():
            assert all("traceparent" not in rec.headers for rec in fake.received), f"{fake.name} got a traceparent"


def test_the_router_refuses_the_endpoint_clearly_without_the_opentelemetry_packages():
    code = (
        "import sys; sys.modules['opentelemetry.sdk.trace'] = None\n"
        "from epd_operator.router.main import main\n"
        "main(['--decode-servers-urls', 'http://127.0.0.1:1', '--otlp-traces-endpoint', 'http://127.0.0.1:1/v1/traces'])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert (
        "--otlp-traces-endpoint needs the OpenTelemetry SDK" in proc.stderr and "epd-operator[tracing]" in proc.stderr
    ), proc.stderr


def test_the_endpoint_must_be_an_otlp_http_url():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "epd_operator.router.main",
            "--decode-servers-urls",
            "http://127.0.0.1:1",
            "--otlp-traces-endpoint",
            "collector:4317",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "--otlp-traces-endpoint must be an http(s) URL" in proc.stderr, proc.stderr


def test_with_tracing_off_nothing_of_opentelemetry_is_even_imported():
    code = (
        "import asyncio, sys\n"
        "from epd_operator.router.config import RouterConfig\n"
        "from epd_operator.router.main import listening_socket\n"
        "from epd_operator.router.server import Router\n"
        "async def main():\n"
        "    router = Router(RouterConfig(decode_urls=['http://127.0.0.1:1'], health_interval=0))\n"
        "    server = await router.serve(listening_socket('127.0.0.1', 0))\n"
        "    await server.cleanup()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"imported with tracing off: {proc.stdout}"


async def test_an_encoder_that_keeps_failing_shows_its_retry_and_the_fallback_to_raw_media():
    async with receiver() as rx:
        async with router_stack(encoders=1, otlp_traces_endpoint=rx.url) as s:
            s.encoders[0].knobs.fail_always = True  # the PD instance then encodes the image itself
            r = await s.post(CHAT, REQUEST)
            assert r.status == 200
        # The router has stopped: its exporter flushed everything.
        server, children = tree(rx, {"encode", "decode"})
        assert len(children["encode"]) == 2, "the first encoder call and its retry"
        assert all(span.status_code == 2 and span.attributes["error.type"] == "status" for span in children["encode"])
        assert ("retry", {"epd.stage": "encode", "epd.reason": "encoder_failed", "epd.items": 1}) in server.events
        assert ("encoder_fallback", {"epd.items": 1}) in server.events
        assert server.attributes["epd.media_items"] == 1 and server.status_code != 2
