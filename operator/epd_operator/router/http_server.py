"""The router's inbound HTTP/1.1 server: llhttp (through httptools) on a raw asyncio protocol.

The router faces untrusted clients, so requests are parsed by llhttp, the maintained C parser
that uvicorn and Node.js run, fed straight from `data_received`: bytes are parsed once, as
they arrive (chunked bodies included), never re-scanned from the start. On top of llhttp's
RFC 9112 framing checks (Content-Length with Transfer-Encoding, duplicate or malformed
Content-Length, chunked not final, bad chunk sizes, obs-fold, bare LF, control characters in
the target and in header values, all refused) this module refuses what llhttp lets through:
HTTP versions other than 1.0 and 1.1 (505), a Transfer-Encoding other than exactly `chunked`
(501) or any in an HTTP/1.0 request, a missing or repeated Host in HTTP/1.1, repeated
single-valued fields. Every refusal closes the connection.

Limits (`Limits`) hold whatever the read pattern: head size, header count and line length are
counted as the head arrives, a head must be complete within `head_timeout`, a body must keep
arriving (`body_timeout` plus time for each `body_min_rate` bytes), idle keep-alive
connections close after `keepalive`. The body limit is the handler's to answer
(`HttpRequest.read` raises `BodyTooLarge`); the request is handed over as soon as the head
announces too much, or the chunks exceed it, without reading the rest.

Replies go out in request order (pipelining); the next request is parsed only once the
previous reply is written and the client has drained what the transport holds (backpressure
on every reply, streamed or whole); a client that stops reading for `send_timeout` is cut.
Each request runs as its own task, cancelled when the client disconnects, so every backend
call it has open is aborted too. The objects handlers see are in http_messages.py; a streamed
reply writes through its request's connection by the `Connection` interface declared there.

`HttpServer.shutdown` is the graceful stop: no new connections, idle ones closed, every request
received answered (the last reply on each connection says `Connection: close`) until a deadline,
after which what is left is cut.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import typing
from collections import deque

import httptools

from .http_messages import LATIN1, BodyTooLarge, Handler, HttpRequest, Limits, Response, StreamResponse
from .http_messages import error_response as _error
from .http_messages import render_head as _head

log = logging.getLogger("epd_router.http")

_CLOSE = b"Connection: close\r\n"
_KEEP_ALIVE_10 = b"Connection: keep-alive\r\n"  # HTTP/1.0 closes unless told otherwise

# Fields a request may carry once only: repeated, the recipients could disagree on which counts.
_SINGLETONS = frozenset(
    {"host", "content-length", "transfer-encoding", "content-type", "authorization", "x-request-id", "expect"}
)
_IDLE, _HEAD, _BODY = 0, 1, 2


class _Refuse(Exception):
    """Raised from a parser callback: answer `status` and close."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Stop(Exception):
    """Raised from a parser callback: the request was handed over early; parse nothing more."""


