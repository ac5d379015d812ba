"""The router's HTTP/1.1 client to vLLM backends, on raw asyncio protocols.

aiohttp's ClientSession cost more router CPU per request than all the routing logic
(bench/results/bench.md: the aiohttp floor alone spends most of the budget), so the data
path talks HTTP/1.1 itself: one keep-alive pool per backend origin, requests written in
one go, replies parsed straight out of the receive buffer. It speaks just what vLLM's
uvicorn answers: Content-Length, chunked, or read-until-close bodies; no compression
(requests say `Accept-Encoding: identity`), no 1xx, no pipelining.

POST is never retried here, not even on a reused connection that turns out closed: like
aiohttp, the caller decides (it retries on another backend). Idle connections retire
after `keepalive` seconds, well before vLLM's 5 s, so a reused one is rarely stale.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # a reply head larger than this is not from a backend we understand
PAUSE_ABOVE = 1 << 20  # stop reading a backend while this much is buffered for a slow client


class UpstreamError(Exception):
    """A backend call failed. `kind`: connect (no reply started: refused, reset, closed)
    | timeout | read (the reply broke or made no sense after it started)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class _Connection(asyncio.Protocol):
    """One keep-alive connection. The reader coroutine parses `buf`; data_received only
    appends and wakes it."""

    __slots__ = ("loop", "transport", "buf", "eof", "error", "waiter", "paused", "idle_since")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.paused = False
        self.idle_since = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > PAUSE_ABOVE and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # close our side too

    def connection_lost(self, exc) -> None:
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
        return not self.eof and not self.transport.is_closing()

    def abort(self) -> None:
        self.eof = True
        if self.transport is not None:
            self.transport.abort()

    async def more(self, deadline: float | None) -> None:
        """Wait for bytes beyond those in `buf`; raises at EOF or past `deadline`."""
        if self.paused:
            self.paused = False
            self.transport.resume_reading()
        if self.eof:
            raise UpstreamError("read", f"connection closed ({self.error!r})" if self.error else "connection closed")
        waiter = self.waiter = self.loop.create_future()
        if deadline is None:
            await waiter
            return
        timer = self.loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamError("timeout"))


