"""Faults a real API server cannot produce on demand: a reverse proxy in front of the real one.

    with FaultProxy(cluster) as proxy:          # http://127.0.0.1:PORT -> the real kube-apiserver
        proxy.fail("PATCH", r"/deployments/vl-decode$", code=500, times=2)
        ... point a client at proxy.url ...
        proxy.requests                          # [(method, path)] as they went through
        proxy.queries                           # [(method, path?query)] likewise
        api_verb(*proxy.queries[0])             # ("list", "deployments"): as RBAC names requests

Everything else is the real server's own answer, streamed through unchanged (watches included).
It runs its own event loop in a thread, so blocking test code cannot stall the clients behind it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import ssl
import threading
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from dev.cluster.local import LocalCluster
from epd_operator.kube import Credentials, closing_connections

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def api_verb(method: str, path_qs: str) -> tuple[str, str]:
    """(verb, resource) of a request as RBAC names them: get | list | watch | create | update | patch |
    delete, and the plural with any subresource (`epddeployments/status`); other paths are ("other", path)."""
    split = urlsplit(path_qs)
    parts = split.path.strip("/").split("/")
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return "other", split.path
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]  # a namespaced resource (a Namespace itself is ["namespaces", name])
    if not rest or rest == [""]:
        return "other", split.path
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    if method == "GET":
        if "watch=true" in split.query or "watch=1" in split.query:
            return "watch", resource
        return ("get" if len(rest) > 1 else "list"), resource
    return WRITE_VERBS.get(method, method.lower()), resource


@dataclasses.dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    code: int
    times: int


class FaultProxy:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        self.queries: list[tuple[str, str]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def fail(self, method: str, path_regex: str, *, code: int = 500, times: int = 1) -> None:
        self.faults.append(Fault(method, re.compile(path_regex), code, times))

    def __enter__(self) -> FaultProxy:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive():
                raise RuntimeError("the fault proxy did not stop in 10 s")

    def _injected(self, method: str, path: str) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.path.search(path):
                fault.times -= 1
                return fault
        return None

    async def _serve(self) -> None:
        # The thread's loop closes when this returns, while the upstream TLS connections of the watches cut
        # at the stop may still be in their close handshake: closed here instead (kube/connections.py).
        async with closing_connections():
            await self._proxy()

    async def _proxy(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        context = ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )

        async def handle(request: web.Request) -> web.StreamResponse:
            self.requests.append((request.method, request.path))
            self.queries.append((request.method, request.path_qs))
            fault = self._injected(request.method, request.path)
            if fault is not None:
                status = {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": fault.code,
                    "reason": "InternalError",
                    "message": f"injected failure ({fault.code})",
                }
                return web.json_response(status, status=fault.code, dumps=json.dumps)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
            body = await request.read()
            upstream = self.cluster.server + request.path_qs
            async with session.request(request.method, upstream, headers=headers, data=body or None) as answer:
                response = web.StreamResponse(
                    status=answer.status,
                    headers={k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP},
                )
                await response.prepare(request)
                try:
                    async for chunk in answer.content.iter_any():
                        await response.write(chunk)
                    await response.write_eof()
                except (aiohttp.ClientError, ConnectionResetError):
                    pass  # a watch cut by either side (a stop, a timeout): the client sees it end, as it would
                return response

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{tail:.*}", handle)
        # A client gone cancels its handler, and with it the upstream request (a watch ends when its client
        # leaves, as on the real server); the stop then has no handler to wait for.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await session.close()

    async def credentials(self, namespace: str) -> Credentials:
        return Credentials.from_token(self.url, self.cluster.admin_token, namespace=namespace)
