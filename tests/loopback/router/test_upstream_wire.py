"""The router's HTTP/1.1 client to vLLM backends (router/upstream.py), pinned byte for byte.

Most tests run a backend in-process on 127.0.0.1 (asyncio.start_server) that reads the request the
client wrote and answers with scripted raw bytes, closes, or resets. Where the exact segments the client
receives, its flow-control calls or the clock matter, the client's connections go to an in-memory
transport instead (`wires`): the test feeds the client's protocol exact segments and sees every write,
pause, resume, close and abort; `clock` freezes the loop's clock to put idle times on a boundary.

What is pinned: the request bytes (request line, Host, Content-Length, caller's fields, body; one write
below 64 KiB, head and body handed over apart from it), the reply head (status, lower-case names,
repeated fields joined, latin-1, 1xx replies skipped, trailers ignored), its limits at the boundary and
one past it (head size also across segments, field count), bodies by Content-Length, chunked and until
close, read whole or as pieces (what came while the caller had the last piece is handed over at once,
never lost), every failure's kind and message (connect, read, timeout), the head's deadline and idle
timeout and how they combine, the body's, reading paused above PAUSE_ABOVE buffered bytes and resumed,
when a connection goes back to the pool and when it is closed instead (unread body, `Connection: close`,
bytes nobody asked for, which never join the reply's body, a half-close, a closed Upstream), keep-alive
expiry at its boundary and the retiring of a burst's leftovers, origins (validation, default ports, TLS
for https).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import pytest

from epd_operator.router.upstream import (
    MAX_HEAD,
    MAX_HEADERS,
    PAUSE_ABOVE,
    BackendReply,
    TransportError,
    Upstream,
)

WAIT = 3.0  # the longest any expected event may take on a loaded machine; a test fails past it
SHORT = 0.05  # a timeout the tests let expire
ORIGIN = "http://backend:8000"  # where the `wires` tests send (never resolved: no socket is opened)


def ok(body: bytes = b"", fields: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), fields, body)


def request_bytes(host: str, method: str, target: str, fields: bytes = b"", body: bytes = b"") -> bytes:
    """What the client writes: request line, Host, Content-Length, the caller's fields, body."""
    return b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        method.encode(),
        target.encode(),
        host.encode(),
        len(body),
        fields,
        body,
    )


CLOSED_BEFORE_REPLY = "connection closed before a reply"


@pytest.fixture(autouse=True)
async def no_loop_errors():
    """Fails a test whose event loop reported an error: an exception escaping a protocol callback or a timer."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    for _ in range(5):  # let run what the test's last step scheduled (connection_lost after an abort)
        await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert not errors, errors


# ---- a backend on 127.0.0.1 -------------------------------------------------------------------------


class Ended(Exception):
    """The connection or the test ended before the script did: the script stops there, quietly."""


class Peer:
    """The backend's end of one connection the client opened."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ended: asyncio.Event) -> None:
        self.reader = reader
        self.writer = writer
        self.ended = ended  # set when the test is done with the backend
        self.requests: list[bytes] = []  # each exactly as received

    async def request(self) -> bytes:
        """The next request, head and Content-Length body."""
        try:
            async with asyncio.timeout(WAIT):
                head = await self.reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"\r\nContent-Length: ")[1].split(b"\r\n")[0])
                raw = head + await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise Ended from exc
        self.requests.append(raw)
        return raw

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def closed_by_client(self) -> None:
        """Returns once the client has closed (or reset) the connection."""
        async with asyncio.timeout(WAIT):
            try:
                while await self.reader.read(65536):
                    pass
            except ConnectionResetError:
                pass

    def reset(self) -> None:
        """Drops the connection with a TCP reset, not a FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def wait(self, event: asyncio.Event) -> None:
        """Waits for the test to set `event`."""
        waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.ended.wait())}
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()
        if not event.is_set():
            raise Ended

    async def hold(self) -> None:
        """Keeps the connection open until the test is done with the backend."""
        await self.ended.wait()


Script = Callable[[Peer], Awaitable[None]]


class Backend:
    """An in-process backend: every connection accepted runs `script` with its Peer (in `peers`, in
    accept order), then is closed. A script's failure fails the test."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.peers: list[Peer] = []
        self._ended = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._errors: list[BaseException] = []

    async def __aenter__(self) -> Backend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.host = f"127.0.0.1:{port}"
        self.origin = f"http://{self.host}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(reader, writer, self._ended)
        self.peers.append(peer)
        try:
            await self.script(peer)
        except Ended:
            pass
        except Exception as exc:  # handed to the test at exit
            self._errors.append(exc)
        finally:
            writer.close()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.close()
        self._ended.set()
        for peer in self.peers:
            peer.writer.close()  # a script reading from its connection ends too
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*self._tasks)
            await self._server.wait_closed()
        if self._errors and kind is None:
            raise self._errors[0]


