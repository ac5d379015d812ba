"""What the router's HTTP/1.1 server hands its handlers and takes back: the parsed request, a
whole reply or a streamed one, and the limits a connection is held to (http_server.py parses
and writes; the handlers in server.py and pipeline.py only see these). A streamed reply writes
through `Connection`, the part of a client connection this module relies on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

from .protocol import error_body

_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}

# Header names as the router writes them; HTTP compares names without case, so one spelling each, here.
REQUEST_ID = "x-request-id"
CONTENT_TYPE = "Content-Type"
CACHE_CONTROL = "Cache-Control"
LATIN1 = "latin-1"  # HTTP/1.1 field bytes as characters, one each (RFC 9110 5.5)


@dataclass
class Limits:
    max_head: int = 64 * 1024  # request line + header fields, bytes
    max_headers: int = 100  # header fields in one request
    max_line: int = 8 * 1024  # request target, and each header field (name + value)
    max_pipeline: int = 32  # requests parsed ahead of the one being answered
    head_timeout: float = 10.0  # seconds from a head's first byte to its end
    body_timeout: float = 30.0  # seconds a body may take, plus 1 s per body_min_rate bytes received
    body_min_rate: float = 64 * 1024
    keepalive: float = 75.0  # seconds an idle connection stays open (aiohttp's default)
    send_timeout: float = 60.0  # seconds a client may leave the router's send buffer full


class BodyTooLarge(Exception):
    pass


class Connection(Protocol):
    """The client connection a request came on, as a streamed reply writes through it
    (http_server.HttpConnection is the one implementation)."""

    closed: bool  # the client is gone: nothing more reaches it
    drained: asyncio.Future | None  # set while the transport's buffer is full

    def begin_stream(self) -> None:
        """A streamed reply starts: from here, a handler's failure can only cut the connection."""

    def last_reply(self) -> bool:
        """Whether the reply about to be written is the connection's last: the server is shutting
        down and the client has sent nothing more to answer. Such a reply carries `Connection: close`."""

    def send(self, data: bytes) -> None:
        """Queue `data` for the client (dropped once it is gone)."""

    async def wait_drained(self) -> None:
        """Wait until the client took what the transport holds; raises ConnectionResetError for a
        client that stopped reading."""


class HttpRequest:
    __slots__ = ("method", "path", "query", "headers", "body", "keep_alive", "http10", "connection")

    def __init__(
        self,
        method: str,
        path: str,
        query: str,
        headers: dict[str, str],
        body: bytes | None,
        connection: Connection,
        keep_alive: bool = True,
        http10: bool = False,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # lower-case names
        self.body = body  # None: over the size limit, not read
        self.keep_alive = keep_alive
        self.http10 = http10
        self.connection = connection  # where a streamed reply to this request is written

    async def read(self) -> bytes:
        if self.body is None:
            raise BodyTooLarge
        return self.body


class Response:
    """A whole reply, written in one go with its Content-Length."""

    __slots__ = ("status", "body", "headers")

    def __init__(
        self,
        body: bytes = b"",
        status: int = 200,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> None:
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
        self._conn: Connection | None = None  # set by prepare, with _chunked
        self._ended = False

    @property
    def prepared(self) -> bool:
        """Whether the head was sent (`prepare`)."""
        return self._conn is not None

    async def prepare(self, request: HttpRequest) -> None:
        self._chunked = not request.http10  # before _conn: write and write_eof read it once _conn is set
        conn = self._conn = request.connection
        conn.begin_stream()
        if not self._chunked or conn.last_reply():
            request.keep_alive = False
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b""
        if not request.keep_alive:
            framing += b"Connection: close\r\n"
        conn.send(render_head(self.status, self.headers) + framing + b"\r\n")

    async def write(self, data: bytes) -> None:
        if not data:
            return
        conn = self._conn
        if conn is None:
            raise RuntimeError("StreamResponse.write before prepare")
        if conn.closed:
            raise ConnectionResetError("client closed the connection")
        conn.send(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        if conn.drained is not None:
            await conn.wait_drained()

    async def write_eof(self) -> None:
        if self._ended:
            return
        self._ended = True
        conn = self._conn
        if conn is not None and self._chunked and not conn.closed:
            conn.send(b"0\r\n\r\n")


# What a handler answers: a whole reply, or a streamed one (already written when returned).
Reply = Response | StreamResponse
Handler = Callable[[HttpRequest], Awaitable[Reply]]


def render_head(status: int, headers: dict[str, str]) -> bytes:
    lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    # A value carrying CR or LF would split the head: never let one out (values copied from a
    # request were checked by the parser; this is the last line of defence).
    if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
        raise ValueError("CR or LF in a response header")
    return b"HTTP/1.1 %d %s\r\n%s" % (status, _REASONS.get(status, b"Unknown"), lines.encode(LATIN1))


def error_response(status: int, message: str) -> Response:
    return Response(error_body(message, status), status, {"Content-Type": "application/json"})
