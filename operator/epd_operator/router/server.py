"""The router's routes and lifecycle: which handler answers which path, starting and stopping
discovery, health checks and connection pools. A generation request is checked here (body,
x-request-id, what the client may send) and handed to the pipeline (pipeline.py) as a
`RequestContext` (context.py); the other routes are answered here."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp import hdrs

from .backends import HealthChecker, Pool
from .calls import BackendCalls
from .config import RouterConfig
from .context import RequestContext
from .failures import JSON, json_error
from .http_messages import CONTENT_TYPE, REQUEST_ID, BodyTooLarge, HttpRequest, Reply, Response
from .http_server import HttpServer, start_server
from .metrics import RouterMetrics
from .pickers import make_picker
from .pipeline import Pipeline
from .protocol import (
    BadRequest,
    MediaItem,
    extract_media,
    new_id,
    parse_json_object,
    refuse_router_fields,
    validate_chat,
    validate_completion,
)
from .reuse import ReuseCache
from .tracing import RequestTrace, Tracing
from .upstream import Upstream

if TYPE_CHECKING:
    from .discovery import KubernetesDiscovery

log = logging.getLogger("epd_router")

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# A client's x-request-id is copied into backend requests and the reply head: visible ASCII only.
_REQUEST_ID = re.compile(r"[!-~]{1,256}").fullmatch
# vLLM closes idle keep-alive connections after 5 s: the router retires its own first, so a reused
# connection is never one the server already closed.
KEEPALIVE_S = 2.5


class Router:
    health: HealthChecker  # built by start()

    def __init__(self, config: RouterConfig, metrics: RouterMetrics | None = None) -> None:
        config.validate()
        self.cfg = config
        self.metrics = metrics or RouterMetrics()
        m = self.metrics
        self.encoders = Pool("encoder", m, config.eject_after)
        stride = config.ec_consumer_tp_size
        self.prefills = (
            Pool("prefill", m, config.eject_after, config.prefill_dp_size, stride)
            if config.disaggregated_prefill
            else None
        )
        self.decodes = Pool("decode", m, config.eject_after, config.decode_dp_size, stride)
        self.pools = [p for p in (self.encoders, self.prefills, self.decodes) if p is not None]
        self.encoder_picker = make_picker(config.encoder_policy, config.load_factor)
        # One per consumer pool: prefix-aware homes are per pool (pipeline.py).
        self.pd_pickers = {
            pool.role: make_picker(config.pd_policy, config.load_factor)
            for pool in self.pools
            if pool is not self.encoders
        }
        self.reuse = ReuseCache(config.reuse_ttl, config.reuse_max_items)
        self.models_timeout = aiohttp.ClientTimeout(total=config.prefill_timeout, sock_connect=config.connect_timeout)
        # Health probes, metrics scraping and /v1/models use aiohttp; the data path uses `upstream`.
        self.session: aiohttp.ClientSession | None = None
        self.upstream = Upstream(keepalive=KEEPALIVE_S)
        self.pipeline = Pipeline(
            config,
            m,
            self.encoders,
            self.prefills,
            self.decodes,
            self.encoder_picker,
            self.pd_pickers,
            BackendCalls(config, m, self.upstream),
            self.reuse,
        )
        self._discovery: KubernetesDiscovery | None = None  # with discovery "kubernetes", once started
        self.tracing: Tracing | None = None  # built in start() when an OTLP endpoint is set
        self._tasks: list[asyncio.Task] = []
        self.draining = asyncio.Event()  # set while shutting down: /health says 503 while the requests in flight finish

    # ---- lifecycle -------------------------------------------------------------------

    async def serve(self, sock: socket.socket) -> RouterServer:
        """Start the router's background work and listen on `sock` (main.listening_socket; --workers share one)."""
        await self.start()
        routes = {
            ("POST", CHAT): self.chat_completions,
            ("POST", COMPLETIONS): self.completions,
            ("GET", "/v1/models"): self.models,
            ("GET", "/health"): self.health_report,
            ("GET", "/livez"): self.livez,
        }
        if self.cfg.metrics_port is None:  # else main.py serves /metrics on its own port
            routes[("GET", "/metrics")] = self.metrics_report
        paths = {path for _, path in routes}

        async def dispatch(request: HttpRequest) -> Reply:
            handler = routes.get((request.method, request.path))
            if handler is not None:
                return await handler(request)
            if request.path in paths:
                return json_error(405, f"method {request.method} not allowed on {request.path}")
            return json_error(404, f"no route {request.path}")

        try:
            server = await start_server(dispatch, self.cfg.max_body_bytes, sock=sock, limits=self.cfg.http_limits())
        except BaseException:
            await self.stop()
            raise
        return RouterServer(self, server)

    async def start(self) -> None:
        if self.cfg.otlp_traces_endpoint is not None:
            self.tracing = Tracing(self.cfg.otlp_traces_endpoint, self.cfg.trace_sample_ratio)
        # Probes, scrapes and /v1/models: no cap on connections (a probe never queues behind another
        # backend's), vLLM's keep-alive respected, names resolved again every 30 s (pods come and go).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, ttl_dns_cache=30)
        self.session = aiohttp.ClientSession(connector=connector)
        if self.cfg.discovery == "kubernetes":
            from .discovery import KubernetesDiscovery

            discovery = KubernetesDiscovery.from_config(self.cfg, self._pool_for_role())
            await discovery.start()
            self._discovery = discovery
            self._tasks.append(asyncio.create_task(discovery.run(), name="discovery"))
        else:
            from .discovery import static_endpoints

            for role, endpoints in static_endpoints(self.cfg).items():
                self._pool_for_role()[role].update(endpoints)
        self.health = HealthChecker(self.pools, self.session, self.cfg.health_interval, self.cfg.health_timeout)
        if self.cfg.health_interval > 0:
            self._tasks.append(asyncio.create_task(self.health.run(), name="health"))
        if self.cfg.demand_window > 0:
            self._tasks.append(asyncio.create_task(self.pipeline.encoding.demand.run(), name="demand"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError, Exception):
                await task
        if self._discovery is not None:  # log out
            await self._discovery.close()
        if self.session is not None:
            await self.session.close()
        await self.upstream.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # exports the spans still queued

    def _pool_for_role(self) -> dict[str, Pool]:
        pools = {"encoder": self.encoders, "decode": self.decodes}
        if self.prefills is not None:
            pools["prefill"] = self.prefills
        return pools

    # ---- handlers --------------------------------------------------------------------

    async def _read_body(self, request: HttpRequest) -> bytes:
        try:
            return await request.read()
        except BodyTooLarge:
            raise BadRequest(f"request body exceeds {self.cfg.max_body_bytes} bytes", status=413) from None

    async def chat_completions(self, request: HttpRequest) -> Reply:
        return await self._serve(request, CHAT, self._chat_media)

    async def completions(self, request: HttpRequest) -> Reply:
        return await self._serve(request, COMPLETIONS, self._completion_media)

    def _chat_media(self, body: dict, stripped: list) -> list[MediaItem]:
        cfg = self.cfg
        return extract_media(
            validate_chat(body),
            cfg.allow_file_urls,
            allow_embeds=cfg.allow_client_embeds,
            trust_uuids=cfg.trust_client_uuids,
            immutable_urls=cfg.immutable_media_urls,
            stripped=stripped,
        )

    def _completion_media(self, body: dict, stripped: list) -> list[MediaItem]:
        validate_completion(body)
        if "prompt_embeds" in body and not self.cfg.allow_client_embeds:
            raise BadRequest("prompt_embeds are not accepted from clients by this router", param="prompt_embeds")
        return []  # /v1/completions carries text only: no encoder work

    async def _serve(
        self, request: HttpRequest, route: str, media_of: Callable[[dict, list], list[MediaItem]]
    ) -> Reply:
        t0 = time.perf_counter()
        rid = request.headers.get(REQUEST_ID)
        if rid is None:
            rid = new_id()
        elif not _REQUEST_ID(rid):
            return self._answered(
                route, json_error(400, "x-request-id must be 1 to 256 visible ASCII characters", new_id())
            )
        trace = self.tracing.start(request, route, rid) if self.tracing is not None else None
        stripped: list = []
        try:
            raw = await self._read_body(request)
            body = parse_json_object(raw)
            if trace is not None:
                trace.set_model(body.get("model"))
            refuse_router_fields(body)
            items = media_of(body, stripped)
        except BadRequest as exc:
            return self._answered(route, json_error(exc.status, str(exc), rid, param=exc.param), trace=trace)
        # A client uuid the router may not trust was stripped: the raw bytes are not what goes on.
        ctx = RequestContext(request, route, rid, t0, body, None if stripped else raw, items, body, trace=trace)
        try:
            return self._answered(route, await self.pipeline.run(ctx), t0, trace)
        except asyncio.CancelledError:
            self.metrics.count_request(route, 499)  # client closed the connection (nginx's code)
            if trace is not None:
                trace.end(499, "client_closed")
            raise
        except Exception:
            if trace is not None:  # http_server answers 500 and logs it
                trace.end(500, "router_error")
            raise

    def _answered(
        self, route: str, response: Reply, t0: float | None = None, trace: RequestTrace | None = None
    ) -> Reply:
        self.metrics.count_request(route, response.status)
        if trace is not None:
            trace.end(response.status)
        if t0 is not None:
            elapsed = time.perf_counter() - t0
            self.metrics.observe_stage("total", elapsed)
            if self.cfg.log_requests:
                log.info("%s %s %d %.1f ms", response.headers.get(REQUEST_ID), route, response.status, elapsed * 1e3)
        return response

    async def models(self, request: HttpRequest) -> Reply:
        rid = request.headers.get(REQUEST_ID)
        if rid is None or not _REQUEST_ID(rid):
            rid = new_id()
        pool = self.decodes
        if not pool.available:
            return self._answered(
                "/v1/models", json_error(503, "no decode endpoint available", rid, "service_unavailable")
            )
        ep = pool.available[0]
        # aiohttp's header names (case-insensitive istr): vLLM's reply is relayed as it came, never decoded
        headers = {REQUEST_ID: rid, hdrs.ACCEPT_ENCODING: "identity"}
        if "authorization" in request.headers:
            headers[hdrs.AUTHORIZATION] = request.headers["authorization"]
        session = self.session
        assert session is not None  # start() made it
        try:
            async with session.get(ep.url + "/v1/models", headers=headers, timeout=self.models_timeout) as r:
                data = await r.read()
                ct = r.headers.get(CONTENT_TYPE, JSON)
                status = r.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            pool.record_failure(ep, "connect")
            return self._answered(
                "/v1/models", json_error(502, f"decode /v1/models failed: {exc}", rid, "upstream_error")
            )
        return self._answered(
            "/v1/models", Response(body=data, status=status, headers={CONTENT_TYPE: ct, REQUEST_ID: rid})
        )

    async def health_report(self, request: HttpRequest) -> Response:
        report = {
            "proxy": "draining" if self.draining.is_set() else "healthy",
            "encode_cluster": self.encoders.status(),
            "prefill_cluster": self.prefills.status() if self.prefills is not None else "disabled",
            "decode_cluster": self.decodes.status(),
            "tiers": {pool.role: pool.describe() for pool in self.pools},
        }
        # Without encoders the router still serves (consumers encode locally); without a
        # prefill or decode instance it cannot.
        serving = bool(self.decodes.available) and (self.prefills is None or bool(self.prefills.available))
        serving = serving and not self.draining.is_set()
        return Response(body=orjson.dumps(report), status=200 if serving else 503, content_type=JSON)

    async def livez(self, request: HttpRequest) -> Response:
        """Liveness: answered by the event loop itself, so a wedged loop fails it (unlike a TCP
        check, which the kernel answers). Backends play no part: they have /health."""
        return Response(body=b"ok", content_type="text/plain")

    async def metrics_report(self, request: HttpRequest) -> Response:
        data, content_type = self.metrics.exposition()
        return Response(body=data, headers={CONTENT_TYPE: content_type})


class RouterServer:
    """A listening router: `url` to reach it, `shutdown()` to drain and stop it, `cleanup()` to stop
    listening and stop its work at once."""

    def __init__(self, router: Router, server: HttpServer) -> None:
        self.router = router
        self.server = server
        host, port = server.sockets[0].getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    async def shutdown(self, deadline: float) -> None:
        """Drain: refuse new connections, say 503 on /health, let the requests in flight finish for
        up to `deadline` seconds (cutting those left), then stop the router's work."""
        router = self.router
        router.draining.set()
        loop = asyncio.get_running_loop()
        started = loop.time()
        log.info(
            "draining: not accepting connections; in flight: %d requests on %d connections; deadline %g s",
            self.server.requests_owed(),
            len(self.server.connections),
            deadline,
        )
        cut = await self.server.shutdown(deadline)
        if cut:
            log.warning("drain deadline (%g s) reached: cut %d requests still in flight", deadline, cut)
        else:
            log.info("drained in %.1f s: every request in flight answered", loop.time() - started)
        await router.stop()

    async def cleanup(self) -> None:
        self.server.close()
        await self.router.stop()
