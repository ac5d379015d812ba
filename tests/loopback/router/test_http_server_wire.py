"""The router's HTTP/1.1 server (router/http_server.py) byte for byte, run in-process on 127.0.0.1 and
driven by raw asyncio streams and sockets.

What is pinned: the request a handler is handed (method, path, query, joined and latin-1 header fields,
body, keep-alive, HTTP/1.0), the exact bytes of every reply and refusal (status line, Content-Length,
`Connection` header, JSON error body), each limit at its boundary and one past it (target, header field,
header count, head size also when the head trickles in, pipelining depth, body size announced or chunked,
chunked framing), the timeouts (idle, head, body and its allowance per byte received, send), the order
of pipelined replies (a 100 Continue included), that nothing is parsed ahead of a reply owed and that
bytes after a request which ends the connection are dropped, backpressure on a client that reads slowly
or not at all, the listener (address, port, backlog), protocol upgrades, streamed replies, handler
failures, and the graceful shutdown (which reply says `Connection: close`, what is cut at the deadline).
A reply a handler cannot render (a status that is not an integer, CR or LF in a header) is a 500 and a
closed connection, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson
import pytest

from dev.ports import free_port
from epd_operator.router.http_server import (
    BodyTooLarge,
    HttpConnection,
    HttpRequest,
    HttpServer,
    Limits,
    Response,
    StreamResponse,
    start_server,
)

WAIT = 3.0  # seconds any expected event may take on a loaded machine; a test fails past it


# ---- the wire: expected bytes, a client, the server under test ---------------------------------------


def refusal(status: int, message: str, closing: bool = True) -> bytes:
    """The exact reply to a request the server refuses or fails: a JSON error; a refusal closes the connection."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": status}})
    return b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        HTTPStatus(status).phrase.encode(),
        len(body),
        b"Connection: close\r\n" if closing else b"",
        body,
    )


def ok(body: bytes, extra: bytes = b"") -> bytes:
    """The exact reply of `App` (or any 200 with no header fields of its own)."""
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def whole_reply(status: int, body: bytes, extra: bytes = b"") -> bytes:
    """The exact reply a handler's `Response(body, status)` is written as."""
    return b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        HTTPStatus(status).phrase.encode(),
        len(body),
        extra,
        body,
    )


def get(path: str = "/", extra: bytes = b"") -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: h\r\n%s\r\n" % (path.encode(), extra)


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