class Response:
    """A reply whose head has arrived. Read it whole (`read`) or as it comes (`iter_body`);
    then `release` it (the connection goes back to the pool if the body was read to its
    end) or `close` it (abort: the backend sees the client go away)."""

    __slots__ = ("status", "headers", "_conn", "_pool", "_length", "_chunked", "_done", "_idle")

    def __init__(self, status: int, headers: dict[str, str], conn: _Connection, pool: "_OriginPool", idle: float | None) -> None:
        self.status = status
        self.headers = headers  # lower-case names
        self._conn = conn
        self._pool = pool
        self._idle = idle  # longest silence while reading, None = wait forever
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if self._chunked:
            self._length = -1
        elif length is not None:
            try:
                self._length = int(length)
            except ValueError:
                conn.abort()
                raise UpstreamError("read", f"bad Content-Length {length!r}") from None
        elif status in (204, 304):
            self._length = 0
        else:
            self._length = None  # until the backend closes
        self._done = False

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")

    def _deadline(self) -> float | None:
        return None if self._idle is None else self._conn.loop.time() + self._idle

    async def read(self, deadline: float | None = None) -> bytes:
        """The whole body. `deadline` (loop time) bounds the wait; without one the idle timeout does."""
        conn = self._conn
        buf = conn.buf
        try:
            if self._length is not None and self._length >= 0:
                while len(buf) < self._length:
                    await conn.more(deadline if deadline is not None else self._deadline())
                body = bytes(buf[: self._length])
                del buf[: self._length]
            elif self._chunked:
                body = b"".join([piece async for piece in self._chunks(deadline)])
            else:
                while not conn.eof:
                    await conn.more(deadline if deadline is not None else self._deadline())
                body = bytes(buf)
                buf.clear()
        except UpstreamError as exc:
            if self._length is None and exc.kind == "read":  # read-until-close ends this way
                body = bytes(buf)
                buf.clear()
            else:
                self.close()
                raise
        self._done = True
        return body

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (chunk framing removed), for streaming replies."""
        conn = self._conn
        buf = conn.buf
        try:
            if self._chunked:
                async for piece in self._chunks(None):
                    yield piece
            elif self._length is not None:
                left = self._length
                while left:
                    if not buf:
                        await conn.more(self._deadline())
                    piece = bytes(buf[:left])
                    del buf[: len(piece)]
                    left -= len(piece)
                    yield piece
            else:
                while True:
                    if buf:
                        piece = bytes(buf)
                        buf.clear()
                        yield piece
                    if conn.eof:
                        break
                    try:
                        await conn.more(self._deadline())
                    except UpstreamError as exc:
                        if exc.kind != "read":
                            raise
        except BaseException:
            self.close()
            raise
        self._done = True

    async def _chunks(self, deadline: float | None) -> AsyncIterator[bytes]:
        """Chunked transfer coding: yields whatever body bytes are in, so chunks that arrived
        together leave as one piece (one write to the client, not one per token)."""
        conn = self._conn
        buf = conn.buf
        left = -1  # bytes of the current chunk still to come, its CRLF included; -1: at a size line
        while True:
            pieces = []
            while True:
                if left < 0:
                    eol = buf.find(b"\r\n")
                    if eol < 0:
                        break
                    try:
                        size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
                    except ValueError:
                        raise UpstreamError("read", "bad chunk size") from None
                    del buf[: eol + 2]
                    if size == 0:
                        if pieces:
                            yield b"".join(pieces)
                        await self._trailers(deadline)
                        return
                    left = size + 2
                if left > 2 and buf:
                    piece = bytes(buf[: left - 2])
                    del buf[: len(piece)]
                    left -= len(piece)
                    pieces.append(piece)
                if left > 2:
                    break  # the chunk's data is still coming
                crlf = min(left, len(buf))
                del buf[:crlf]
                left -= crlf
                if left:
                    break
                left = -1
            if pieces:
                yield b"".join(pieces)
            await conn.more(deadline if deadline is not None else self._deadline())

    async def _trailers(self, deadline: float | None) -> None:
        """Trailer lines (vLLM sends none), up to the empty line that ends the body."""
        conn = self._conn
        buf = conn.buf
        while True:
            while (eol := buf.find(b"\r\n")) < 0:
                await conn.more(deadline if deadline is not None else self._deadline())
            del buf[: eol + 2]
            if eol == 0:
                return

    def release(self) -> None:
        """Done with the reply: a fully read one frees its connection for the next request."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        pool = self._pool
        if self._done and self._length is not None and not conn.buf and conn.usable and not pool.closed \
                and self.headers.get("connection", "").lower() != "close":
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
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend origin must be http(s)://host[:port], not {origin!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc.encode("idna")
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
                if conn.usable and conn.idle_since > oldest_ok and not conn.buf:
                    return conn
                conn.abort()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(loop), pool.host, pool.port,
                                                       ssl=_tls_context() if pool.tls else None)
        except TimeoutError:
            raise UpstreamError("timeout", f"connecting to {pool.host}:{pool.port}") from None
        except OSError as exc:
            raise UpstreamError("connect", str(exc)) from None
        return conn

    async def request(self, origin: str, method: str, path: str, headers: bytes, body: bytes = b"", *,
                      connect_timeout: float | None = None, deadline: float | None = None, idle: float | None = None) -> Response:
        """Send a request and wait for the reply's head. `headers`: preformatted `Name: value\\r\\n`
        lines (no Host, no Content-Length). `deadline` (loop time) bounds the wait for the head;
        `idle` bounds each silence while reading the head and, later, the body."""
        pool = self._pool(origin)
        conn = await self._connection(pool, connect_timeout)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n%s\r\n" % (
            method.encode(), path.encode(), pool.host_header, len(body), headers)
        try:
            if len(body) < 65536:
                conn.transport.write(head + body)
            else:
                conn.transport.writelines((head, body))
            return await _read_head(conn, pool, deadline, idle)
        except UpstreamError:
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


async def _read_head(conn: _Connection, pool: _OriginPool, deadline: float | None, idle: float | None) -> Response:
    buf = conn.buf
    loop = conn.loop
    while (end := buf.find(b"\r\n\r\n")) < 0:
        if len(buf) > MAX_HEAD:
            raise UpstreamError("read", "reply head too large")
        if conn.eof:
            # Nothing (or half a head) came back: the backend dropped the connection.
            raise UpstreamError("connect" if not buf else "read", "connection closed before a reply")
        wait_until = deadline
        if idle is not None:
            wait_until = loop.time() + idle if deadline is None else min(deadline, loop.time() + idle)
        try:
            await conn.more(wait_until)
        except UpstreamError as exc:
            if exc.kind == "read":
                continue  # loop once more: EOF is classified above
            raise
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[: end + 4]
    status_line = lines[0]
    if not status_line.startswith("HTTP/1."):
        raise UpstreamError("read", f"not an HTTP/1.x reply: {status_line[:40]!r}")
    try:
        status = int(status_line[9:12])
    except ValueError:
        raise UpstreamError("read", f"bad status line {status_line[:40]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if status_line.startswith("HTTP/1.0") and headers.get("connection", "").lower() != "keep-alive":
        headers["connection"] = "close"
    return Response(status, headers, conn, pool, idle)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()
