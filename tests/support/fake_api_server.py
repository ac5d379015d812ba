"""A scripted stand-in for the Kubernetes API server on loopback, for epd_operator.kube's client and watch.

It records every request as the client sent it (method, path, query, headers, body) and answers from a
script: `answer(status, body)` queues one answer, `stream(lines)` one chunked watch answer whose lines
are sent and then the stream ends; with `path`, an answer waits for a request of that path. Without a
queued answer it says 200 with an empty object. What the
real server does with the requests is tested in tests/integration.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class FakeApiServer:
    url: str = ""
    requests: list[Seen] = field(default_factory=list)
    script: list[tuple[str | None, Any]] = field(default_factory=list)  # (path or any, web.Response maker), in order
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def answer(
        self, status: int, body: Any = None, *, raw: bytes | None = None, delay: float = 0.0, path: str | None = None
    ) -> None:
        async def make(_: web.Request) -> web.StreamResponse:
            if delay:
                await asyncio.sleep(delay)
            text = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
            return web.Response(status=status, body=text, content_type="application/json")

        self.script.append((path, make))

    def stream(self, lines: list[Any], *, hold: float = 0.0, path: str | None = None) -> None:
        """A watch answer: each line (an event dict, or raw bytes) then, after `hold` seconds, the end."""

        async def make(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for line in lines:
                await response.write(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
            if hold:
                await asyncio.sleep(hold)
            await response.write_eof()
            return response

        self.script.append((path, make))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        text = await request.text()
        self.requests.append(
            Seen(
                request.method,
                request.path,
                dict(request.query),
                dict(request.headers),
                json.loads(text) if text else None,
            )
        )
        self.arrived.set()
        for i, (path, make) in enumerate(self.script):
            if path is None or path == request.path:
                del self.script[i]
                return await make(request)
        return web.json_response({})

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Until `count` requests have arrived."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < count:
                self.arrived.clear()
                await self.arrived.wait()


@asynccontextmanager
async def fake_api_server() -> AsyncIterator[FakeApiServer]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake._handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    try:
        yield fake
    finally:
        await server.close()