class HttpConnection(asyncio.Protocol):
    """One client connection: llhttp parses what arrives, requests are answered in order."""

    # Set by connection_made, which the server runs before any other callback.
    transport: asyncio.Transport
    # Starting values of the state below; the instance assigns its own when they change.
    finishing = False  # the server is shutting down: answer what was received, then close
    dead = False  # the parser stopped: nothing more is read from this client
    reading_paused = False
    continued = False  # 100 Continue already sent for the request being received
    streaming = False  # a streamed reply has started
    timer_kind = -1
    # The message being parsed (on_message_begin starts each afresh).
    begun_now = False
    url = b""
    nheaders = 0
    head_bytes = 0
    started = 0.0
    body: bytes | bytearray | None = None
    body_raw = 0
    request: HttpRequest | None = None
    last: HttpRequest | None = None  # the request parsed last

    def __init__(
        self, handler: Handler, max_body: int, limits: Limits | None = None, server: HttpServer | None = None
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self.limits = limits or Limits()
        self.server = server  # told when this connection opens and closes (it tracks them for shutdown)
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.task: asyncio.Task | None = None
        self.queue: deque = deque()  # parsed requests (or a refusal) waiting for their turn
        self.held = bytearray()  # bytes received while a reply is owed, parsed after it
        self.closed = False
        self.drained: asyncio.Future | None = None  # set while the transport's buffer is full
        self.timer: asyncio.TimerHandle | None = None
        # The message being parsed.
        self.state = _IDLE
        self.headers: dict[str, str] = {}

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = typing.cast(asyncio.Transport, transport)  # a stream server's
        if self.server is not None:
            self.server.opened(self)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        if self.task is not None or self.queue:
            # A reply is owed: keep the bytes for later, and stop reading once they add up.
            self.held += data
            if len(self.held) > self.limits.max_head and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            return
        self._feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.task is not None:
            self.task.cancel()  # the client left: stop its request and its backend calls
        self._wake_writer()
        if self.server is not None:
            self.server.closed(self)

    def pause_writing(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        self._wake_writer()

    def _wake_writer(self) -> None:
        fut, self.drained = self.drained, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait_drained(self) -> None:
        """Wait until the client took what the transport holds; cut a client that never reads."""
        fut = self.drained
        if fut is None:
            return
        try:
            async with asyncio.timeout(self.limits.send_timeout):
                await asyncio.shield(fut)
        except TimeoutError:
            self.transport.abort()
            raise ConnectionResetError("client stopped reading") from None

    # ---- parsing (llhttp callbacks) ----

    def _feed(self, data: bytes) -> None:
        self.begun_now = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self.dead = True
            if isinstance(cause, _Refuse):
                self._refuse(cause.status, str(cause))
            elif not isinstance(cause, _Stop):
                log.error("request parser callback failed: %r", cause)
                self._refuse(500, "internal router error")
            return
        except httptools.HttpParserUpgrade:
            # No protocol upgrades here: what was parsed is answered, the rest is not HTTP/1.1.
            self.dead = True
            last = self.last
            if last is not None:
                last.keep_alive = False
            if self.task is None and not self.queue:
                self._close()
            return
        except httptools.HttpParserError as exc:  # a target too long was refused by on_url (414) before
            self.dead = True
            self._refuse(400, f"malformed request: {exc}")
            return
        state = self.state
        if state == _HEAD:
            if not self.begun_now:  # a head spread over reads: count what llhttp may be holding
                self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_head:
                self.dead = True
                self._refuse(431, "request head too large")
                return
        elif state == _BODY:
            self.body_raw += len(data)
            self._continue()
            if self.body_raw > 2 * self.max_body + self.limits.max_head + 65536:
                # Framing (chunk sizes, extensions, trailers) far beyond the body it carries.
                self.dead = True
                self._refuse(413, "request body framing too large")
                return
        self._arm()

    def _continue(self) -> None:
        """Answer `Expect: 100-continue` for the body being received, once: only when no reply is owed
        ahead of it (an interim reply sent earlier would be taken for one to an earlier request)."""
        if (
            not self.continued
            and self.task is None
            and not self.queue
            and self.headers.get("expect", "").lower() == "100-continue"
        ):
            self.continued = True
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_message_begin(self) -> None:
        self.state = _HEAD
        self.begun_now = True
        self.url = b""
        self.headers = {}
        self.nheaders = 0
        self.head_bytes = 0
        self.started = self.loop.time()
        self.continued = False

    def on_url(self, piece: bytes) -> None:
        self.url += piece
        if len(self.url) > self.limits.max_line:
            raise _Refuse(414, "request target too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        limits = self.limits
        self.nheaders += 1
        size = len(name) + len(value) + 4
        self.head_bytes += size
        if self.nheaders > limits.max_headers:
            raise _Refuse(431, "too many header fields")
        if size > limits.max_line:
            raise _Refuse(431, "header field too long")
        if self.head_bytes > limits.max_head:
            raise _Refuse(431, "request head too large")
        if self.state != _HEAD:
            return  # a trailer field of a chunked body: counted, not used
        key = name.decode(LATIN1).lower()
        headers = self.headers
        if key in headers:
            if key in _SINGLETONS:
                raise _Refuse(400, f"repeated {key} header field")
            headers[key] += ", " + value.decode(LATIN1)
        else:
            headers[key] = value.decode(LATIN1)

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        if version != "1.1" and version != "1.0":
            raise _Refuse(505, "only HTTP/1.0 and HTTP/1.1 are served")
        http10 = version == "1.0"
        headers = self.headers
        te = headers.get("transfer-encoding")
        if te is not None:
            if http10:
                raise _Refuse(400, "Transfer-Encoding in an HTTP/1.0 request")
            if te.lower() != "chunked":
                raise _Refuse(501, "only the chunked transfer coding is accepted")
        if not http10 and "host" not in headers:
            raise _Refuse(400, "missing Host header field")
        method = parser.get_method().decode(LATIN1)
        if method == "CONNECT":
            raise _Refuse(405, "CONNECT is not served")
        target = self.url.decode(LATIN1)
        path, _, query = target.partition("?")
        self.request = request = HttpRequest(
            method, path, query, headers, None, self, parser.should_keep_alive(), http10
        )
        self.state = _BODY
        self.body = None
        self.body_raw = 0
        self.started = self.loop.time()
        length = headers.get("content-length")
        if te is None and length is not None and int(length) > self.max_body:
            self._too_large(request)

    def on_body(self, piece: bytes) -> None:
        body = self.body
        if body is None:
            body = self.body = piece  # the usual case: the whole body in one piece, kept as it came
        else:
            if type(body) is bytes:
                body = self.body = bytearray(body)
            body += piece
        if len(body) > self.max_body:
            request = self.request
            assert request is not None  # set by on_headers_complete, which llhttp calls before any body
            self._too_large(request)

    def _too_large(self, request: HttpRequest) -> None:
        # Handed over now, body unread: the handler answers 413 and the connection closes.
        request.keep_alive = False
        self.body = None
        self.state = _IDLE
        self.request = None
        self._enqueue(request)
        raise _Stop

    def on_message_complete(self) -> None:
        request = self.request
        assert request is not None  # set by on_headers_complete, which llhttp calls first
        self.request = None
        self.state = _IDLE
        body = self.body
        request.body = b"" if body is None else body if type(body) is bytes else bytes(body)
        self.body = None
        self._enqueue(request)

    def _enqueue(self, request: HttpRequest) -> None:
        self.last = request
        if self.task is None and not self.queue:
            self._start(request)
            return
        if len(self.queue) >= self.limits.max_pipeline:
            raise _Refuse(429, "too many pipelined requests")
        self.queue.append(request)

    # ---- answering ----

    def begin_stream(self) -> None:
        self.streaming = True

    def last_reply(self) -> bool:
        return self.finishing and not self.queue and not self.held and self.state == _IDLE

    def finish(self) -> None:
        """The server is shutting down: answer every request received (whole or in part), the last
        reply with `Connection: close`, then close; an idle connection closes now."""
        self.finishing = True
        if self.task is None and not self.queue and self.state == _IDLE:
            self._close()

    def requests_owed(self) -> int:
        """Requests received, whole or in part, and not yet answered."""
        owed = (self.task is not None) + sum(isinstance(item, HttpRequest) for item in self.queue)
        return owed + (self.state != _IDLE or bool(self.held))

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _start(self, item: HttpRequest | Response) -> None:
        if isinstance(item, Response):  # a refusal queued behind earlier replies
            self._write_last(item)
            return
        self.streaming = False
        self.task = self.loop.create_task(self._answer(item))

    def _refuse(self, status: int, message: str) -> None:
        response = _error(status, message)
        if self.task is None and not self.queue:
            self._write_last(response)
        else:
            self.queue.append(response)

    def _write_last(self, response: Response) -> None:
        """A refusal: the connection's last reply, then close."""
        self._write_response(response, _CLOSE)
        self._close()

    def _close(self) -> None:
        if self.closed:
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport.close()
        if self.transport.get_write_buffer_size():
            # close() waits to flush; a client that never reads must not hold the socket forever.
            self.loop.call_later(self.limits.send_timeout, self.transport.abort)

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
        try:
            if isinstance(response, StreamResponse):
                if not response.prepared:  # nothing was sent yet
                    await response.prepare(request)
                await response.write_eof()
            else:
                if self.last_reply():
                    request.keep_alive = False
                try:
                    connection = _CLOSE if not request.keep_alive else _KEEP_ALIVE_10 if request.http10 else b""
                    self._write_response(response, connection, request.method == "HEAD")
                except (TypeError, ValueError) as exc:  # a status that is no integer, CR or LF in a header
                    log.error("refused to write a malformed reply to %s %s: %s", request.method, request.path, exc)
                    self._write_response(_error(500, "internal router error"), _CLOSE)
                    request.keep_alive = False
            if self.drained is not None:
                await self.wait_drained()  # backpressure: the next request waits for this reply to leave
        except (ConnectionError, asyncio.CancelledError):
            return
        except Exception:  # a streamed reply that cannot be rendered: the client must not wait for it forever
            log.exception("failed to write the reply to %s %s", request.method, request.path)
            self.transport.abort()
            return
        self.task = None
        if self.closed:
            return
        if not request.keep_alive or self.last_reply():  # a stream that began before the shutdown ends here
            self._close()
            return
        self._next()

    def _next(self) -> None:
        """The reply is out: take the next queued request, else parse what was held."""
        if self.queue:
            self._start(self.queue.popleft())
            return
        if self.dead:
            self._close()
            return
        if self.held:
            held, self.held = bytes(self.held), bytearray()
            if self.state != _IDLE:
                self.started = self.loop.time()  # its clock ran while we were busy elsewhere
            self._feed(held)
        elif self.state != _IDLE:
            self.started = self.loop.time()
            if self.state == _BODY:
                self._continue()  # deferred while replies to earlier requests were owed
            self._arm()
        else:
            self._arm()
        if self.reading_paused and self.task is None and not self.queue and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    def _write_response(self, response: Response, connection: bytes, head_only: bool = False) -> None:
        """`connection`: the Connection header line, or b"" (HTTP/1.1 kept alive says nothing)."""
        body = response.body
        framing = b"Content-Length: %d\r\n" % len(body) + connection
        self.send(_head(response.status, response.headers) + framing + b"\r\n" + (b"" if head_only else body))

    # ---- timeouts ----

    def _arm(self) -> None:
        """Arm the one timer this connection needs now: idle, head or body (none while answering)."""
        kind = -1 if (self.task is not None or self.queue or self.closed) else self.state
        if kind == self.timer_kind and (kind == -1 or self.timer is not None):
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.timer_kind = kind
        if kind == -1:
            return
        limits = self.limits
        if kind == _IDLE:
            delay = limits.keepalive
        elif kind == _HEAD:
            delay = self.started + limits.head_timeout - self.loop.time()
        else:
            delay = self._body_deadline() - self.loop.time()
        self.timer = self.loop.call_later(max(delay, 0.0), self._timed_out)

    def _body_deadline(self) -> float:
        limits = self.limits
        return self.started + limits.body_timeout + self.body_raw / limits.body_min_rate

    def _timed_out(self) -> None:
        self.timer = None
        kind, self.timer_kind = self.timer_kind, -1
        if self.closed or self.task is not None or self.queue or kind != self.state:
            self._arm()
            return
        if kind == _IDLE:
            self._close()
        elif kind == _HEAD:
            self._refuse(408, "request head not received in time")  # nothing is owed: it closes
        else:
            if self.loop.time() < self._body_deadline():  # more arrived since the timer was set
                self._arm()
                return
            self._refuse(408, "request body not received in time")


__all__ = [
    "BodyTooLarge",
    "HttpConnection",
    "HttpRequest",
    "HttpServer",
    "Limits",
    "Response",
    "StreamResponse",
    "start_server",
]


class HttpServer:
    """A listening server and its open connections. `close()` stops listening and leaves the
    connections be; `shutdown()` is the graceful stop."""

    def __init__(self) -> None:
        self.listener: asyncio.Server | None = None  # set by start_server
        self.connections: set[HttpConnection] = set()
        self.shutting_down = False
        self._emptied: asyncio.Future | None = None

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        assert self.listener is not None, "not listening"
        return tuple(self.listener.sockets)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()

    def opened(self, conn: HttpConnection) -> None:
        self.connections.add(conn)
        if self.shutting_down:  # accepted just before the listener closed: it gets one reply
            conn.finishing = True

    def closed(self, conn: HttpConnection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)

    def requests_owed(self) -> int:
        return sum(conn.requests_owed() for conn in self.connections)

    async def shutdown(self, deadline: float) -> int:
        """Stop accepting connections (the listening socket closes: new ones are refused), close
        idle keep-alive connections, answer every request received, each connection's last reply
        with `Connection: close`, and wait up to `deadline` seconds for the connections to close;
        then cut those left. Returns how many requests were cut unanswered."""
        self.shutting_down = True
        self.close()
        for conn in list(self.connections):
            conn.finish()
        if self.connections:
            self._emptied = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(deadline):
                    await self._emptied
            except TimeoutError:
                pass
        cut = self.requests_owed()
        tasks = [conn.task for conn in self.connections if conn.task is not None]
        for conn in list(self.connections):
            conn.transport.abort()  # connection_lost cancels the request and its backend calls
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        return cut


async def start_server(
    handler: Handler,
    max_body: int,
    *,
    host: str | None = None,
    port: int | None = None,
    sock: socket.socket | None = None,
    limits: Limits | None = None,
) -> HttpServer:
    """Serve on `sock` (a listening socket, e.g. shared by workers) or on `host`:`port`."""
    loop = asyncio.get_running_loop()
    limits = limits or Limits()
    server = HttpServer()

    def connection() -> HttpConnection:
        return HttpConnection(handler, max_body, limits, server)

    if sock is not None:
        server.listener = await loop.create_server(connection, sock=sock, backlog=1024)
    elif port is None:
        raise ValueError("start_server needs a port or a listening socket")
    else:
        server.listener = await loop.create_server(connection, host, port, backlog=1024)
    return server
