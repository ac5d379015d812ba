"""The router's inbound HTTP/1.1 server, on a raw asyncio protocol.

aiohttp's server cost about as much router CPU per request as the rest of the router, so
the router parses requests itself: keep-alive and in-order pipelining, Content-Length and
chunked request bodies, `Expect: 100-continue`, a body-size limit (the handler answers it:
`HttpRequest.read` raises `BodyTooLarge`), whole replies in one write and streamed replies
as chunks. Each request runs as its own task, cancelled when the client disconnects, so
every backend call it has open is aborted too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from .protocol import error_body

log = logging.getLogger("epd_router.http")

MAX_HEAD = 64 * 1024
KEEPALIVE = 75.0  # seconds an idle client connection stays open (aiohttp's default)
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


class BodyTooLarge(Exception):
    pass


class HttpRequest:
    __slots__ = ("method", "path", "query", "headers", "body", "_conn")

    def __init__(self, method: str, path: str, query: str, headers: dict[str, str], body: bytes | None, conn: "HttpConnection") -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-case names
        self.body = body  # None: over the size limit, not read
        self._conn = conn

    async def read(self) -> bytes:
        if self.body is None:
            raise BodyTooLarge
        return self.body


class Response:
    """A whole reply, written in one go with its Content-Length."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, body: bytes = b"", status: int = 200, headers: dict[str, str] | None = None, content_type: str | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type


