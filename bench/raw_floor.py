"""The floor for a router in Python without an HTTP framework: raw asyncio protocols on uvloop.

The same calls as bench/aiohttp_floor.py (encoder, prefill in E/P/D, then decode, the
client's body forwarded unchanged), but the HTTP handling is bench/http1.py: requests
parsed by hand, upstream keep-alive connections pooled by hand, and decode's response
relayed to the client byte for byte. Next to aiohttp-floor it shows how much of a Python
router's cost is its HTTP framework rather than the language.

    python -m bench.raw_floor --port P --encoder URL [--prefill URL] --decode URL
"""

from __future__ import annotations

import asyncio
import sys
from urllib.parse import urlsplit

from .contenders import parse_floor_args
from .http1 import ResponseEnd, response, take_request

CHAT = b"/v1/chat/completions"
HEALTH = response(b"200 OK", b"application/json", b'{"status":"ok"}')
BAD_GATEWAY = response(b"502 Bad Gateway", b"application/json", b'{"error":"upstream failed"}')


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to a backend, one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.end: ResponseEnd | None = None
        self.relay: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.done and not self.done.done():
            self.done.set_exception(ConnectionError("upstream closed"))

    def exchange(self, request: bytes, relay: asyncio.Transport | None) -> asyncio.Future:
        """Send; the future resolves with the response status once it is complete. With
        `relay`, every byte of the response is written to it as it arrives."""
        self.done = asyncio.get_running_loop().create_future()
        self.end = ResponseEnd()
        self.relay = relay
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        used = self.end.feed(data)
        if self.relay is not None:
            self.relay.write(data if used is None else data[:used])
        if used is not None and not self.done.done():
            self.done.set_result(self.end.status)


class Upstream:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.head = (
            b"POST " + CHAT + b" HTTP/1.1\r\nhost: " + parts.netloc.encode() + b"\r\ncontent-type: application/json\r\n"
        )
        self.idle: list[UpstreamConnection] = []

    async def call(self, body: bytes, relay: asyncio.Transport | None = None) -> int:
        conn = None
        while self.idle:
            candidate = self.idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        if conn is None:
            _, conn = await asyncio.get_running_loop().create_connection(UpstreamConnection, self.host, self.port)
        status = await conn.exchange(
            self.head + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body, relay
        )
        self.idle.append(conn)
        return status


class ClientConnection(asyncio.Protocol):
    def __init__(self, stages: list[Upstream], decode: Upstream) -> None:
        self.stages = stages
        self.decode = decode
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.routing: asyncio.Future[None] | None = None  # held: the loop keeps only a weak reference to a task

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while (request := take_request(self.buf)) is not None:
            if request.method == "POST":
                self.busy = True
                self.routing = asyncio.ensure_future(self._route(request.body))
                return
            self.transport.write(HEALTH)

    async def _route(self, body: bytes) -> None:
        try:
            for stage in self.stages:
                await stage.call(body)
            await self.decode.call(body, relay=self.transport)
        except OSError:
            self.transport.write(BAD_GATEWAY)
        self.busy = False
        if self.buf:
            self._next()


async def serve(host: str, port: int, encoder: str, prefill: str | None, decode: str) -> None:
    stages = [Upstream(encoder)] + ([Upstream(prefill)] if prefill else [])
    consumer = Upstream(decode)
    server = await asyncio.get_running_loop().create_server(
        lambda: ClientConnection(stages, consumer), host, port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    args = parse_floor_args(__doc__.splitlines()[0], argv)
    coro = serve(args.host, args.port, args.encoder, args.prefill, args.decode)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


if __name__ == "__main__":
    sys.exit(main())
