"""The router's raw HTTP/1.1 server: keep-alive, pipelining, request framing, limits, streaming,
and the router behind it when a backend breaks a reply."""

import asyncio
from contextlib import asynccontextmanager

import orjson
import pytest

from epd_operator.router.config import RouterConfig
from epd_operator.router.http_server import Limits, Response, StreamResponse, start_server
from epd_operator.router.server import Router
from tests.loopback.router.test_upstream import ok, scripted_backend
from tests.support.fake_vllm import FakeVLLM
from tests.support.router_stack import serve_router

CHAT = "/v1/chat/completions"


async def echo(request):
    if request.path == "/stream":
        out = StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for piece in (b"data: 1\n\n", b"data: 2\n\n"):
            await out.write(piece)
        await out.write_eof()
        return out
    body = await request.read()
    return Response(
        body=request.method.encode() + b" " + request.path.encode() + b" " + body,
        headers={"X-Seen": request.headers.get("x-seen", "")},
    )


@asynccontextmanager
async def echo_server(max_body: int = 1024, limits: Limits | None = None):
    server = await start_server(echo, max_body, host="127.0.0.1", port=0, limits=limits)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        server.close()


async def read_response(reader) -> tuple[bytes, bytes]:
    """(head, body) of one Content-Length or chunked response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return head, body
            body += data[:-2]
    length = int(lower.split(b"content-length: ")[1].split(b"\r\n")[0])
    return head, await reader.readexactly(length)


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


async def test_keep_alive_and_pipelined_requests_are_answered_in_order():
    async with echo_server() as (reader, writer):
        writer.write(post("/a", b"one", b"X-Seen: yes\r\n"))
        head, body = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 200 OK") and b"X-Seen: yes" in head and body == b"POST /a one"
        writer.write(post("/b", b"two") + post("/c?q=1", b"three"))
        assert (await read_response(reader))[1] == b"POST /b two"
        assert (await read_response(reader))[1] == b"POST /c three"


async def test_a_chunked_request_body_is_reassembled():
    async with echo_server() as (reader, writer):
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await asyncio.sleep(0.01)
        writer.write(b"2;ext=1\r\nde\r\n0\r\n\r\n")
        assert (await read_response(reader))[1] == b"POST /a abcde"


async def test_expect_100_continue_is_answered_before_the_body():
    async with echo_server() as (reader, writer):
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hi")
        assert (await read_response(reader))[1] == b"POST /a hi"


async def test_an_oversized_body_is_refused_by_the_handler_and_the_connection_closed():
    async def limited(request):
        try:
            await request.read()
        except Exception as exc:
            return Response(body=type(exc).__name__.encode(), status=413)
        return Response(body=b"read")

    server = await start_server(limited, 10, host="127.0.0.1", port=0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    try:
        writer.write(post("/a", b"x" * 11))
        head, body = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 413") and b"Connection: close" in head and body == b"BodyTooLarge"
        assert await reader.read() == b""
    finally:
        writer.close()
        server.close()


async def test_a_malformed_request_gets_400_and_a_closed_connection():
    async with echo_server() as (reader, writer):
        writer.write(b"NONSENSE\r\n\r\n")
        head, body = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 400") and b"malformed request" in body
        assert await reader.read() == b""


async def test_streams_are_chunked_for_http11_and_until_close_for_http10():
    async with echo_server() as (reader, writer):
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await read_response(reader)
        assert b"Transfer-Encoding: chunked" in head and body == b"data: 1\n\ndata: 2\n\n"
        writer.write(b"GET /stream HTTP/1.0\r\n\r\n")
        raw = await reader.read()
        assert raw.startswith(b"HTTP/1.1 200 OK") and raw.endswith(b"\r\n\r\ndata: 1\n\ndata: 2\n\n")


async def test_http10_closes_after_the_reply_unless_kept_alive():
    async with echo_server() as (reader, writer):
        writer.write(b"POST /a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n1")
        head, _ = await read_response(reader)
        assert b"Connection: keep-alive" in head
        writer.write(b"POST /a HTTP/1.0\r\nContent-Length: 1\r\n\r\n2")
        head, body = await read_response(reader)
        assert b"Connection: close" in head and body == b"POST /a 2"
        assert await reader.read() == b""


async def test_unknown_routes_and_methods_get_json_errors():
    async with FakeVLLM("pd") as pd:
        server, url = await serve_router(Router(RouterConfig(decode_urls=[pd.url], health_interval=0)))
        try:
            host, port = url[7:].split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 404")
            assert orjson.loads(body)["error"] == {
                "message": "no route /nope",
                "type": "invalid_request_error",
                "param": None,
                "code": 404,
            }
            head, body = await read_response(reader)
            assert head.startswith(b"HTTP/1.1 405")
            error = orjson.loads(body)["error"]
            assert (error["message"], error["code"]) == ("method GET not allowed on /v1/chat/completions", 405)
            writer.close()
        finally:
            await server.cleanup()


@asynccontextmanager
async def router_over(decode_url: str):
    server, url = await serve_router(Router(RouterConfig(decode_urls=[decode_url], health_interval=0)))
    host, port = url[7:].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield server.router, reader, writer
    finally:
        writer.close()
        await server.cleanup()


async def half_reply(writer):
    writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"partial')
    await writer.drain()


BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


async def test_a_decode_closing_mid_reply_is_retried_then_answered():
    async with (
        scripted_backend([half_reply, ok(b'{"ok":true}')]) as (decode, seen),
        router_over(decode) as (router, reader, writer),
    ):
        writer.write(post(CHAT, BODY, b"x-request-id: mid-1\r\n"))
        head, body = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b'{"ok":true}' and b"x-request-id: mid-1" in head
        assert len(seen) == 2 and router.decodes.available[0].inflight == 0


async def test_a_decode_closing_mid_reply_twice_is_a_502():
    async with scripted_backend([half_reply]) as (decode, seen), router_over(decode) as (_router, reader, writer):
        writer.write(post(CHAT, BODY))
        head, body = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 502") and "decode failed (read)" in orjson.loads(body)["error"]["message"]
        assert len(seen) == 2


async def test_a_client_leaving_cancels_its_request():
    async with FakeVLLM("pd") as pd:
        pd.knobs.delay = 30
        async with router_over(pd.url) as (router, _reader, writer):
            writer.write(post(CHAT, BODY))
            async with asyncio.timeout(5):
                while not pd.received:
                    await asyncio.sleep(0.01)
            writer.close()
            async with asyncio.timeout(5):
                while pd.cancelled != 1 or router.decodes.available[0].inflight:
                    await asyncio.sleep(0.01)


async def test_a_handler_error_is_a_500_before_the_reply_and_a_cut_connection_during_a_stream():
    async def failing(request):
        if request.path == "/late":
            out = StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            await out.write(b"data: 1\n\n")
        raise RuntimeError("handler bug")

    server = await start_server(failing, 1024, host="127.0.0.1", port=0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    try:
        writer.write(b"GET /early HTTP/1.1\r\nHost: x\r\n\r\n")
        head, body = await read_response(reader)
        assert head.startswith(b"HTTP/1.1 500") and b"internal router error" in body
        writer.write(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = await reader.read()
        assert raw.endswith(b"data: 1\n\n\r\n")  # one chunk, then no last chunk: the client sees a broken stream
    finally:
        writer.close()
        server.close()


async def test_idle_connections_close_but_a_request_still_arriving_is_waited_for():
    async with echo_server(limits=Limits(keepalive=0.3)) as (reader, writer):
        writer.write(b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")
        for byte in (b"w", b"x", b"y", b"z"):  # 0.4 s in all, longer than the limit; each gap well under it
            await asyncio.sleep(0.1)
            writer.write(byte)
        assert (await read_response(reader))[1] == b"POST /a wxyz"
        async with asyncio.timeout(2):
            assert await reader.read() == b""  # then idle: closed


async def test_oversized_bodies_are_refused_without_waiting_for_them():
    async with FakeVLLM("pd") as pd:
        server, url = await serve_router(
            Router(RouterConfig(decode_urls=[pd.url], health_interval=0, max_body_bytes=64))
        )
        try:
            host, port = url[7:].split(":")
            for request in (
                # Announced too large and expecting 100-continue: answered before any body is sent.
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 65\r\nExpect: 100-continue\r\n\r\n",
                # Chunked past the limit.
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n"
                + b"x" * 65
                + b"\r\n",
            ):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(request)
                head, body = await read_response(reader)
                assert head.startswith(b"HTTP/1.1 413") and "exceeds 64 bytes" in orjson.loads(body)["error"]["message"]
                writer.close()
            assert not pd.received
        finally:
            await server.cleanup()


async def test_shutdown_answers_a_request_received_in_part_and_closes_idle_connections():
    server = await start_server(echo, 1024, host="127.0.0.1", port=0)
    address = server.sockets[0].getsockname()[:2]
    busy_reader, busy_writer = await asyncio.open_connection(*address)
    idle_reader, idle_writer = await asyncio.open_connection(*address)
    try:
        busy_writer.write(b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nwx")
        async with asyncio.timeout(5):
            while server.requests_owed() < 1 or len(server.connections) < 2:
                await asyncio.sleep(0.01)
        shutdown = asyncio.create_task(server.shutdown(10))
        async with asyncio.timeout(5):
            assert await idle_reader.read() == b""  # idle: closed at once
            busy_writer.write(b"yz")  # the rest of a request begun before the shutdown
            head, body = await read_response(busy_reader)
            assert body == b"POST /a wxyz" and b"\r\nConnection: close\r\n" in head
            assert await busy_reader.read() == b""
            assert await shutdown == 0  # nothing was cut
        with pytest.raises(ConnectionRefusedError):  # not listening any more
            await asyncio.open_connection(*address)
    finally:
        busy_writer.close()
        idle_writer.close()


async def test_a_client_head_is_cut_at_the_configured_header_timeout():
    async with FakeVLLM("pd") as pd:
        config = RouterConfig(decode_urls=[pd.url], health_interval=0, header_timeout=0.3)
        server, url = await serve_router(Router(config))
        try:
            host, port = url[7:].split(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            answer = await asyncio.wait_for(reader.read(), 3)  # the default would wait 10 s
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408")
            writer.close()
        finally:
            await server.cleanup()