class StreamResponse:
    """A reply written as it is produced (SSE): chunked for HTTP/1.1 clients, until-close for 1.0."""

    __slots__ = ("status", "headers", "_conn", "_chunked", "_ended")

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers if headers is not None else {}
        self._conn: HttpConnection | None = None
        self._chunked = True
        self._ended = False

    async def prepare(self, request: HttpRequest) -> None:
        conn = self._conn = request._conn
        conn.streaming = True
        self._chunked = not conn.http10
        if not self._chunked:
            conn.keep_alive = False
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b"Connection: close\r\n"
        conn.send(_head(self.status, self.headers) + framing + b"\r\n")

    async def write(self, data: bytes) -> None:
        if not data:
            return
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("client closed the connection")
        conn.send(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if conn.drained is not None:
            await conn.drained

    async def write_eof(self) -> None:
        if self._ended:
            return
        self._ended = True
        conn = self._conn
        if self._chunked and not conn.closed:
            conn.send(b"0\r\n\r\n")


Handler = Callable[[HttpRequest], Awaitable["Response | StreamResponse"]]


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return b"HTTP/1.1 %d %s\r\n%s" % (status, _REASONS.get(status, b"Unknown"), lines.encode("latin-1"))


def _error(status: int, message: str) -> Response:
    return Response(error_body(message, status), status, {"Content-Type": "application/json"})


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests from `buf` and answers them in order."""

    def __init__(self, handler: Handler, max_body: int) -> None:
        self.handler = handler
        self.max_body = max_body
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.task: asyncio.Task | None = None
        self.closed = False
        self.keep_alive = True
        self.http10 = False
        self.drained: asyncio.Future | None = None  # set while the transport's buffer is full
        self.continued = False  # 100 Continue already sent for the request being received
        self.streaming = False  # a streamed reply has started
        self.idle_timer: asyncio.TimerHandle | None = None
        self.receiving = False  # bytes arrived since the idle timer was armed

    # ---- asyncio.Protocol ----

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.idle_timer = self.loop.call_later(KEEPALIVE, self._idle_out)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.receiving = True
        if self.task is None:
            self._next_request()
        elif len(self.buf) > self.max_body + MAX_HEAD:
            self.transport.pause_reading()  # a client pipelining more than we will hold

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        if self.task is not None:
            self.task.cancel()  # the client left: stop its request and its backend calls
        self._wake_writer()

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    def _wake_writer(self) -> None:
        fut, self.drained = self.drained, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ---- requests ----

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _idle_out(self) -> None:
        if self.task is not None or self.closed:
            return
        if self.buf and self.receiving:  # a request still arriving, slowly but surely
            self.receiving = False
            self.idle_timer = self.loop.call_later(KEEPALIVE, self._idle_out)
            return
        self.transport.close()

    def _next_request(self) -> None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._refuse(431, "request head too large")
            return
        try:
            method, target, version, headers = _parse_head(bytes(buf[:end]))
        except ValueError as exc:
            self._refuse(400, str(exc))
            return
        start = end + 4
        body: bytes | None
        if "chunked" in headers.get("transfer-encoding", "").lower():
            try:
                parsed = _dechunk(buf, start, self.max_body)
            except ValueError:
                self._refuse(400, "bad chunk size")
                return
            if parsed is None:
                self._maybe_continue(headers)
                return
            body, body_end = parsed
            if body is None:
                self.keep_alive = False  # the rest of the body is still coming: close after answering
                body_end = len(buf)
        else:
            try:
                length = int(headers.get("content-length", "0"))
                if length < 0:
                    raise ValueError
            except ValueError:
                self._refuse(400, "bad Content-Length")
                return
            if length > self.max_body:
                body, body_end = None, len(buf)  # answered by the handler, then closed
                self.keep_alive = False
            elif len(buf) - start < length:
                self._maybe_continue(headers)
                return
            else:
                body_end = start + length
                body = bytes(buf[start:body_end])
        del buf[:body_end]
        self.continued = False
        self.streaming = False
        self.http10 = version == "HTTP/1.0"
        connection = headers.get("connection", "").lower()
        if self.http10:
            self.keep_alive = self.keep_alive and connection == "keep-alive"
        elif connection == "close":
            self.keep_alive = False
        path, _, query = target.partition("?")
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        self.task = self.loop.create_task(self._answer(HttpRequest(method, path, query, headers, body, self)))

    def _maybe_continue(self, headers: dict[str, str]) -> None:
        if not self.continued and headers.get("expect", "").lower() == "100-continue":
            self.continued = True
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse(self, status: int, message: str) -> None:
        self.keep_alive = False
        self._write_response(_error(status, message))
        self.transport.close()

    async def _answer(self, request: HttpRequest) -> None:
        try:
            response = await self.handler(request)
        except asyncio.CancelledError:
            return  # the client is gone
        except Exception:
            log.exception("unhandled error answering %s %s", request.method, request.path)
            if self.streaming:  # part of a reply is out: only cutting the connection tells the client
                self.transport.abort()
                return
            response = _error(500, "internal router error")
        if isinstance(response, StreamResponse):
            if response._conn is None:  # never prepared: nothing was sent yet
                await response.prepare(request)
            await response.write_eof()
        else:
            self._write_response(response)
        self.task = None
        if self.closed:
            return
        if not self.keep_alive:
            self.transport.close()
            return
        self.transport.resume_reading()
        if self.buf:
            self._next_request()
        else:
            self.receiving = False
            self.idle_timer = self.loop.call_later(KEEPALIVE, self._idle_out)

    def _write_response(self, response: Response) -> None:
        body = response.body
        framing = b"Content-Length: %d\r\n" % len(body)
        if not self.keep_alive:
            framing += b"Connection: close\r\n"
        elif self.http10:
            framing += b"Connection: keep-alive\r\n"
        self.send(_head(response.status, response.headers) + framing + b"\r\n" + body)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ValueError("bad request line")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ValueError("bad header line")
        headers[name.lower()] = value.strip()
    return parts[0], parts[1], parts[2], headers


def _dechunk(buf: bytearray, pos: int, limit: int) -> tuple[bytes | None, int] | None:
    """A whole chunked body from `buf[pos:]`: (body, end), (None, _) once it exceeds `limit`,
    None while incomplete. Tried only when the buffer ends a line pair, as a last chunk does."""
    if not buf.endswith(b"\r\n\r\n") and len(buf) - pos <= limit:
        return None
    body = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)  # ValueError: a bad request
        pos = eol + 2
        if size == 0:
            while True:  # trailers, then an empty line
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                line_was_empty = eol == pos
                pos = eol + 2
                if line_was_empty:
                    return bytes(body), pos
        if len(body) + size > limit:
            return None, pos
        if len(buf) < pos + size + 2:
            return None
        body += buf[pos:pos + size]
        pos += size + 2


async def start_server(handler: Handler, max_body: int, *, host: str | None = None, port: int | None = None, sock=None) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: HttpConnection(handler, max_body), host, port, sock=sock, backlog=1024)