def chunked_head(path: str = "/", extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n%s\r\n" % (path.encode(), extra)


async def until(condition: Callable[[], object], what: str = "condition") -> None:
    """Wait until `condition()` holds (the server's state as the test drives it), at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


class Client:
    """One client connection, reading replies exactly as they come."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def reply(self) -> bytes:
        """The raw bytes of the next reply: head, then its Content-Length or chunked body (none for a 1xx)."""
        async with asyncio.timeout(WAIT):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            if head.startswith(b"HTTP/1.1 1"):
                return head
            if b"\r\ntransfer-encoding: chunked\r\n" in lower:
                raw = b""
                while True:
                    line = await self.reader.readuntil(b"\r\n")
                    size = int(line[:-2], 16)
                    raw += line + await self.reader.readexactly(size + 2)
                    if size == 0:
                        return head + raw
            length = int(lower.split(b"\r\ncontent-length: ")[1].split(b"\r\n")[0])
            return head + await self.reader.readexactly(length)

    async def rest(self) -> bytes:
        """Everything up to the server closing the connection (fails if it does not close in WAIT)."""
        async with asyncio.timeout(WAIT):
            try:
                return await self.reader.read()
            except ConnectionResetError:
                return b"<reset>"

    async def quiet(self, seconds: float) -> None:
        """Nothing arrives, and the connection stays open, for `seconds` (a read that must time out)."""
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(seconds):
                data = await self.reader.read(1)
                raise AssertionError(f"got {data!r} where nothing was expected")

    def close(self) -> None:
        self.writer.close()


class App:
    """The handler: answers `METHOD path?query body`; requests to a gated path wait until it opens."""

    def __init__(self) -> None:
        self.seen: list[HttpRequest] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.cancelled: list[HttpRequest] = []

    def gate(self, path: str) -> asyncio.Event:
        self.gates[path] = asyncio.Event()
        return self.gates[path]

    @property
    def paths(self) -> list[str]:
        return [r.path for r in self.seen]

    async def __call__(self, request: HttpRequest) -> Response | StreamResponse:
        self.seen.append(request)
        gate = self.gates.get(request.path)
        if gate is not None:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                self.cancelled.append(request)
                raise
        try:
            body = await request.read()
        except BodyTooLarge:
            return Response(b"too large", 413)
        target = request.path + ("?" + request.query if request.query else "")
        return Response(b"%s %s %s" % (request.method.encode(), target.encode(), body))


class Served:
    def __init__(self, server: HttpServer, app: Any) -> None:
        self.server = server
        self.app = app  # an App unless the test brought its own handler
        self.address = server.sockets[0].getsockname()[:2]
        self.clients: list[Client] = []

    async def connect(self) -> Client:
        client = Client(*await asyncio.open_connection(*self.address))
        self.clients.append(client)
        return client

    @property
    def conn(self) -> HttpConnection:
        """The one client connection the server has open."""
        (conn,) = self.server.connections
        return conn

    async def exchange(self, data: bytes) -> bytes:
        """Send `data` on a new connection and read until the server closes it."""
        client = await self.connect()
        await client.send(data)
        return await client.rest()


@contextlib.asynccontextmanager
async def serving(
    handler: Callable[[HttpRequest], Awaitable[Response | StreamResponse]] | None = None,
    max_body: int = 64,
    **limits: float,
) -> AsyncIterator[Served]:
    app = handler or App()
    server = await start_server(app, max_body, host="127.0.0.1", port=0, limits=Limits(**limits))  # type: ignore[arg-type]
    served = Served(server, app)
    try:
        yield served
    finally:
        server.close()
        for client in served.clients:
            client.close()
        for conn in list(server.connections):
            conn.transport.abort()
        tasks = [conn.task for conn in server.connections if conn.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=WAIT)
        for client in served.clients:
            with contextlib.suppress(ConnectionError):
                await client.writer.wait_closed()


@pytest.fixture(autouse=True)
def no_stray_errors(caplog: pytest.LogCaptureFixture):
    """A test that expects an error log reads it and clears it; any other error logged fails the test."""
    caplog.set_level(logging.INFO)
    yield
    stray = [r.getMessage() for r in caplog.get_records("call") if r.levelno >= logging.ERROR]
    assert not stray, stray


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The error messages logged so far (then forgotten: they were expected)."""
    found = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    caplog.clear()
    return found


# ---- what a handler is handed ------------------------------------------------------------------------


async def test_a_request_is_handed_over_as_parsed_and_answered_on_the_same_connection():
    async with serving() as s:
        client = await s.connect()
        await client.send(
            b"PATCH /p/q?a=1?b HTTP/1.1\r\nHost: h\r\nX-Multi: a\r\nx-multi: b\r\nX-Latin: \xe9\r\n"
            b"Content-Length: 3\r\n\r\nabc"
        )
        assert await client.reply() == ok(b"PATCH /p/q?a=1?b abc")
        (request,) = s.app.seen
        assert (request.method, request.path, request.query) == ("PATCH", "/p/q", "a=1?b")
        assert request.headers == {"host": "h", "x-multi": "a, b", "x-latin": "\xe9", "content-length": "3"}
        assert type(request.body) is bytes and request.body == b"abc"
        assert request.keep_alive is True and request.http10 is False
        assert request.connection is s.conn and isinstance(request.connection, HttpConnection)
        await client.send(get("/again"))
        assert await client.reply() == ok(b"GET /again ")
        assert s.app.seen[1].body == b"" and type(s.app.seen[1].body) is bytes


async def test_an_http10_request_needs_no_host_and_its_connection_closes_after_the_reply():
    async with serving() as s:
        raw = await s.exchange(b"GET /old HTTP/1.0\r\n\r\n")
        assert raw == ok(b"GET /old ", b"Connection: close\r\n")
        (request,) = s.app.seen
        assert request.http10 is True and request.keep_alive is False and request.headers == {}


async def test_an_http10_keep_alive_reply_says_so_and_the_connection_serves_the_next_request():
    async with serving() as s:
        client = await s.connect()
        await client.send(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert await client.reply() == ok(b"GET /a ", b"Connection: keep-alive\r\n")
        await client.send(get("/b"))
        assert await client.reply() == ok(b"GET /b ")


async def test_a_head_reply_announces_the_body_length_and_sends_no_body():
    async with serving() as s:
        client = await s.connect()
        await client.send(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n" + get("/next"))
        assert await client.reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n"
        assert await client.reply() == ok(b"GET /next ")


async def test_a_chunked_body_in_many_pieces_is_handed_over_as_bytes():
    async with serving() as s:
        client = await s.connect()
        await client.send(chunked_head("/c", b"X-A: 1\r\n") + b"3\r\nabc\r\n2;ext=1\r\nde\r\n1\r\nf\r\n0\r\n\r\n")
        assert await client.reply() == ok(b"POST /c abcdef")
        (request,) = s.app.seen
        assert type(request.body) is bytes and request.body == b"abcdef"


async def test_the_chunked_coding_is_recognised_whatever_its_case():
    async with serving() as s:
        raw = await s.exchange(
            b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
        )
        assert raw == ok(b"POST /c hi", b"Connection: close\r\n")


async def test_trailer_fields_are_counted_but_never_join_the_request_header_fields():
    async with serving() as s:
        client = await s.connect()
        await client.send(chunked_head("/t") + b"1\r\nz\r\n0\r\nHost: other\r\nX-Trailer: 1\r\n\r\n")
        assert await client.reply() == ok(b"POST /t z")
        assert s.app.seen[0].headers == {"host": "h", "transfer-encoding": "chunked"}
    async with serving(max_headers=3) as s:  # Host, Transfer-Encoding, then a third field: one trailer fits
        client = await s.connect()
        await client.send(chunked_head("/t") + b"1\r\nz\r\n0\r\nX-T: 1\r\n\r\n")
        assert await client.reply() == ok(b"POST /t z")
        await client.send(chunked_head("/t") + b"1\r\nz\r\n0\r\nX-T: 1\r\nX-U: 2\r\n\r\n")
        assert await client.rest() == refusal(431, "too many header fields")


# ---- refusals: exact replies, then the connection closes -------------------------------------------------


@pytest.mark.parametrize("name", ["Host", "Content-Type", "Authorization", "X-Request-Id", "Expect"])
async def test_a_repeated_single_valued_field_is_refused(name):
    field = name.encode()
    async with serving() as s:
        raw = await s.exchange(b"GET / HTTP/1.1\r\nHost: h\r\n%s: a\r\n%s: b\r\n\r\n" % (field, field.lower()))
        assert raw == refusal(400, f"repeated {name.lower()} header field")
        assert not s.app.seen


@pytest.mark.parametrize(
    "data, status, message",
    [
        (b"GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1 are served"),
        (b"GET / HTTP/0.9\r\nHost: h\r\n\r\n", 505, "only HTTP/1.0 and HTTP/1.1 are served"),
        (
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            "Transfer-Encoding in an HTTP/1.0 request",
        ),
        (
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            501,
            "only the chunked transfer coding is accepted",
        ),
        (b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n", 400, "missing Host header field"),
        (b"CONNECT h:22 HTTP/1.1\r\nHost: h:22\r\n\r\n", 405, "CONNECT is not served"),
        (b"NONSENSE\r\n\r\n", 400, "malformed request: Invalid method encountered"),
        (b"GET /a\x01b HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request: Invalid char in url path"),
    ],
    ids=["http2", "http09", "te-in-http10", "te-not-chunked", "no-host", "connect", "garbage", "bad-target"],
)
async def test_a_request_the_server_does_not_serve_gets_an_exact_refusal(data, status, message):
    async with serving() as s:
        assert await s.exchange(data) == refusal(status, message)
        assert not s.app.seen
        await until(lambda: not s.server.connections, "the connection to be closed")


async def test_a_refusal_behind_a_reply_owed_waits_its_turn():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + b"NONSENSE\r\n\r\n")
        await until(lambda: s.app.seen, "the first request")
        assert s.server.requests_owed() == 2  # the one being answered, and the one refused (received in part)
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.rest() == refusal(400, "malformed request: Invalid method encountered")


# ---- limits, each at its boundary and one past it ---------------------------------------------------------


async def test_a_request_target_of_max_line_bytes_is_served_and_one_more_is_refused():
    async with serving(max_line=100) as s:
        target = "/" + "a" * 99
        assert await s.exchange(get(target, b"Connection: close\r\n")) == ok(
            b"GET %s " % target.encode(), b"Connection: close\r\n"
        )
        assert await s.exchange(get(target + "b")) == refusal(414, "request target too long")


async def test_a_request_target_is_counted_whole_when_it_arrives_in_pieces():
    async with serving(max_line=100) as s:
        for total, expected in ((100, None), (101, refusal(414, "request target too long"))):
            client = await s.connect()
            await client.send(b"GET /" + b"a" * 59)
            await until(lambda: s.server.requests_owed() == 1, "the first piece of the target")
            await client.send(b"a" * (total - 60) + b" HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
            target = b"/" + b"a" * (total - 1)
            assert await client.rest() == (expected or ok(b"GET %s " % target, b"Connection: close\r\n"))


async def test_a_bad_character_after_a_target_of_max_line_bytes_is_malformed_not_too_long():
    async with serving(max_line=100) as s:
        client = await s.connect()
        await client.send(b"GET /" + b"a" * 99)  # read whole: 100 bytes of target so far
        await until(lambda: s.server.requests_owed() == 1, "the target")
        await client.send(b"\x01 HTTP/1.1\r\nHost: h\r\n\r\n")
        assert await client.rest() == refusal(400, "malformed request: Invalid char in url path")


async def test_a_header_field_of_max_line_bytes_with_its_separators_is_served_and_one_more_is_refused():
    async with serving(max_line=100) as s:
        # counted as name + value + 4 (": " and CRLF): 3 + 93 + 4 = 100
        assert await s.exchange(get("/", b"X-A: %s\r\nConnection: close\r\n" % (b"v" * 93)))
        assert s.app.seen[0].headers["x-a"] == "v" * 93
        assert await s.exchange(get("/", b"X-A: %s\r\n" % (b"v" * 94))) == refusal(431, "header field too long")


async def test_max_headers_fields_are_served_on_every_request_and_one_more_is_refused():
    async with serving(max_headers=3) as s:
        client = await s.connect()
        for path in ("/1", "/2"):  # the count starts again with each request
            await client.send(get(path, b"X-1: a\r\nX-2: b\r\n"))
            assert await client.reply() == ok(b"GET %s " % path.encode())
        await client.send(get("/3", b"X-1: a\r\nX-2: b\r\nX-3: c\r\n"))
        assert await client.rest() == refusal(431, "too many header fields")


async def test_a_head_of_max_head_bytes_is_served_on_every_request_and_one_more_is_refused():
    # Host: h counts 9 (4 + 1 + 4); X-A: v*n counts 3 + n + 4
    async with serving(max_head=200) as s:
        client = await s.connect()
        for path in ("/1", "/2"):  # the count starts again with each request
            await client.send(get(path, b"X-A: %s\r\n" % (b"v" * 184)))
            assert await client.reply() == ok(b"GET %s " % path.encode())
        await client.send(get("/3", b"X-A: %s\r\n" % (b"v" * 185)))
        assert await client.rest() == refusal(431, "request head too large")


async def test_a_head_trickling_in_is_counted_as_it_arrives_not_only_when_fields_end():
    async with serving(max_head=200) as s:
        client = await s.connect()
        await client.send(b"GET / HTTP/1.1\r\nHost: h\r\nX-A: ")  # the read a head begins in is counted by field: 9
        await until(lambda: s.server.requests_owed() == 1, "the head to begin")
        await client.send(b"v" * 191)  # later reads count whole: 9 + 191 = 200, the limit
        await client.quiet(0.1)
        await client.send(b"v")
        assert await client.rest() == refusal(431, "request head too large")


async def test_max_pipeline_requests_queued_behind_the_one_answered_are_served_and_one_more_is_refused():
    async with serving(max_pipeline=2) as s:
        client = await s.connect()
        await client.send(get("/1") + get("/2") + get("/3"))
        for path in (b"/1", b"/2", b"/3"):
            assert await client.reply() == ok(b"GET %s " % path)
        await client.send(get("/4") + get("/5") + get("/6") + get("/7"))
        for path in (b"/4", b"/5", b"/6"):
            assert await client.reply() == ok(b"GET %s " % path)
        assert await client.rest() == refusal(429, "too many pipelined requests")
        assert s.app.paths == ["/1", "/2", "/3", "/4", "/5", "/6"]


async def test_a_body_of_max_body_bytes_is_read_and_one_announced_past_it_is_handed_over_unread():
    async with serving(max_body=10) as s:
        client = await s.connect()
        await client.send(post("/a", b"0123456789"))
        assert await client.reply() == ok(b"POST /a 0123456789")
        gate = s.app.gate("/b")
        await client.send(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n")  # the body never comes
        await until(lambda: len(s.app.seen) == 2, "the request handed over")
        assert s.server.requests_owed() == 1  # no request is being received any more
        gate.set()
        assert await client.rest() == whole_reply(413, b"too large", b"Connection: close\r\n")
        big = s.app.seen[1]
        assert big.body is None and big.keep_alive is False


async def test_a_request_handed_over_before_its_body_is_answered_however_long_its_handler_takes():
    async with serving(max_body=10, keepalive=0.1, head_timeout=0.1, body_timeout=0.1) as s:
        gate = s.app.gate("/b")
        client = await s.connect()
        await client.send(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n")
        await until(lambda: s.app.seen, "the request handed over")
        await client.quiet(0.3)  # past every clock the connection had before the request was handed over
        gate.set()
        assert await client.rest() == whole_reply(413, b"too large", b"Connection: close\r\n")


async def test_a_chunked_body_of_max_body_bytes_is_read_and_one_chunked_past_it_is_handed_over_at_once():
    async with serving(max_body=10) as s:
        client = await s.connect()
        await client.send(chunked_head("/a") + b"6\r\nabcdef\r\n4\r\nghij\r\n0\r\n\r\n")
        assert await client.reply() == ok(b"POST /a abcdefghij")
        await client.send(chunked_head("/b") + b"6\r\nabcdef\r\n5\r\nghijk\r\n")  # no last chunk: not waited for
        assert await client.rest() == whole_reply(413, b"too large", b"Connection: close\r\n")
        assert s.app.seen[1].body is None


async def test_chunked_framing_far_beyond_the_body_it_carries_is_refused_past_its_allowance():
    # Every byte read while the body is parsed counts, the head's included:
    # at most 2 * max_body + max_head + 65536 = 20 + 1024 + 65536 = 66580.
    async with serving(max_body=10, max_head=1024) as s:
        client = await s.connect()
        head = chunked_head("/f")
        await client.send(head)
        await until(lambda: s.server.requests_owed() == 1, "the head")
        await client.send(b"0" * (66580 - len(head)))  # leading zeros of one chunk size
        await client.quiet(0.1)
        await client.send(b"0")
        assert await client.rest() == refusal(413, "request body framing too large")
        assert not s.app.seen


async def test_requests_owed_counts_the_request_answered_those_queued_and_one_begun():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await until(lambda: len(s.server.connections) == 1, "the connection")
        assert s.server.requests_owed() == 0
        await client.send(b"GET /slow HTTP/1.1\r\n")
        await until(lambda: s.server.requests_owed() == 1, "a head begun")
        await client.send(b"Host: h\r\n\r\n" + get("/1") + get("/2"))
        await until(lambda: s.app.seen, "the first request")
        assert s.server.requests_owed() == 3
        await client.send(b"GET /3 HTTP")  # held while replies are owed: one more begun
        await until(lambda: s.server.requests_owed() == 4, "the held bytes")
        gate.set()
        for path in (b"/slow", b"/1", b"/2"):
            assert await client.reply() == ok(b"GET %s " % path)
        assert s.server.requests_owed() == 1
        await client.send(b"/1.1\r\nHost: h\r\n\r\n")
        assert await client.reply() == ok(b"GET /3 ")
        assert s.server.requests_owed() == 0


# ---- order: one reply at a time, nothing parsed ahead of a reply owed --------------------------------------


async def test_pipelined_requests_are_handled_one_at_a_time_and_answered_in_order():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/first") + get("/slow") + get("/fast"))
        assert await client.reply() == ok(b"GET /first ")
        await until(lambda: len(s.app.seen) == 2, "the slow request")
        await client.quiet(0.05)
        assert s.app.paths == ["/first", "/slow"]  # /fast waits for /slow's reply
        assert s.conn.timer is None  # no idle, head or body clock runs while a reply is owed
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.reply() == ok(b"GET /fast ")


async def test_bytes_arriving_while_a_reply_is_owed_are_parsed_only_after_it():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow"))
        await until(lambda: s.app.seen, "the slow request")
        # Held, not parsed: its 100 Continue must not overtake the reply owed to /slow.
        await client.send(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-Continue\r\n\r\n")
        await until(lambda: s.server.requests_owed() == 2, "the held bytes")
        await client.send(b"h")  # held too, behind the rest
        await client.quiet(0.05)
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.reply() == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"i")
        assert await client.reply() == ok(b"POST /b hi")


async def test_100_continue_is_sent_once_whatever_the_body_reads_and_never_without_the_expectation():
    async with serving() as s:
        client = await s.connect()
        await client.send(b"POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n")
        assert await client.reply() == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"a")
        await until(lambda: s.conn.body == b"a", "the first byte of the body")
        await client.send(b"b")
        await until(lambda: s.conn.body == b"ab", "the second byte of the body")
        await client.send(b"c")
        assert await client.reply() == ok(b"POST /e abc")
        await client.send(b"POST /n HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n")
        await until(lambda: s.server.requests_owed() == 1, "the head")
        await client.send(b"x")
        await until(lambda: s.conn.body == b"x", "the first byte of the body")
        await client.send(b"y")
        assert await client.reply() == ok(b"POST /n xy")


async def test_100_continue_for_a_request_pipelined_behind_others_follows_their_replies_once():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        expecting = b"POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        await client.send(get("/slow") + get("/2") + expecting)  # parsed together, the body awaited
        await until(lambda: s.app.seen, "the slow request")
        await client.quiet(0.05)
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.reply() == ok(b"GET /2 ")
        assert await client.reply() == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"h")
        await until(lambda: s.conn.body == b"h", "the first byte of the body")
        await client.send(b"i")
        assert await client.reply() == ok(b"POST /c hi")


async def test_100_continue_waits_for_the_end_of_a_head_begun_behind_a_reply():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(
            get("/slow") + b"POST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n"
        )
        await until(lambda: s.app.seen, "the slow request")
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        await client.quiet(0.05)
        await client.send(b"\r\n")
        assert await client.reply() == b"HTTP/1.1 100 Continue\r\n\r\n"
        await client.send(b"hi")
        assert await client.reply() == ok(b"POST /c hi")


async def test_a_reading_paused_for_held_bytes_resumes_once_every_request_in_them_is_answered():
    async with serving(max_head=1024) as s:
        client = await s.connect()
        for round in ("1", "2"):  # and pauses again the next time
            slow, last = s.app.gate(f"/slow{round}"), s.app.gate(f"/last{round}")
            await client.send(get(f"/slow{round}"))
            await until(lambda: s.app.seen and s.app.seen[-1].path.startswith("/slow"), "the slow request")
            paths = [f"/{i}" for i in range(18)] + [f"/last{round}"]
            held = b"".join(get(path, b"X-Pad: %s\r\n" % (b"p" * 50)) for path in paths)  # 86 to 91 bytes each
            await client.send(held[:1024])
            await until(lambda: len(s.conn.held) == 1024, "the held bytes")
            assert s.conn.transport.is_reading()  # up to max_head held, still reading
            await client.send(held[1024:])
            await until(lambda: not s.conn.transport.is_reading(), "reading to pause")
            slow.set()
            assert await client.reply() == ok(b"GET /slow%s " % round.encode())
            for path in paths[:-1]:
                assert await client.reply() == ok(b"GET %s " % path.encode())
            await until(lambda: s.app.seen[-1].path.startswith("/last"), "the last held request")
            assert not s.conn.transport.is_reading()  # until the last of them is answered
            last.set()
            assert await client.reply() == ok(b"GET /last%s " % round.encode())
            await until(lambda: s.conn.transport.is_reading(), "reading to resume")


@pytest.mark.parametrize(
    "bad, answer",
    [
        (b"NONSENSE\r\n\r\n", refusal(400, "malformed request: Invalid method encountered")),
        (get("/b", b"Host: again\r\n"), refusal(400, "repeated host header field")),
        (get("/up", b"Connection: Upgrade\r\nUpgrade: h2c\r\n"), ok(b"GET /up ", b"Connection: close\r\n")),
    ],
    ids=["malformed", "refused", "upgrade"],
)
async def test_bytes_after_the_last_request_parsed_are_dropped_not_held_while_replies_are_owed(bad, answer):
    async with serving(max_head=1024) as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + bad)
        await until(lambda: s.app.seen, "the slow request")
        await client.send(b"x" * 3000)  # more than max_head: would pause reading if it were held
        await client.quiet(0.05)
        assert not s.conn.held and s.conn.transport.is_reading()
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.rest() == answer


async def test_a_reading_paused_for_one_large_held_request_resumes_only_once_it_is_answered():
    async with serving(max_body=4096, max_head=1024) as s:
        slow, big = s.app.gate("/slow"), s.app.gate("/big")
        client = await s.connect()
        await client.send(get("/slow"))
        await until(lambda: s.app.seen, "the slow request")
        await client.send(post("/big", b"x" * 2000))
        await until(lambda: not s.conn.transport.is_reading(), "reading to pause")
        slow.set()
        assert await client.reply() == ok(b"GET /slow ")
        await until(lambda: len(s.app.seen) == 2, "the held request")
        assert not s.conn.transport.is_reading()  # nothing more would be parsed before its reply anyway
        big.set()
        assert await client.reply() == ok(b"POST /big " + b"x" * 2000)
        await until(lambda: s.conn.transport.is_reading(), "reading to resume")


async def test_a_request_with_connection_close_is_answered_then_the_connection_closes():
    async with serving() as s:
        raw = await s.exchange(get("/a", b"Connection: close\r\n") + get("/never"))
        assert raw == ok(b"GET /a ", b"Connection: close\r\n")
        assert s.app.paths == ["/a"]
        await until(lambda: not s.server.connections, "the connection to be forgotten")


async def test_an_upgrade_request_is_answered_with_connection_close_and_what_follows_is_ignored():
    async with serving() as s:
        raw = await s.exchange(
            get("/up", b"Connection: Upgrade\r\nUpgrade: h2c\r\n") + b"PRI * HTTP/2.0\r\n\r\n" + get("/never")
        )
        assert raw == ok(b"GET /up ", b"Connection: close\r\n")
        assert s.app.paths == ["/up"] and s.app.seen[0].keep_alive is False


async def test_an_upgrade_behind_a_reply_owed_is_answered_in_turn_and_closes():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + get("/up", b"Connection: Upgrade\r\nUpgrade: h2c\r\n") + b"\x00\x01")
        await until(lambda: s.app.seen, "the slow request")
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.rest() == ok(b"GET /up ", b"Connection: close\r\n")


# ---- timeouts ---------------------------------------------------------------------------------------------


async def test_an_idle_connection_closes_after_keepalive_without_a_word():
    async with serving(keepalive=0.05) as s:
        client = await s.connect()
        await client.send(get("/a"))
        assert await client.reply() == ok(b"GET /a ")
        started = time.monotonic()
        assert await client.rest() == b""
        assert time.monotonic() - started < 0.9
        await until(lambda: not s.server.connections, "the connection to be forgotten")


async def test_the_idle_clock_stops_while_a_request_is_handled_and_starts_again_at_its_reply():
    async with serving(keepalive=0.3) as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow"))
        await until(lambda: s.app.seen, "the slow request")
        await client.quiet(0.2)
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        await client.quiet(0.2)  # 0.4 s after the connection opened, 0.2 s after the reply
        assert await client.rest() == b""


async def test_empty_lines_between_requests_do_not_keep_an_idle_connection_open():
    async with serving(keepalive=0.3) as s:
        client = await s.connect()
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 2.0:
            try:
                async with asyncio.timeout(0.1):
                    closed = await client.reader.read(1) == b""
            except TimeoutError:
                with contextlib.suppress(ConnectionError):
                    await client.send(b"\r\n")
        assert closed, "an idle connection sending only empty lines was kept open"


async def test_a_head_not_complete_within_head_timeout_gets_408():
    async with serving(head_timeout=0.1) as s:
        client = await s.connect()
        started = time.monotonic()
        await client.send(b"GET / HTTP/1.1\r\nHost: h\r\n")
        assert await client.rest() == refusal(408, "request head not received in time")
        assert time.monotonic() - started < 0.9


async def test_a_body_not_complete_within_body_timeout_gets_408():
    async with serving(body_timeout=0.1, body_min_rate=1e12) as s:
        client = await s.connect()
        started = time.monotonic()
        await client.send(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nab")
        assert await client.rest() == refusal(408, "request body not received in time")
        assert time.monotonic() - started < 0.9


async def test_a_body_arriving_within_body_timeout_is_waited_for():
    async with serving(body_timeout=0.5, body_min_rate=1e12) as s:
        client = await s.connect()
        await client.send(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n")
        await until(lambda: s.server.requests_owed() == 1, "the head")
        await client.quiet(0.05)
        await client.send(b"ok")
        assert await client.reply() == ok(b"POST /b ok")


async def test_each_byte_received_extends_the_body_deadline_by_one_over_body_min_rate():
    # The read the head came in counts too: 49 bytes at 100 bytes/s allow 0.49 s on top of 0.2 s.
    async with serving(body_timeout=0.2, body_min_rate=100) as s:
        client = await s.connect()
        head = b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n"
        await client.send(head + b"a")
        await client.quiet(0.35)  # past body_timeout, well within the allowance
        await client.send(b"bc")
        assert await client.reply() == ok(b"POST /b abc")
    async with serving(body_timeout=0.05, body_min_rate=1000) as s:  # 0.05 + 0.051 s, then 408
        client = await s.connect()
        await client.send(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 50\r\n\r\n" + b"a" * 2)
        assert await client.rest() == refusal(408, "request body not received in time")


async def test_a_head_begun_while_a_reply_was_owed_gets_its_full_head_timeout_after_the_reply():
    async with serving(head_timeout=0.15) as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + b"GET /next HTTP/1.1\r\n")  # parsed with /slow: a head begun
        await until(lambda: s.app.seen, "the slow request")
        await client.quiet(0.25)  # longer than head_timeout
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        await client.send(b"Host: h\r\n\r\n")
        assert await client.reply() == ok(b"GET /next ")


async def test_a_head_begun_then_held_while_a_reply_was_owed_gets_its_full_head_timeout_after_the_reply():
    async with serving(head_timeout=0.15) as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + b"GET /next HTTP/1.1\r\n")
        await until(lambda: s.app.seen, "the slow request")
        await client.send(b"Host: h\r\n")  # held
        await until(lambda: s.conn.held, "the held bytes")
        await client.quiet(0.25)
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        await client.send(b"\r\n")
        assert await client.reply() == ok(b"GET /next ")


async def test_a_body_begun_while_a_reply_was_owed_gets_its_full_body_timeout_after_the_reply():
    async with serving(body_timeout=0.15, body_min_rate=1e12) as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + b"POST /next HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nx")
        await until(lambda: s.app.seen, "the slow request")
        await client.quiet(0.25)
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        await client.send(b"y")
        assert await client.reply() == ok(b"POST /next xy")


# ---- backpressure: a reply leaves before the next request is read ------------------------------------------


async def sized(request: HttpRequest) -> Response:
    """Answers a body of as many bytes as the path says (/8000000), `x` each."""
    return Response(b"x" * int(request.path[1:]))


async def silent_client(address: tuple[str, int]) -> socket.socket:
    """A client with a small receive window that sends and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, address)
    return sock