def answering(*replies: bytes) -> Script:
    """A script answering the connection's requests with `replies` in turn, then keeping it open."""

    async def script(peer: Peer) -> None:
        for reply in replies:
            await peer.request()
            peer.send(reply)
        await peer.hold()

    return script


async def fetch(up: Upstream, origin: str, **timeouts: float) -> BackendReply:
    async with asyncio.timeout(WAIT):
        return await up.request(origin, "POST", "/x", b"", b"{}", **timeouts)


async def fetch_body(up: Upstream, origin: str) -> bytes:
    """One whole exchange, the reply released."""
    reply = await fetch(up, origin)
    async with asyncio.timeout(WAIT):
        body = await reply.read()
    reply.release()
    return body


async def failure(call: Awaitable[Any]) -> TransportError:
    """The TransportError `call` raises (within WAIT)."""
    with pytest.raises(TransportError) as err:
        async with asyncio.timeout(WAIT):
            await call
    return err.value


# ---- the request on the wire ------------------------------------------------------------------------


async def test_the_request_is_written_byte_exact():
    async with Backend(answering(ok(b"{}"), ok(b"up"))) as b:
        up = Upstream()
        fields = b"X-Request-Id: r1\r\nAccept-Encoding: identity\r\n"
        reply = await up.request(b.origin, "POST", "/v1/chat/completions?stream=1", fields, b'{"q":1}')
        assert await reply.read() == b"{}"
        reply.release()
        reply = await up.request(b.origin, "GET", "/health", b"")  # no body given: an empty one
        assert await reply.read() == b"up"
        reply.release()
        assert b.peers[0].requests == [
            request_bytes(b.host, "POST", "/v1/chat/completions?stream=1", fields, b'{"q":1}'),
            request_bytes(b.host, "GET", "/health"),
        ]
        assert len(b.peers) == 1
        await up.close()


async def test_a_body_of_64_KiB_and_more_reaches_the_backend_whole():
    sizes = [65535, 65536, 65537, 1 << 20]
    async with Backend(answering(*[ok()] * len(sizes))) as b:
        up = Upstream()
        for size in sizes:
            body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
            reply = await up.request(b.origin, "PUT", "/blob", b"", body)
            await reply.read()
            reply.release()
            assert b.peers[0].requests[-1] == request_bytes(b.host, "PUT", "/blob", b"", body)
        await up.close()


@pytest.mark.parametrize(("size", "calls"), [(65535, ["write"]), (65536, ["writelines"])])
async def test_head_and_body_go_out_in_one_write_below_64_KiB_and_uncopied_from_it(wires, size, calls):
    up = Upstream()
    body = b"b" * size
    task, wire = await ask(up, wires, body=body)
    assert wire.sent == request_bytes("backend:8000", "POST", "/x", b"", body)
    assert wire.calls == calls
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


# ---- the reply head ---------------------------------------------------------------------------------


async def test_the_reply_head_lower_cases_names_joins_repeats_and_reads_latin_1():
    head = (
        b"HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nX-Dup: a\r\nx-dup: b\r\nX-DUP: c\r\n"
        b"X-Note: caf\xe9\r\nContent-Length: 2\r\n\r\nok"
    )
    async with Backend(answering(head, ok(b"{}"))) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        assert (reply.status, reply.content_type) == (201, "text/plain")
        assert reply.headers == {
            "content-type": "text/plain",
            "x-dup": "a, b, c",
            "x-note": "café",
            "content-length": "2",
        }
        assert await reply.read() == b"ok"
        reply.release()
        reply = await fetch(up, b.origin)
        assert (reply.status, reply.content_type, reply.headers) == (200, "application/json", {"content-length": "2"})
        reply.release()
        await up.close()


async def test_interim_replies_are_skipped_with_their_fields():
    interim = b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    async with Backend(answering(interim + ok(b"hi", b"X-Final: 1\r\n"), ok(b"again"))) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        assert (reply.status, reply.headers) == (200, {"content-length": "2", "x-final": "1"})
        assert await reply.read() == b"hi"
        reply.release()
        assert await fetch_body(up, b.origin) == b"again"
        assert len(b.peers) == 1  # the connection stayed in step
        await up.close()


