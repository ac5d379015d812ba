"""The router's raw HTTP/1.1 backend client: framing, keep-alive, broken replies, timeouts."""

import asyncio
from contextlib import asynccontextmanager

import pytest

from epd_operator.router.upstream import TransportError, Upstream

JSON_HEADERS = b"Content-Type: application/json\r\nx-request-id: r1\r\n"


@asynccontextmanager
async def scripted_backend(replies):
    """A backend answering each request on a connection with the next `replies` item: bytes to
    send, or a callable(writer) coroutine. Records (connection number, request head, body)."""
    seen = []
    conns = 0

    async def serve(reader, writer):
        nonlocal conns
        conns += 1
        me = conns
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                seen.append((me, head, body))
                reply = replies[len(seen) - 1] if len(seen) <= len(replies) else replies[-1]
                if callable(reply):
                    await reply(writer)
                    return
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"7\r\ndata: a\r\n"
    b"9;ext=1\r\n\n\ndata: b\r\n"
    b"0\r\nX-Trailer: t\r\n\r\n"
)


async def test_a_content_length_reply_is_read_and_the_connection_reused():
    async with scripted_backend([ok(b'{"a":1}'), ok(b'{"b":2}')]) as (url, seen):
        up = Upstream()
        for expected in (b'{"a":1}', b'{"b":2}'):
            r = await up.request(url, "POST", "/v1/chat/completions", JSON_HEADERS, b'{"q":1}')
            assert (r.status, r.content_type, await r.read()) == (200, "application/json", expected)
            r.release()
        assert [conn for conn, _, _ in seen] == [1, 1]
        head = seen[0][1].decode()
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert "x-request-id: r1" in head and "Content-Length: 7" in head and f"Host: {url[7:]}" in head
        assert seen[0][2] == b'{"q":1}'
        await up.close()


async def test_a_chunked_reply_is_read_whole_or_streamed_without_framing():
    async with scripted_backend([CHUNKED, CHUNKED, ok(b"{}")]) as (url, seen):
        up = Upstream()
        r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
        assert await r.read() == b"data: a\n\ndata: b"
        r.release()
        r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
        assert b"".join([piece async for piece in r.iter_body()]) == b"data: a\n\ndata: b"
        r.release()
        r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
        assert await r.read() == b"{}"
        r.release()
        assert {conn for conn, _, _ in seen} == {1}  # the chunked replies left the connection reusable
        await up.close()


async def test_a_reply_without_length_is_read_until_close_and_not_reused():
    async def until_close(writer):
        writer.write(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"done":')
        await writer.drain()
        writer.write(b"true}")

    async with scripted_backend([until_close]) as (url, seen):
        up = Upstream()
        for _ in range(2):
            r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
            assert await r.read() == b'{"done":true}'
            r.release()
        assert [conn for conn, _, _ in seen] == [1, 2]


async def test_concurrent_requests_use_separate_connections():
    async def slow(writer):
        await asyncio.sleep(0.05)
        writer.write(ok(b"{}"))
        await writer.drain()
        await asyncio.sleep(1)

    async with scripted_backend([slow]) as (url, seen):
        up = Upstream()

        async def call():
            r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
            try:
                return await r.read()
            finally:
                r.release()

        assert await asyncio.gather(*(call() for _ in range(3))) == [b"{}"] * 3
        assert sorted(conn for conn, _, _ in seen) == [1, 2, 3]
        await up.close()


async def test_a_backend_closing_before_replying_is_a_connect_failure():
    async def hang_up(writer):
        writer.close()

    async with scripted_backend([hang_up]) as (url, _):
        with pytest.raises(TransportError) as err:
            await Upstream().request(url, "POST", "/x", JSON_HEADERS, b"{}")
        assert err.value.kind == "connect"


async def test_a_backend_closing_mid_body_is_a_read_failure():
    async def half(writer):
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
        await writer.drain()

    async with scripted_backend([half]) as (url, _):
        r = await Upstream().request(url, "POST", "/x", JSON_HEADERS, b"{}")
        with pytest.raises(TransportError) as err:
            await r.read()
        assert err.value.kind == "read"


async def test_nobody_listening_is_a_connect_failure():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(TransportError) as err:
        await Upstream().request(f"http://127.0.0.1:{port}", "POST", "/x", JSON_HEADERS, b"{}", connect_timeout=1)
    assert err.value.kind == "connect"


async def test_deadline_and_idle_timeouts():
    async def silent(writer):
        await asyncio.sleep(5)

    async def trickle(writer):
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
        )
        await writer.drain()
        await asyncio.sleep(5)

    async with scripted_backend([silent, trickle]) as (url, _):
        up = Upstream()
        loop = asyncio.get_running_loop()
        with pytest.raises(TransportError) as err:
            await up.request(url, "POST", "/x", JSON_HEADERS, b"{}", deadline=loop.time() + 0.1)
        assert err.value.kind == "timeout"
        r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}", idle=0.1)
        body = r.iter_body()
        assert await anext(body) == b"abc"
        with pytest.raises(TransportError) as err:
            await anext(body)
        assert err.value.kind == "timeout"


async def test_an_idle_connection_past_keepalive_is_not_reused():
    async with scripted_backend([ok(b"{}")]) as (url, seen):
        up = Upstream(keepalive=0.05)
        for _ in range(2):
            r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
            await r.read()
            r.release()
            await asyncio.sleep(0.1)
        assert [conn for conn, _, _ in seen] == [1, 2]
        await up.close()


async def test_origins_must_be_http_urls():
    with pytest.raises(ValueError, match="http"):
        await Upstream().request("ftp://host:21", "POST", "/x", JSON_HEADERS, b"{}")


async def test_chunked_framing_split_at_every_byte_still_yields_the_exact_body():
    async def byte_by_byte(writer):
        for i in range(len(CHUNKED)):
            writer.write(CHUNKED[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.001)
        await asyncio.sleep(1)

    async with scripted_backend([byte_by_byte]) as (url, _):
        up = Upstream()
        r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
        assert b"".join([piece async for piece in r.iter_body()]) == b"data: a\n\ndata: b"
        r.release()
        await up.close()


async def test_idle_connections_left_from_a_burst_are_retired_by_later_traffic():
    async with scripted_backend([ok(b"{}")]) as (url, _seen):
        up = Upstream(keepalive=10)

        async def call():
            r = await up.request(url, "POST", "/x", JSON_HEADERS, b"{}")
            await r.read()
            r.release()

        await asyncio.gather(*(call() for _ in range(3)))
        [pool] = up._pools.values()
        burst = list(pool.idle)
        assert len(burst) == 3
        await call()  # steady traffic reuses the newest connection, and keeps it fresh
        assert pool.idle == burst and burst[-1].idle_since > burst[0].idle_since
        for conn in burst[:-1]:  # the burst's other connections idle past the keep-alive (no wall-clock wait)
            conn.idle_since -= 11
        await call()
        assert pool.idle == [burst[-1]] and not any(conn.usable for conn in burst[:-1])
        await up.close()