async def test_a_client_that_stops_reading_is_cut_after_send_timeout_and_what_it_sent_next_is_never_handled():
    seen: list[str] = []

    async def handler(request: HttpRequest) -> Response:
        seen.append(request.path)
        return await sized(request)

    async with serving(handler, send_timeout=0.2) as s:
        sock = await silent_client(s.address)
        try:
            await asyncio.get_running_loop().sock_sendall(sock, get("/8000000") + get("/10"))
            await until(lambda: s.server.connections and s.conn.drained is not None, "the send buffer to fill")
            started = time.monotonic()
            await until(lambda: not s.server.connections, "the connection to be cut")
            assert 0.1 < time.monotonic() - started < 2.0
            assert seen == ["/8000000"]
        finally:
            sock.close()


async def test_a_client_that_stops_reading_a_closing_reply_is_cut_after_send_timeout():
    async with serving(sized, send_timeout=0.2) as s:
        sock = await silent_client(s.address)
        try:
            await until(lambda: len(s.server.connections) == 1, "the connection")
            # small kernel buffers, a reply that outgrows them but not the transport's high-water mark
            s.conn.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            await asyncio.get_running_loop().sock_sendall(sock, get("/60000", b"Connection: close\r\n"))
            await until(lambda: s.conn.task is None and s.conn.transport.get_write_buffer_size(), "the reply to wait")
            assert s.conn.drained is None and s.conn.transport.is_closing()
            await until(lambda: not s.server.connections, "the connection to be cut")
        finally:
            sock.close()