async def test_trailer_fields_are_not_reply_fields():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nX-Trailer: t\r\n\r\n"
    async with Backend(answering(chunked)) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        assert await reply.read() == b"ab"
        assert reply.headers == {"transfer-encoding": "chunked"}
        reply.release()
        await up.close()


@pytest.mark.parametrize("fields", [MAX_HEADERS, MAX_HEADERS + 1])
async def test_a_reply_head_has_at_most_MAX_HEADERS_fields(fields):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + b"".join(b"X-F%d: v\r\n" % i for i in range(fields - 1))
    async with Backend(answering(head + b"\r\nok")) as b:
        up = Upstream()
        if fields <= MAX_HEADERS:
            reply = await fetch(up, b.origin)
            assert len(reply.headers) == MAX_HEADERS
            assert await reply.read() == b"ok"
            reply.release()
        else:
            err = await failure(fetch(up, b.origin))
            assert (err.kind, str(err)) == ("read", "read: too many reply header fields")
            await b.peers[0].closed_by_client()
        await up.close()


@pytest.mark.parametrize(("size", "message"), [(MAX_HEAD, CLOSED_BEFORE_REPLY), (MAX_HEAD + 1, "reply head too large")])
async def test_an_unfinished_head_may_reach_MAX_HEAD_bytes(size, message):
    start = b"HTTP/1.1 200 OK\r\nX-Pad: "

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(start + b"a" * (size - len(start)))  # then the connection closes

    async with Backend(script) as b:
        err = await failure(fetch(Upstream(), b.origin))
        assert (err.kind, str(err)) == ("read", f"read: {message}")


async def test_the_head_limit_counts_every_segment_of_an_unfinished_head(wires):
    up = Upstream()
    task, wire = await ask(up, wires)
    start = b"HTTP/1.1 200 OK\r\nX-Pad: "
    wire.feed(start + b"a" * (30000 - len(start)))
    wire.feed(b"a" * 30000)
    wire.feed(b"a" * (MAX_HEAD - 60000))  # MAX_HEAD bytes in all: still waiting for the rest
    assert not task.done() and wire.calls == ["write"]
    wire.feed(b"a")
    err = await failure(task)
    assert str(err) == "read: reply head too large"
    assert wire.calls[-1] == "abort"


