"""The router's HTTP/1.1 client to vLLM backends, on raw asyncio protocols and llhttp.

aiohttp's ClientSession cost more router CPU per request than all the routing logic
(bench/results/bench.md: the aiohttp floor alone spends most of the budget), so the data
path talks HTTP/1.1 itself: one keep-alive pool per backend origin, requests written in
one go, replies parsed by llhttp (through httptools) as they arrive, chunked framing
included. It speaks just what vLLM's uvicorn answers: Content-Length, chunked, or
read-until-close bodies; no compression (requests say `Accept-Encoding: identity`), 1xx
replies skipped, no pipelining: a connection that receives bytes nobody asked for is
never reused. A reply head is bounded in size and field count like a client's request.

POST is never retried here, not even on a reused connection that turns out closed: like
aiohttp, the caller decides (it retries on another backend). Idle connections retire
after `keepalive` seconds, well before vLLM's 5 s, so a reused one is rarely stale.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import typing
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from .http_messages import LATIN1

MAX_HEAD = 64 * 1024  # a reply head larger than this is not from a backend we understand
MAX_HEADERS = 100
PAUSE_ABOVE = 1 << 20  # stop reading a backend while this much is buffered for a slow client
IDNA = "idna"  # a Host header names an internationalised host in its ASCII (punycode) form


class TransportError(Exception):
    """The HTTP exchange with a backend broke (what a reply's status means is the caller's to
    judge). `kind`: connect (no reply started: refused, reset, closed) | timeout | read (the
    reply broke or made no sense after it started)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class _Connection(asyncio.Protocol):
    """One keep-alive connection. llhttp parses in data_received; the reader coroutine
    waits for the head, then takes body bytes from `body`."""

    __slots__ = (
        "loop",
        "transport",
        "eof",
        "error",
        "waiter",
        "paused",
        "idle_since",
        "parser",
        "status",
        "headers",
        "head_done",
        "head_bytes",
        "body",
        "complete",
        "keep_alive",
        "interim",
        "bad",
        "stray",
        "received",
    )

    # Set by connection_made, which create_connection runs before it hands the connection out.
    transport: asyncio.Transport
    # Set before they are read: by the parser once the head (status) or the reply (keep_alive) is
    # complete, and by BackendReply.release when the connection goes back to the pool (idle_since).
    status: int
    keep_alive: bool
    idle_since: float

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.parser: httptools.HttpResponseParser | None = None
        self.stray = False  # bytes arrived that belong to no request of ours
        self.bad: str | None = None  # why the reply could not be parsed

    def begin(self) -> None:
        """Ready to parse the reply to a request about to be sent."""
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.head_bytes = 0
        self.body = bytearray()
        self.complete = False
        self.interim = False
        self.received = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # a stream connection's

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self.parser is None or self.complete or self.bad:
            self.stray = True
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            self._broken(str(exc.__context__ or exc))
            return
        except httptools.HttpParserError as exc:
            self._broken(f"malformed reply: {exc}")
            return
        if not self.head_done:
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD:
                self._broken("reply head too large")
                return
        if len(self.body) > PAUSE_ABOVE and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def _broken(self, why: str) -> None:
        self.bad = why
        self.transport.abort()
        self._wake()

    # llhttp callbacks
    def on_message_begin(self) -> None:
        if self.complete:
            self.stray = True

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:
            return  # a trailer field: ignored
        headers = self.headers
        if len(headers) >= MAX_HEADERS:
            raise ValueError("too many reply header fields")
        key = name.decode(LATIN1).lower()
        text = value.decode(LATIN1)
        headers[key] = headers[key] + ", " + text if key in headers else text

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None  # llhttp calls back from inside parser.feed_data
        status = parser.get_status_code()
        if 100 <= status < 200:  # an interim reply: the real one follows
            self.interim = True
            self.headers = {}
            return
        self.status = status
        self.head_done = True

    def on_body(self, piece: bytes) -> None:
        if not self.complete:  # else a message nobody asked for, in the same segment as the reply
            self.body += piece

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        parser = self.parser
        assert parser is not None  # llhttp calls back from inside parser.feed_data
        self.keep_alive = parser.should_keep_alive()
        self.complete = True

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    @property
    def usable(self) -> bool:
        return not self.eof and not self.stray and not self.transport.is_closing()

    def abort(self) -> None:
        self.eof = True
        self.transport.abort()

    def take(self) -> bytes:
        """The body bytes parsed so far (removed from the buffer)."""
        body = self.body
        piece = bytes(body)
        body.clear()
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        return piece

    async def more(self, deadline: float | None) -> None:
        """Wait for the parser to make progress; raises on a bad reply, at EOF or past `deadline`."""
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        if self.bad:
            raise TransportError("read", self.bad)
        if self.eof:
            raise TransportError("read", f"connection closed ({self.error!r})" if self.error else "connection closed")
        waiter = self.waiter = self.loop.create_future()
        if deadline is None:
            await waiter
        else:
            timer = self.loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
        if self.bad:
            raise TransportError("read", self.bad)


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TransportError("timeout"))