async def test_a_client_reading_slowly_gets_the_whole_reply_then_the_next_one():
    async with serving(sized, send_timeout=30) as s:
        client = await s.connect()
        await client.send(get("/8000000") + get("/3"))
        assert await client.reply() == ok(b"x" * 8000000)
        assert await client.reply() == ok(b"xxx")


async def test_a_stream_to_a_client_that_stops_reading_fails_its_writes_with_connection_reset():
    failures: list[str] = []

    async def stream(request: HttpRequest) -> StreamResponse:
        out = StreamResponse()
        await out.prepare(request)
        try:
            while True:
                await out.write(b"x" * 65536)
        except ConnectionResetError as exc:
            failures.append(str(exc))
        return out

    async with serving(stream, send_timeout=0.1) as s:
        sock = await silent_client(s.address)
        try:
            await asyncio.get_running_loop().sock_sendall(sock, get("/s"))
            await until(lambda: failures, "the stream to fail")
            assert failures == ["client stopped reading"]
            await until(lambda: not s.server.connections, "the connection to be cut")
        finally:
            sock.close()


# ---- streamed replies and handler failures ---------------------------------------------------------------


async def test_a_stream_returned_unprepared_is_sent_empty_and_the_connection_kept():
    async def handler(request: HttpRequest) -> StreamResponse | Response:
        if request.path == "/s":
            return StreamResponse(201, {"X-S": "1"})
        return Response(b"next")

    async with serving(handler) as s:
        client = await s.connect()
        await client.send(get("/s"))
        assert await client.reply() == b"HTTP/1.1 201 Created\r\nX-S: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        await client.send(get("/n"))
        assert await client.reply() == ok(b"next")