async def test_a_reply_that_is_not_http_is_a_read_failure():
    async with Backend(answering(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")) as b:
        err = await failure(fetch(Upstream(), b.origin))
        assert err.kind == "read" and str(err).startswith("read: malformed reply: "), str(err)
        await b.peers[0].closed_by_client()


# ---- connections that end early ---------------------------------------------------------------------


async def test_a_backend_closing_before_a_byte_of_reply_is_a_connect_failure_and_after_one_a_read_failure():
    async def hang_up(peer: Peer) -> None:
        await peer.request()

    async def half_a_head(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\n")

    for script, kind in ((hang_up, "connect"), (half_a_head, "read")):
        async with Backend(script) as b:
            err = await failure(fetch(Upstream(), b.origin))
            assert (err.kind, str(err)) == (kind, f"{kind}: {CLOSED_BEFORE_REPLY}")


async def test_a_reset_before_the_reply_is_a_connect_failure():
    async def reset(peer: Peer) -> None:
        await peer.request()
        peer.reset()

    async with Backend(reset) as b:
        err = await failure(fetch(Upstream(), b.origin))
        assert (err.kind, str(err)) == ("connect", f"connect: {CLOSED_BEFORE_REPLY}")


async def test_a_body_cut_short_is_a_read_failure_naming_a_reset():
    go = asyncio.Event()

    async def cut(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await peer.wait(go)
        peer.reset()

    async with Backend(cut) as b:
        reply = await fetch(Upstream(), b.origin)
        go.set()
        err = await failure(reply.read())
        reset = ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
        assert (err.kind, str(err)) == ("read", f"read: connection closed ({reset!r})")


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_body_until_close_cut_by_a_reset_is_a_read_failure_not_an_end(streamed):
    go = asyncio.Event()

    async def cut(peer: Peer) -> None:
        await peer.request()
        peer.send(b'HTTP/1.1 200 OK\r\n\r\n{"done":')
        await peer.wait(go)
        peer.reset()

    async with Backend(cut) as b:
        reply = await fetch(Upstream(), b.origin)
        if streamed:
            body = reply.iter_body()
            async with asyncio.timeout(WAIT):
                assert await anext(body) == b'{"done":'
            go.set()
            err = await failure(anext(body))
        else:
            go.set()
            err = await failure(reply.read())
        reset = ConnectionResetError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))
        assert (err.kind, str(err)) == ("read", f"read: connection closed ({reset!r})")


async def test_a_body_cut_short_by_a_close_fails_after_the_bytes_that_came():
    async def cut(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")

    async with Backend(cut) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        err = await failure(reply.read())
        assert (err.kind, str(err)) == ("read", "read: connection closed")
        reply = await fetch(up, b.origin)
        pieces = []
        with pytest.raises(TransportError) as caught:
            async with asyncio.timeout(WAIT):
                async for piece in reply.iter_body():
                    pieces.append(piece)
        assert (b"".join(pieces), str(caught.value)) == (b"abc", "read: connection closed")
        assert len(b.peers) == 2


@pytest.mark.parametrize("later", [False, True], ids=["with-the-head", "after-the-head"])
async def test_a_malformed_chunk_fails_the_body(later):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    go = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        if later:
            peer.send(head)
            await peer.wait(go)
            peer.send(b"zz\r\n")
        else:
            peer.send(head + b"zz\r\n")
        await peer.hold()

    async with Backend(script) as b:
        reply = await fetch(Upstream(), b.origin)
        assert reply.status == 200
        reading = asyncio.create_task(reply.read())
        await asyncio.sleep(0)  # reading waits for the body
        go.set()
        err = await failure(reading)
        assert err.kind == "read" and str(err).startswith("read: malformed reply: "), str(err)
        await b.peers[0].closed_by_client()


# ---- bodies -----------------------------------------------------------------------------------------


async def test_chunks_that_arrive_together_are_one_piece_and_the_connection_is_reused():
    go = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n")
        await peer.wait(go)
        peer.send(b"1\r\nf\r\n0\r\n\r\n")
        await peer.request()
        peer.send(ok(b"next"))
        await peer.hold()

    async with Backend(script) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        body = reply.iter_body()
        async with asyncio.timeout(WAIT):
            assert await anext(body) == b"abcde"
            go.set()
            assert [piece async for piece in body] == [b"f"]
        reply.release()
        assert await fetch_body(up, b.origin) == b"next"
        assert len(b.peers) == 1
        await up.close()


@pytest.mark.parametrize("status", [204, 304])
async def test_a_reply_that_has_no_body_by_its_status_keeps_the_connection(status):
    async with Backend(answering(b"HTTP/1.1 %d X\r\n\r\n" % status, ok(b"next"))) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        assert (reply.status, await reply.read()) == (status, b"")
        reply.release()
        assert await fetch_body(up, b.origin) == b"next"
        assert len(b.peers) == 1
        await up.close()


async def test_a_body_until_close_is_streamed_to_its_end_and_its_connection_not_reused():
    go = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n")
        await peer.wait(go)
        peer.send(b"data: b\n\n")  # then the connection closes

    async with Backend(script) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        body = reply.iter_body()
        async with asyncio.timeout(WAIT):
            assert await anext(body) == b"data: a\n\n"
            go.set()
            assert b"".join([piece async for piece in body]) == b"data: b\n\n"
        reply.release()
        go.clear()
        reply = await fetch(up, b.origin)
        reply.release()
        assert len(b.peers) == 2
        await up.close()


async def test_a_body_until_close_is_read_whole_when_the_backend_closes():
    go = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b'HTTP/1.1 200 OK\r\n\r\n{"done":')
        await peer.wait(go)
        peer.send(b"true}")  # then the connection closes

    async with Backend(script) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        reading = asyncio.create_task(reply.read())
        await asyncio.sleep(0)  # reading waits for the rest
        go.set()
        async with asyncio.timeout(WAIT):
            assert await reading == b'{"done":true}'
        reply.release()
        assert await fetch_body(up, b.origin) == b'{"done":true}'
        assert len(b.peers) == 2
        await up.close()


# ---- timeouts ---------------------------------------------------------------------------------------


async def silent(peer: Peer) -> None:
    await peer.request()
    await peer.hold()


@pytest.mark.parametrize(("deadline", "idle"), [(SHORT, None), (None, SHORT), (SHORT, 100 * WAIT), (100 * WAIT, SHORT)])
async def test_the_head_waits_until_the_deadline_or_an_idle_silence_whichever_ends_first(deadline, idle):
    async with Backend(silent) as b:
        loop = asyncio.get_running_loop()
        up = Upstream()
        timeouts: dict[str, float] = {} if idle is None else {"idle": idle}
        if deadline is not None:
            timeouts["deadline"] = loop.time() + deadline
        err = await failure(up.request(b.origin, "POST", "/x", b"", b"{}", **timeouts))
        assert (err.kind, str(err)) == ("timeout", "timeout")
        await b.peers[0].closed_by_client()


@pytest.mark.parametrize("deadline", [None, WAIT])
async def test_a_head_that_comes_within_the_timeouts_is_read(deadline):
    go = asyncio.Event()

    asked = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        asked.set()
        await peer.wait(go)
        peer.send(ok(b"late"))
        await peer.hold()

    async with Backend(script) as b:
        loop = asyncio.get_running_loop()
        timeouts = {"idle": WAIT} if deadline is None else {"idle": WAIT, "deadline": loop.time() + deadline}
        task = asyncio.create_task(Upstream().request(b.origin, "POST", "/x", b"", b"{}", **timeouts))
        async with asyncio.timeout(WAIT):
            await asyncio.wait({task, asyncio.ensure_future(asked.wait())}, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done()  # the client waits for the head
        go.set()
        async with asyncio.timeout(WAIT):
            reply = await task
        assert await reply.read() == b"late"
        reply.close()


async def test_a_silent_body_times_out_at_the_read_deadline_or_after_idle_seconds():
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
        await peer.hold()

    async with Backend(script) as b:
        loop = asyncio.get_running_loop()
        up = Upstream()
        reply = await fetch(up, b.origin)  # no idle timeout: the read's deadline bounds it
        err = await failure(reply.read(deadline=loop.time() + SHORT))
        assert (err.kind, str(err)) == ("timeout", "timeout")
        await b.peers[0].closed_by_client()
        reply = await fetch(up, b.origin, idle=SHORT)
        err = await failure(reply.read())
        assert (err.kind, str(err)) == ("timeout", "timeout")
        await b.peers[1].closed_by_client()
        reply = await fetch(up, b.origin, idle=SHORT)
        err = await failure(anext(reply.iter_body()))
        assert (err.kind, str(err)) == ("timeout", "timeout")
        await b.peers[2].closed_by_client()
        with pytest.raises(RuntimeError, match=r"^the reply was already released or closed$"):
            await reply.read()


async def test_a_read_deadline_replaces_the_idle_timeout():
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
        await asyncio.sleep(3 * SHORT)  # a silence longer than the idle timeout
        peer.send(b"late")
        await peer.hold()

    async with Backend(script) as b:
        loop = asyncio.get_running_loop()
        reply = await fetch(Upstream(), b.origin, idle=SHORT)
        assert await reply.read(deadline=loop.time() + WAIT) == b"late"
        reply.close()


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_body_that_comes_within_the_idle_timeout_is_read(streamed):
    go = asyncio.Event()

    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
        await peer.wait(go)
        peer.send(b"late")
        await peer.hold()

    async with Backend(script) as b:
        reply = await fetch(Upstream(), b.origin, idle=WAIT)
        if streamed:
            reading: asyncio.Future[Any] = asyncio.ensure_future(anext(reply.iter_body()))
        else:
            reading = asyncio.ensure_future(reply.read())
        await asyncio.sleep(0)  # the read waits for the body
        go.set()
        async with asyncio.timeout(WAIT):
            assert await reading == b"late"
        reply.close()


async def test_a_body_until_close_that_goes_silent_times_out_and_is_not_taken_for_complete():
    async def script(peer: Peer) -> None:
        await peer.request()
        peer.send(b"HTTP/1.1 200 OK\r\n\r\npartial")
        await peer.hold()

    async with Backend(script) as b:
        loop = asyncio.get_running_loop()
        up = Upstream()
        reply = await fetch(up, b.origin)
        err = await failure(reply.read(deadline=loop.time() + SHORT))
        assert (err.kind, str(err)) == ("timeout", "timeout")
        reply = await fetch(up, b.origin, idle=SHORT)
        body = reply.iter_body()
        assert await anext(body) == b"partial"
        err = await failure(anext(body))
        assert (err.kind, str(err)) == ("timeout", "timeout")
        for peer in b.peers:
            await peer.closed_by_client()


# ---- which connections are reused -------------------------------------------------------------------


async def test_a_reply_saying_connection_close_is_not_reused_even_if_the_backend_keeps_it_open():
    async with Backend(answering(ok(b"bye", b"Connection: close\r\n"))) as b:
        up = Upstream()
        assert await fetch_body(up, b.origin) == b"bye"
        await b.peers[0].closed_by_client()
        assert await fetch_body(up, b.origin) == b"bye"
        assert len(b.peers) == 2
        await up.close()


async def test_closing_the_upstream_closes_idle_connections_and_those_released_later():
    async with Backend(answering(ok(b"{}"))) as b:
        up = Upstream()
        idle = await fetch(up, b.origin)
        busy = await fetch(up, b.origin)
        await idle.read()
        idle.release()
        await busy.read()
        await up.close()
        await b.peers[0].closed_by_client()
        busy.release()
        await b.peers[1].closed_by_client()


async def test_a_closed_reply_closes_its_connection_and_can_no_longer_be_read():
    async with Backend(answering(ok(b"{}"))) as b:
        up = Upstream()
        reply = await fetch(up, b.origin)
        reply.close()
        await b.peers[0].closed_by_client()
        reply.close()
        reply.release()  # both once more: nothing to do
        with pytest.raises(RuntimeError, match=r"^the reply was already released or closed$"):
            await reply.read()
        reply = await fetch(up, b.origin)
        await reply.read()
        reply.release()
        with pytest.raises(RuntimeError, match=r"^the reply was already released or closed$"):
            await anext(reply.iter_body())
        await up.close()


async def test_each_origin_has_its_own_pool():
    async with Backend(answering(ok(b"a"), ok(b"a"))) as a, Backend(answering(ok(b"b"), ok(b"b"))) as b:
        up = Upstream()
        for _ in range(2):
            assert [await fetch_body(up, a.origin), await fetch_body(up, b.origin)] == [b"a", b"b"]
        assert (len(a.peers), len(b.peers)) == (1, 1)
        await up.close()


# ---- origins ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("origin", ["ftp://backend:21", "http://", "backend:8000", "http://user:secret@backend:8000"])
async def test_an_origin_must_be_an_http_url_with_a_host(origin):
    with pytest.raises(ValueError) as err:
        await Upstream().request(origin, "POST", "/x", b"", b"{}")
    assert str(err.value) == f"backend origin must be http(s)://host[:port], not {origin!r}"


@pytest.mark.parametrize(
    ("origin", "address"),
    [
        ("http://localhost", "localhost:80"),
        ("https://localhost", "localhost:443"),
        ("http://localhost:8", "localhost:8"),
    ],
)
async def test_a_connect_timeout_names_the_address_and_its_default_port(origin, address):
    err = await failure(Upstream().request(origin, "POST", "/x", b"", b"{}", connect_timeout=0))
    assert (err.kind, str(err)) == ("timeout", f"timeout: connecting to {address}")


async def test_nobody_listening_is_a_connect_failure_naming_the_address():
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    err = await failure(Upstream().request(f"http://127.0.0.1:{port}", "POST", "/x", b"", b"{}"))
    assert (err.kind, str(err)) == (
        "connect",
        f"connect: [Errno {errno.ECONNREFUSED}] Connect call failed ('127.0.0.1', {port})",
    )


async def test_an_https_origin_speaks_tls_and_an_http_one_does_not():
    first: list[bytes] = []

    async def script(peer: Peer) -> None:
        first.append(await peer.reader.readexactly(3))

    async with Backend(script) as b:
        for scheme in ("https", "http"):
            err = await failure(Upstream().request(f"{scheme}://{b.host}", "POST", "/x", b"", b"{}"))
            assert err.kind == "connect"
    assert first == [b"\x16\x03\x01", b"POS"]  # a TLS handshake record; the request line


# ---- exact segments, flow control and the clock: the `wires` transport ------------------------------


class Wire(asyncio.Transport):
    """An in-memory connection of the client's: the test plays the backend by feeding the client's
    protocol segments, and sees what the client wrote and each flow-control and closing call. Like a
    socket transport it reports the connection lost soon after an abort, and after a close once the
    bytes written have gone out (never, with `flushed` False: a backend that does not read)."""

    def __init__(self, protocol: asyncio.Protocol, flushed: bool) -> None:
        super().__init__()
        self.protocol = protocol
        self.flushed = flushed
        self.sent = bytearray()
        self.calls: list[str] = []
        self.closing = False
        self.lost = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append("write")
        self.sent += data

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append("writelines")
        for data in list_of_data:
            self.sent += data

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append("close")
        self._shut(lost=self.flushed)

    def abort(self) -> None:
        self.calls.append("abort")
        self._shut(lost=True)

    def _shut(self, lost: bool) -> None:
        self.closing = True
        if lost and not self.lost:
            self.lost = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    # the backend's side
    def feed(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def feed_eof(self) -> None:
        if not self.protocol.eof_received():
            self.close()


class Wires(list[Wire]):
    """The connections the client opened, in order. `on_connect` runs as each is made, before the
    client writes to it; `flushed` is given to the next ones."""

    on_connect: Callable[[Wire], None] | None = None
    flushed = True


@pytest.fixture
async def wires(monkeypatch) -> Wires:
    loop = asyncio.get_running_loop()
    made = Wires()

    async def create_connection(factory: Callable[[], asyncio.Protocol], host: str, port: int, **_: Any) -> Any:
        protocol = factory()
        wire = Wire(protocol, made.flushed)
        protocol.connection_made(wire)
        made.append(wire)
        if made.on_connect is not None:
            made.on_connect(wire)
        return wire, protocol

    monkeypatch.setattr(loop, "create_connection", create_connection)
    return made


class Clock:
    """The loop's clock, frozen at `now` (no timer of these tests is due while it is)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(loop, "time", lambda: self.now)


@pytest.fixture
async def clock(monkeypatch) -> Clock:
    return Clock(asyncio.get_running_loop(), monkeypatch)


async def until(condition: Callable[[], object]) -> None:
    """Lets the loop run until `condition` holds (within WAIT; what it waits for is already under way)."""
    end = time.monotonic() + WAIT  # not the loop's clock, which `clock` freezes
    while not condition():
        assert time.monotonic() < end, "the condition did not come to hold"
        await asyncio.sleep(0)


async def ask(
    up: Upstream, wires: Wires, body: bytes = b"{}", **timeouts: float
) -> tuple[asyncio.Task[BackendReply], Wire]:
    """Starts a request; returns it once written, with the connection it went out on."""
    before = {id(w): len(w.sent) for w in wires}
    task = asyncio.create_task(up.request(ORIGIN, "POST", "/x", b"", body, **timeouts))

    def written() -> Wire | None:
        return next((w for w in wires if len(w.sent) > before.get(id(w), 0)), None)

    await until(written)
    wire = written()
    assert wire is not None
    return task, wire


async def exchange(up: Upstream, wires: Wires, reply: bytes = ok(b"{}")) -> Wire:
    """One request answered with `reply`, read and released; the connection it went out on."""
    task, wire = await ask(up, wires)
    wire.feed(reply)
    response = await task
    await response.read()
    response.release()
    return wire


async def test_reading_pauses_above_PAUSE_ABOVE_buffered_bytes_and_resumes_as_they_are_taken(wires):
    up = Upstream()
    task, wire = await ask(up, wires)
    wire.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * PAUSE_ABOVE + 13))
    reply = await task
    body = reply.iter_body()
    wire.feed(b"a" * PAUSE_ABOVE)  # at the limit: reading goes on
    assert wire.calls == ["write"]
    wire.feed(b"b")
    assert wire.calls == ["write", "pause"]
    wire.feed(b"c")  # arrived before the pause took effect: paused once
    assert wire.calls == ["write", "pause"]
    assert await anext(body) == b"a" * PAUSE_ABOVE + b"bc"
    assert wire.calls == ["write", "pause", "resume"]
    wire.feed(b"d" * (PAUSE_ABOVE + 1))
    assert wire.calls == ["write", "pause", "resume", "pause"]
    assert await anext(body) == b"d" * (PAUSE_ABOVE + 1)
    wire.feed(b"e" * 10)
    assert await anext(body) == b"e" * 10
    assert [piece async for piece in body] == []
    assert wire.calls == ["write", "pause", "resume", "pause", "resume"]
    reply.release()
    assert wire.calls[-1] == "resume"  # back in the pool, not closed
    await up.close()


async def test_reading_a_whole_body_resumes_while_it_waits_for_the_rest(wires):
    up = Upstream()
    task, wire = await ask(up, wires)
    wire.feed(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * PAUSE_ABOVE + 2))
    reply = await task
    reading = asyncio.create_task(reply.read())
    await asyncio.sleep(0)  # reading waits for the body
    wire.feed(b"a" * (PAUSE_ABOVE + 1))
    await until(lambda: wire.calls[-1] == "resume")
    wire.feed(b"b" * (PAUSE_ABOVE + 1))  # the whole body is buffered now: above the limit again
    assert await reading == b"a" * (PAUSE_ABOVE + 1) + b"b" * (PAUSE_ABOVE + 1)
    assert wire.calls == ["write", "pause", "resume", "pause", "resume"]
    reply.release()
    await up.close()


async def test_a_streamed_body_hands_over_what_came_while_the_caller_had_the_last_piece(wires):
    up = Upstream()
    task, wire = await ask(up, wires)
    wire.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
    reply = await task
    body = reply.iter_body()
    assert await anext(body) == b"a"
    wire.feed(b"1\r\nb\r\n")  # came while the caller had "a"
    async with asyncio.timeout(WAIT):
        assert await anext(body) == b"b"  # at once: nothing more has to come first
    wire.feed(b"1\r\nc\r\n0\r\n\r\n")  # the last piece and the end of the reply together
    assert [piece async for piece in body] == [b"c"]
    reply.release()
    assert await exchange(up, wires) is wire
    await up.close()


async def test_a_reply_released_unread_closes_its_connection(wires):
    up = Upstream()
    task, wire = await ask(up, wires)
    wire.feed(ok(b"unread"))  # all of it
    (await task).release()
    assert wire.calls == ["write", "abort"]
    assert await exchange(up, wires) is not wire
    await up.close()


async def test_a_small_exchange_neither_pauses_nor_resumes_reading(wires):
    up = Upstream()
    for _ in range(2):
        wire = await exchange(up, wires, ok(b"x" * 1000))
    assert len(wires) == 1 and wire.calls == ["write", "write"]
    await up.close()
    assert wire.calls == ["write", "write", "abort"]


@pytest.mark.parametrize(
    "stray",
    [None, "a second reply in the same segment", "a segment before release", "a segment while idle"],
)
async def test_bytes_nobody_asked_for_retire_the_connection(wires, stray):
    up = Upstream()
    task, wire = await ask(up, wires)
    wire.feed(ok(b"{}") + (ok(b"stray") if stray == "a second reply in the same segment" else b""))
    reply = await task
    assert await reply.read() == b"{}"
    if stray == "a segment before release":
        wire.feed(b"\r\n")
    reply.release()
    if stray == "a segment while idle":
        wire.feed(ok(b"stray"))
    again = await exchange(up, wires)
    if stray is None:
        assert again is wire and len(wires) == 1
    else:
        assert again is not wire and len(wires) == 2
        assert wire.calls[-1] == "abort"
    await up.close()


async def test_bytes_before_the_request_are_dropped_and_retire_the_connection(wires):
    up = Upstream()
    wires.on_connect = lambda wire: wire.feed(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
    task, wire = await ask(up, wires)
    wire.feed(ok(b"mine"))
    reply = await task
    assert (reply.status, await reply.read()) == (200, b"mine")
    reply.release()
    assert wire.calls == ["write", "abort"]
    await up.close()


async def test_a_connection_closed_before_the_request_is_a_connect_failure(wires):
    wires.on_connect = lambda wire: wire.feed_eof()
    err = await failure(Upstream().request(ORIGIN, "POST", "/x", b"", b"{}"))
    assert (err.kind, str(err)) == ("connect", f"connect: {CLOSED_BEFORE_REPLY}")


async def test_a_backend_closing_while_the_request_is_still_queued_fails_at_once(wires):
    wires.flushed = False  # the backend reads nothing: closing waits for bytes that never go out
    loop = asyncio.get_running_loop()
    task, wire = await ask(Upstream(), wires, deadline=loop.time() + 10 * SHORT)
    wire.feed_eof()
    err = await failure(task)
    assert (err.kind, str(err)) == ("connect", f"connect: {CLOSED_BEFORE_REPLY}")


async def test_an_idle_connection_the_backend_half_closes_is_closed_and_not_reused(wires):
    up = Upstream()
    wire = await exchange(up, wires)
    wire.feed_eof()
    assert wire.calls == ["write", "close"]
    assert await exchange(up, wires) is not wire
    assert wire.calls == ["write", "close", "abort"]
    await up.close()


@pytest.mark.parametrize(("idle_for", "reused"), [(2.4, True), (2.5, False)])
async def test_an_idle_connection_is_reused_for_under_keepalive_seconds_by_default_2_5(wires, clock, idle_for, reused):
    up = Upstream()
    wire = await exchange(up, wires)
    clock.now += idle_for
    assert (await exchange(up, wires) is wire) == reused
    assert wire.calls[-1] == ("write" if reused else "abort")
    await up.close()


async def test_a_release_retires_the_connections_idle_for_more_than_keepalive_seconds(wires, clock):
    up = Upstream(keepalive=1.0)
    asked = [await ask(up, wires) for _ in range(4)]
    replies = []
    for task, wire in asked:
        wire.feed(ok(b"{}"))
        replies.append(await task)
    a, b, c, d = (wire for _, wire in asked)
    for reply, at in zip(replies, (1000.0, 1000.5, 1001.0, 1001.5), strict=True):
        clock.now = at
        await reply.read()
        reply.release()
        if at == 1001.0:
            assert "abort" not in a.calls  # idle for exactly keepalive seconds: kept
    assert ["abort" in wire.calls for wire in (a, b, c, d)] == [True, False, False, False]
    assert await exchange(up, wires) is d  # the most recently used first
    await up.close()