class BackendReply:
    """A reply whose head has arrived. Read it whole (`read`) or as it comes (`iter_body`);
    then `release` it (the connection goes back to the pool if the body was read to its
    end) or `close` it (abort: the backend sees the client go away)."""

    __slots__ = ("status", "headers", "_conn", "_pool", "_until_close", "_done", "_idle")

    def __init__(
        self, status: int, headers: dict[str, str], conn: _Connection, pool: _OriginPool, idle: float | None
    ) -> None:
        self.status = status
        self.headers = headers  # lower-case names
        self._conn: _Connection | None = conn  # None once released or closed
        self._pool = pool
        self._idle = idle  # longest silence while reading, None = wait forever
        # No length and not chunked: the body runs until the backend closes (llhttp cannot
        # tell that end from a cut, so this reply's connection is never reused).
        self._until_close = (
            "content-length" not in headers and "transfer-encoding" not in headers and status not in (204, 304)
        )
        self._done = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")

    def _deadline(self, conn: _Connection) -> float | None:
        return None if self._idle is None else conn.loop.time() + self._idle

    def _ends_body(self, conn: _Connection, exc: TransportError) -> bool:
        """Whether a read failure is the end of a read-until-close body: the backend closed, cleanly
        (a reset, in `conn.error`, cuts the body short)."""
        return self._until_close and exc.kind == "read" and conn.eof and not conn.bad and conn.error is None

    def _live(self) -> _Connection:
        conn = self._conn
        if conn is None:
            raise RuntimeError("the reply was already released or closed")
        return conn

    async def read(self, deadline: float | None = None) -> bytes:
        """The whole body. `deadline` (loop time) bounds the wait; without one the idle timeout does."""
        conn = self._live()
        try:
            while not conn.complete:
                try:
                    await conn.more(deadline if deadline is not None else self._deadline(conn))
                except TransportError as exc:
                    if self._ends_body(conn, exc):
                        break
                    raise
        except TransportError:
            self.close()
            raise
        self._done = True
        return conn.take()

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (framing removed): what arrived together leaves as one piece."""
        conn = self._live()
        try:
            while True:
                if conn.body:
                    yield conn.take()
                    continue  # more may have come (or the reply ended) while the caller had the piece
                if conn.complete:
                    break
                try:
                    await conn.more(self._deadline(conn))
                except TransportError as exc:
                    if self._ends_body(conn, exc):
                        if conn.body:
                            yield conn.take()
                        break
                    raise
        except BaseException:
            self.close()
            raise
        self._done = True

    def release(self) -> None:
        """Done with the reply: a fully read one frees its connection for the next request."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        pool = self._pool
        if (
            self._done
            and conn.complete
            and conn.keep_alive
            and not self._until_close
            and conn.usable
            and not pool.closed
        ):
            conn.parser = None
            now = conn.idle_since = conn.loop.time()
            idle = pool.idle
            idle.append(conn)
            # The oldest idle connections sit at the bottom, left over from a burst: retire them
            # here, or they would wait for the backend to close them.
            while idle[0].idle_since < now - pool.keepalive:
                idle.pop(0).abort()
        else:
            conn.abort()

    def close(self) -> None:
        """Abort the call: the backend sees the connection go, which cancels its work."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()


class _OriginPool:
    __slots__ = ("host", "port", "tls", "host_header", "idle", "closed", "keepalive")

    def __init__(self, origin: str, keepalive: float) -> None:
        self.keepalive = keepalive
        parts = urlsplit(origin)
        # no user:password@: a backend is host:port, and Host (below) must not carry credentials
        if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc:
            raise ValueError(f"backend origin must be http(s)://host[:port], not {origin!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc.encode(IDNA)
        self.idle: list[_Connection] = []
        self.closed = False


class Upstream:
    """Keep-alive connection pools, one per backend origin (`http://host:port`)."""

    def __init__(self, keepalive: float = 2.5) -> None:
        self.keepalive = keepalive
        self._pools: dict[str, _OriginPool] = {}

    def _pool(self, origin: str) -> _OriginPool:
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _OriginPool(origin, self.keepalive)
        return pool

    async def _connection(self, pool: _OriginPool, connect_timeout: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        idle = pool.idle
        if idle:
            oldest_ok = loop.time() - pool.keepalive
            while idle:
                conn = idle.pop()  # the most recently used: the least likely to be stale
                if conn.usable and conn.idle_since > oldest_ok:
                    return conn
                conn.abort()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop), pool.host, pool.port, ssl=_tls_context() if pool.tls else None
                )
        except TimeoutError:
            raise TransportError("timeout", f"connecting to {pool.host}:{pool.port}") from None
        except OSError as exc:
            raise TransportError("connect", str(exc)) from None
        return conn

    async def request(
        self,
        origin: str,
        method: str,
        path: str,
        headers: bytes,
        body: bytes = b"",
        *,
        connect_timeout: float | None = None,
        deadline: float | None = None,
        idle: float | None = None,
    ) -> BackendReply:
        """Send a request and wait for the reply's head. `headers`: preformatted `Name: value\\r\\n`
        lines (no Host, no Content-Length). `deadline` (loop time) bounds the wait for the head;
        `idle` bounds each silence while reading the head and, later, the body."""
        pool = self._pool(origin)
        conn = await self._connection(pool, connect_timeout)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            method.encode(),
            path.encode(),
            pool.host_header,
            len(body),
            headers,
        )
        conn.begin()
        try:
            if len(body) < 65536:
                conn.transport.write(head + body)
            else:
                conn.transport.writelines((head, body))
            return await _read_head(conn, pool, deadline, idle)
        except TransportError:
            conn.abort()
            raise
        except BaseException:  # cancelled: the backend should stop working for us
            conn.abort()
            raise

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.closed = True
            for conn in pool.idle:
                conn.abort()
            pool.idle.clear()


async def _read_head(conn: _Connection, pool: _OriginPool, deadline: float | None, idle: float | None) -> BackendReply:
    loop = conn.loop
    while not conn.head_done:
        if conn.bad:
            raise TransportError("read", conn.bad)
        if conn.eof:
            # Nothing (or half a head) came back: the backend dropped the connection.
            raise TransportError("read" if conn.received else "connect", "connection closed before a reply")
        wait_until = deadline
        if idle is not None:
            wait_until = loop.time() + idle if deadline is None else min(deadline, loop.time() + idle)
        try:
            await conn.more(wait_until)
        except TransportError as exc:
            if exc.kind == "read":
                continue  # loop once more: EOF and bad replies are classified above
            raise
    return BackendReply(conn.status, conn.headers, conn, pool, idle)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()