async def test_a_handler_failing_after_a_stream_on_the_same_connection_gets_a_500_not_a_cut(caplog):
    async def handler(request: HttpRequest) -> StreamResponse:
        if request.path == "/boom":
            raise RuntimeError("handler bug")
        out = StreamResponse()
        await out.prepare(request)
        await out.write(b"data")
        return out

    async with serving(handler) as s:
        client = await s.connect()
        await client.send(get("/s"))
        assert await client.reply() == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\n0\r\n\r\n"
        await client.send(get("/boom"))
        assert await client.reply() == refusal(500, "internal router error", closing=False)
        assert errors(caplog) == ["unhandled error answering GET /boom"]
        await client.send(get("/s"))
        assert await client.reply() == b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\n0\r\n\r\n"


async def test_a_handler_failure_is_logged_with_the_request_it_failed(caplog):
    async def handler(request: HttpRequest) -> Response:
        raise RuntimeError("handler bug")

    async with serving(handler) as s:
        client = await s.connect()
        await client.send(get("/boom?q=1"))
        assert await client.reply() == refusal(500, "internal router error", closing=False)
    assert errors(caplog) == ["unhandled error answering GET /boom"]


@pytest.mark.parametrize(
    "bad, why",
    [
        (Response(b"x", "200"), "%d format: a real number is required, not str"),  # type: ignore[arg-type]
        (Response(b"x", None), "%d format: a real number is required, not NoneType"),  # type: ignore[arg-type]
        (Response(b"x", headers={"X-A": "a\r\nX-B: b"}), "CR or LF in a response header"),
    ],
    ids=["str-status", "no-status", "crlf-header"],
)
async def test_a_reply_that_cannot_be_rendered_is_a_500_and_a_closed_connection(caplog, bad, why):
    handled: list[HttpRequest] = []

    async def handler(request: HttpRequest) -> Response:
        handled.append(request)
        return bad

    async with serving(handler) as s:
        assert await s.exchange(get("/bad")) == refusal(500, "internal router error")
        assert handled[0].keep_alive is False
        assert errors(caplog) == [f"refused to write a malformed reply to GET /bad: {why}"]
        client = await s.connect()  # the server serves on
        await client.send(b"GET /bad HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert await client.rest() == refusal(500, "internal router error")
        assert len(errors(caplog)) == 1


async def test_a_streamed_reply_that_cannot_be_rendered_cuts_the_connection(caplog):
    async def handler(request: HttpRequest) -> StreamResponse:
        return StreamResponse("200")  # type: ignore[arg-type]

    async with serving(handler) as s:
        assert await s.exchange(get("/bad")) in (b"", b"<reset>")
        await until(lambda: not s.server.connections, "the connection to be cut")
    assert errors(caplog) == ["failed to write the reply to GET /bad"]


async def test_a_failure_inside_the_parser_callbacks_is_a_500_and_a_closed_connection(caplog):
    async with serving(max_headers=None) as s:  # type: ignore[arg-type]  # a limit that cannot be compared
        assert await s.exchange(get("/")) == refusal(500, "internal router error")
        (message,) = errors(caplog)
        assert message.startswith("request parser callback failed: TypeError(")


async def test_a_client_leaving_cancels_its_request_and_the_connection_is_forgotten():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow"))
        await until(lambda: s.app.seen, "the request")
        (request,) = s.app.seen
        assert request.connection.closed is False
        client.writer.transport.abort()
        await until(lambda: s.app.cancelled, "the request to be cancelled")
        assert request.connection.closed is True
        await until(lambda: not s.server.connections, "the connection to be forgotten")
        assert not gate.is_set()


async def test_connections_are_tracked_from_open_to_close():
    async with serving() as s:
        first, second = await s.connect(), await s.connect()
        await until(lambda: len(s.server.connections) == 2, "both connections")
        first.writer.transport.abort()
        await until(lambda: len(s.server.connections) == 1, "the first connection to be forgotten")
        await second.send(get("/x"))
        assert await second.reply() == ok(b"GET /x ")


# ---- the graceful shutdown -------------------------------------------------------------------------------


async def test_shutdown_closes_idle_connections_at_once_and_answers_a_request_being_handled_with_close():
    async with serving() as s:
        gate = s.app.gate("/slow")
        busy, idle = await s.connect(), await s.connect()
        await busy.send(get("/slow"))
        await until(lambda: s.app.seen and len(s.server.connections) == 2, "the request and both connections")
        shutdown = asyncio.create_task(s.server.shutdown(WAIT))
        assert await idle.rest() == b""
        assert not shutdown.done() and s.server.shutting_down is True
        gate.set()
        assert await busy.rest() == ok(b"GET /slow ", b"Connection: close\r\n")
        assert s.app.seen[0].keep_alive is False
        async with asyncio.timeout(WAIT):
            assert await shutdown == 0
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(*s.address)


async def test_shutdown_answers_pipelined_requests_and_only_the_last_reply_says_close():
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        await client.send(get("/slow") + get("/2"))
        await until(lambda: s.app.seen, "the slow request")
        shutdown = asyncio.create_task(s.server.shutdown(WAIT))
        await until(lambda: s.server.shutting_down, "the shutdown")
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        assert await client.rest() == ok(b"GET /2 ", b"Connection: close\r\n")
        async with asyncio.timeout(WAIT):
            assert await shutdown == 0


@pytest.mark.parametrize("parsed", [True, False], ids=["begun", "held"])
async def test_shutdown_answers_a_request_begun_behind_the_one_handled_and_only_that_reply_says_close(parsed):
    async with serving() as s:
        gate = s.app.gate("/slow")
        client = await s.connect()
        if parsed:  # in the same read as /slow: its head is parsed as far as it goes
            await client.send(get("/slow") + b"GET /2 HTTP/1.1\r\n")
            await until(lambda: s.app.seen, "the slow request")
        else:  # after /slow was handed over: held unparsed
            await client.send(get("/slow"))
            await until(lambda: s.app.seen, "the slow request")
            await client.send(b"GET /2 HTTP/1.1\r\n")
            await until(lambda: s.conn.held, "the held bytes")
        shutdown = asyncio.create_task(s.server.shutdown(WAIT))
        await until(lambda: s.server.shutting_down, "the shutdown")
        assert s.server.requests_owed() == 2
        gate.set()
        assert await client.reply() == ok(b"GET /slow ")
        await client.send(b"Host: h\r\n\r\n")
        assert await client.rest() == ok(b"GET /2 ", b"Connection: close\r\n")
        async with asyncio.timeout(WAIT):
            assert await shutdown == 0


async def test_shutdown_cuts_what_is_left_at_its_deadline_and_counts_it():
    async with serving() as s:
        s.app.gate("/slow")  # never opens
        client = await s.connect()
        await client.send(get("/slow") + get("/2"))
        await until(lambda: s.app.seen, "the slow request")
        async with asyncio.timeout(WAIT):
            assert await s.server.shutdown(0.1) == 2
        assert s.app.cancelled == s.app.seen
        assert await client.rest() in (b"", b"<reset>")
        await until(lambda: not s.server.connections, "the connection to be gone")


async def test_shutdown_waits_for_every_busy_connection():
    async with serving() as s:
        gates = [s.app.gate("/a"), s.app.gate("/b")]
        clients = [await s.connect(), await s.connect()]
        await clients[0].send(get("/a"))
        await clients[1].send(get("/b"))
        await until(lambda: len(s.app.seen) == 2, "both requests")
        shutdown = asyncio.create_task(s.server.shutdown(WAIT))
        gates[0].set()
        assert await clients[0].rest() == ok(b"GET /a ", b"Connection: close\r\n")
        await until(lambda: len(s.server.connections) == 1, "the first connection to be gone")
        await clients[1].quiet(0.02)
        assert not shutdown.done()
        gates[1].set()
        assert await clients[1].rest() == ok(b"GET /b ", b"Connection: close\r\n")
        async with asyncio.timeout(WAIT):
            assert await shutdown == 0


async def test_a_stream_prepared_during_the_shutdown_says_close():
    started = asyncio.Event()
    go = asyncio.Event()

    async def handler(request: HttpRequest) -> StreamResponse:
        started.set()
        await go.wait()
        out = StreamResponse()
        await out.prepare(request)
        await out.write(b"end")
        return out

    async with serving(handler) as s:
        client = await s.connect()
        await client.send(get("/s"))
        await started.wait()
        shutdown = asyncio.create_task(s.server.shutdown(WAIT))
        await until(lambda: s.server.shutting_down, "the shutdown")
        go.set()
        assert await client.rest() == (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nend\r\n0\r\n\r\n"
        )
        async with asyncio.timeout(WAIT):
            assert await shutdown == 0


async def test_a_connection_opened_as_the_shutdown_begins_gets_one_reply_then_closes():
    async with serving() as s:
        s.server.shutting_down = True  # accepted in the instant before the listener closed
        raw = await s.exchange(get("/last"))
        assert raw == ok(b"GET /last ", b"Connection: close\r\n")


async def test_shutdown_with_no_connections_returns_at_once():
    async with serving() as s:
        async with asyncio.timeout(WAIT):
            assert await s.server.shutdown(60) == 0


# ---- the listener ---------------------------------------------------------------------------------------


async def test_a_server_not_listening_yet_has_no_sockets_and_closes_quietly():
    server = HttpServer()
    assert server.shutting_down is False and server.connections == set() and server.requests_owed() == 0
    server.close()
    with pytest.raises(AssertionError, match=r"^not listening$"):
        server.sockets  # noqa: B018


async def test_start_server_listens_on_exactly_the_host_and_port_given():
    port = free_port()
    server = await start_server(App(), 64, host="127.0.0.1", port=port)
    try:
        assert [sock.getsockname() for sock in server.sockets] == [("127.0.0.1", port)]
    finally:
        server.close()


def listen_backlog(sock: socket.socket) -> int:
    """The accept queue a listening socket was given (Linux reports it as tcpi_sacked of TCP_INFO)."""
    return struct.unpack_from("<8B6I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104))[13]


def somaxconn() -> int:
    try:
        return int(Path("/proc/sys/net/core/somaxconn").read_text())
    except OSError:
        return 0


@pytest.mark.skipif(
    not hasattr(socket, "TCP_INFO") or somaxconn() <= 1024,
    reason="needs Linux with net.core.somaxconn above 1024 to read the backlog asked for",
)
async def test_the_listener_queues_up_to_1024_connections_not_yet_accepted():
    server = await start_server(App(), 64, host="127.0.0.1", port=0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    given = await start_server(App(), 64, sock=sock)
    try:
        assert [listen_backlog(s) for s in (*server.sockets, *given.sockets)] == [1024, 1024]
    finally:
        server.close()
        given.close()


async def test_start_server_needs_a_port_or_a_socket_and_serves_on_a_socket_it_is_given():
    with pytest.raises(ValueError, match=r"^start_server needs a port or a listening socket$"):
        await start_server(App(), 64, host="127.0.0.1")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = App()
    server = await start_server(app, 64, sock=sock)
    try:
        assert server.sockets[0].getsockname() == sock.getsockname()
        reader, writer = await asyncio.open_connection(*sock.getsockname())
        writer.write(get("/s", b"Connection: close\r\n"))
        async with asyncio.timeout(WAIT):
            assert await reader.read() == ok(b"GET /s ", b"Connection: close\r\n")
        writer.close()
        await writer.wait_closed()
    finally:
        server.close()
