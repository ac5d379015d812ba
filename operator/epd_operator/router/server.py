"""The router: request handlers and the E → (P) → D pipeline, served by http_server and calling backends through upstream."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import suppress

import aiohttp
import orjson

from .backends import Endpoint, HealthChecker, Pool
from .config import RouterConfig
from .http_server import BodyTooLarge, HttpRequest, Response, StreamResponse, start_server
from .metrics import RouterMetrics
from .pickers import make_picker
from .protocol import (
    BadRequest,
    EncodedItem,
    EncoderReplyError,
    MediaItem,
    error_body,
    extract_media,
    group_for_encoders,
    match_encoder_reply,
    new_id,
    parse_json_object,
    prefill_request,
    prompt_prefix,
    refuse_router_fields,
    rewrite_for_decode,
    validate_chat,
    validate_completion,
    encoder_request,
)
from .reuse import ReuseCache, reuse_key
from .upstream import Response as UpstreamResponse
from .upstream import Upstream, UpstreamError

log = logging.getLogger("epd_router")

JSON = "application/json"
CHAT = "/v1/chat/completions"
UPSTREAM_HEADERS = b"Content-Type: application/json\r\nAccept-Encoding: identity\r\n"
COMPLETIONS = "/v1/completions"
# A client's x-request-id is copied into backend requests and the reply head: visible ASCII only.
_REQUEST_ID = re.compile(r"[!-~]{1,256}").fullmatch


class UpstreamFailure(Exception):
    """A backend call failed before anything reached the client: it may be retried elsewhere."""

    def __init__(self, kind: str, status: int = 502, body: bytes = b"", content_type: str = JSON) -> None:
        super().__init__(kind)
        self.kind = kind  # connect | timeout | status | reply | read
        self.status = status
        self.body = body
        self.content_type = content_type

    def response(self, rid: str, what: str) -> Response:
        if self.kind == "status" and self.body:
            return Response(body=self.body, status=self.status, headers={"Content-Type": self.content_type, "x-request-id": rid})
        status = 504 if self.kind == "timeout" else 502
        return json_error(status, f"{what} failed ({self.kind})", rid, "upstream_error")


class UpstreamRejected(Exception):
    """A backend refused the request as a client error: relayed to the client as it is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type


def json_error(status: int, message: str, rid: str | None = None, err_type: str = "invalid_request_error", param=None) -> Response:
    headers = {"Content-Type": JSON}
    if rid:
        headers["x-request-id"] = rid
    return Response(body=error_body(message, status, err_type, param), status=status, headers=headers)


def client_error(status: int) -> bool:
    """4xx that another instance would answer the same way (not timeouts or throttling)."""
    return 400 <= status < 500 and status not in (408, 429)


class Router:
    def __init__(self, config: RouterConfig, metrics: RouterMetrics | None = None) -> None:
        config.validate()
        self.cfg = config
        self.metrics = metrics or RouterMetrics()
        m = self.metrics
        self.encoders = Pool("encoder", m, config.eject_after)
        self.prefills = Pool("prefill", m, config.eject_after) if config.disaggregated_prefill else None
        self.decodes = Pool("decode", m, config.eject_after)
        self.pools = [p for p in (self.encoders, self.prefills, self.decodes) if p is not None]
        self.encoder_picker = make_picker(config.encoder_policy, config.load_factor)
        self.pd_picker = make_picker(config.pd_policy, config.load_factor)
        self.prefix_keys = config.pd_policy == "prefix-aware"
        self.reuse = ReuseCache(config.reuse_ttl, config.reuse_max_items)
        self.reuse_metadata = config.reuse_mode == "metadata"
        self.rewrite_embeds = config.rewrite == "metadata"
        self.mooncake = config.mooncake
        self.models_timeout = aiohttp.ClientTimeout(total=config.prefill_timeout, sock_connect=config.connect_timeout)
        # Health probes, metrics scraping and /v1/models use aiohttp; the data path uses `upstream`.
        self.session: aiohttp.ClientSession | None = None
        # vLLM closes idle keep-alive connections after 5 s; retire ours first so a reused
        # connection is never one the server already closed.
        self.upstream = Upstream(keepalive=2.5)
        self.health: HealthChecker | None = None
        self._tasks: list[asyncio.Task] = []

    # ---- lifecycle -------------------------------------------------------------------

    async def serve(self, host: str = "127.0.0.1", port: int = 0, sock=None) -> "RouterServer":
        """Start the router's background work and listen (on `sock` when given: --workers share one)."""
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

        async def dispatch(request: HttpRequest):
            handler = routes.get((request.method, request.path))
            if handler is not None:
                return await handler(request)
            if request.path in paths:
                return json_error(405, f"method {request.method} not allowed on {request.path}")
            return json_error(404, f"no route {request.path}")

        try:
            server = await start_server(dispatch, self.cfg.max_body_bytes, host=None if sock else host, port=None if sock else port,
                                        sock=sock, limits=self.cfg.http_limits())
        except BaseException:
            await self.stop()
            raise
        return RouterServer(self, server)

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.5, ttl_dns_cache=30)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        if self.cfg.discovery == "kubernetes":
            from .discovery import KubernetesDiscovery

            discovery = KubernetesDiscovery.from_config(self.cfg, self._pool_for_role())
            await discovery.start()
            self._tasks.append(asyncio.create_task(discovery.run(), name="discovery"))
            self._discovery = discovery
        else:
            from .discovery import static_endpoints

            for role, endpoints in static_endpoints(self.cfg).items():
                self._pool_for_role()[role].update(endpoints)
        self.health = HealthChecker(self.pools, self.session, self.cfg.health_interval, self.cfg.health_timeout)
        if self.cfg.health_interval > 0:
            self._tasks.append(asyncio.create_task(self.health.run(), name="health"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError, Exception):
                await task
        discovery = getattr(self, "_discovery", None)
        if discovery is not None:
            await discovery.close()
        if self.session is not None:
            await self.session.close()
        await self.upstream.close()

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

    @staticmethod
    def _upstream_headers(request: HttpRequest) -> bytes:
        """Header lines every backend call of this request carries; each call adds its x-request-id.
        Values were decoded as latin-1 by http_server, so they go back out byte for byte."""
        auth = request.headers.get("authorization")
        if auth:
            return UPSTREAM_HEADERS + b"Authorization: %s\r\n" % auth.encode("latin-1")
        return UPSTREAM_HEADERS

    async def chat_completions(self, request: HttpRequest) -> StreamResponse:
        return await self._serve(request, CHAT, self._chat_media)

    async def completions(self, request: HttpRequest) -> StreamResponse:
        return await self._serve(request, COMPLETIONS, self._completion_media)

    def _chat_media(self, body: dict, stripped: list) -> list[MediaItem]:
        cfg = self.cfg
        return extract_media(validate_chat(body), cfg.allow_file_urls, allow_embeds=cfg.allow_client_embeds,
                             trust_uuids=cfg.trust_client_uuids, immutable_urls=cfg.immutable_media_urls, stripped=stripped)

    def _completion_media(self, body: dict, stripped: list) -> list[MediaItem]:
        validate_completion(body)
        if "prompt_embeds" in body and not self.cfg.allow_client_embeds:
            raise BadRequest("prompt_embeds are not accepted from clients by this router", param="prompt_embeds")
        return []  # /v1/completions carries text only: no encoder work

    async def _serve(self, request: HttpRequest, route: str, media_of) -> StreamResponse:
        t0 = time.perf_counter()
        rid = request.headers.get("x-request-id")
        if rid is None:
            rid = new_id()
        elif not _REQUEST_ID(rid):
            return self._answered(route, json_error(400, "x-request-id must be 1 to 256 visible ASCII characters", new_id()))
        stripped: list = []
        try:
            raw = await self._read_body(request)
            body = parse_json_object(raw)
            refuse_router_fields(body)
            items = media_of(body, stripped)
        except BadRequest as exc:
            return self._answered(route, json_error(exc.status, str(exc), rid, param=exc.param))
        try:
            return self._answered(route, await self._generate(request, route, rid, None if stripped else raw, body, items, t0), t0)
        except asyncio.CancelledError:
            self.metrics.count_request(route, 499)  # client closed the connection (nginx's code)
            raise

    def _answered(self, route: str, response: StreamResponse, t0: float | None = None) -> StreamResponse:
        self.metrics.count_request(route, response.status)
        if t0 is not None:
            elapsed = time.perf_counter() - t0
            self.metrics.observe_stage("total", elapsed)
            if self.cfg.log_requests:
                log.info("%s %s %d %.1f ms", response.headers.get("x-request-id"), route, response.status, elapsed * 1e3)
        return response

    async def models(self, request: HttpRequest) -> StreamResponse:
        rid = request.headers.get("x-request-id")
        if rid is None or not _REQUEST_ID(rid):
            rid = new_id()
        pool = self.decodes
        if not pool.available:
            return self._answered("/v1/models", json_error(503, "no decode endpoint available", rid, "service_unavailable"))
        ep = pool.available[0]
        headers = {"x-request-id": rid, "Accept-Encoding": "identity"}
        if "authorization" in request.headers:
            headers["Authorization"] = request.headers["authorization"]
        try:
            async with self.session.get(ep.url + "/v1/models", headers=headers, timeout=self.models_timeout) as r:
                data = await r.read()
                ct = r.headers.get("Content-Type", JSON)
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            pool.record_failure(ep, "connect")
            return self._answered("/v1/models", json_error(502, f"decode /v1/models failed: {exc}", rid, "upstream_error"))
        return self._answered("/v1/models", Response(body=data, status=status, headers={"Content-Type": ct, "x-request-id": rid}))

    async def health_report(self, request: HttpRequest) -> Response:
        report = {
            "proxy": "healthy",
            "encode_cluster": self.encoders.status(),
            "prefill_cluster": self.prefills.status() if self.prefills is not None else "disabled",
            "decode_cluster": self.decodes.status(),
            "tiers": {pool.role: pool.describe() for pool in self.pools},
        }
        # Without encoders the router still serves (consumers encode locally); without a
        # prefill or decode instance it cannot.
        serving = bool(self.decodes.available) and (self.prefills is None or bool(self.prefills.available))
        return Response(body=orjson.dumps(report), status=200 if serving else 503, content_type=JSON)

    async def livez(self, request: HttpRequest) -> Response:
        """Liveness: answered by the event loop itself, so a wedged loop fails it (unlike a TCP
        check, which the kernel answers). Backends play no part: they have /health."""
        return Response(body=b"ok", content_type="text/plain")

    async def metrics_report(self, request: HttpRequest) -> Response:
        data, content_type = self.metrics.exposition()
        return Response(body=data, headers={"Content-Type": content_type})

    # ---- the pipeline ----------------------------------------------------------------

    async def _generate(
        self, request: HttpRequest, path: str, rid: str, raw: bytes, body: dict, items: list[MediaItem], t0: float
    ) -> StreamResponse:
        common = self._upstream_headers(request)
        headers = common + b"x-request-id: %s\r\n" % rid.encode("latin-1")
        consumers = self.prefills if self.prefills is not None else self.decodes
        key = prompt_prefix(body, items, self.cfg.prefix_chars) if self.prefix_keys else None
        # The EC consumer is chosen before encoding: a Mooncake encoder pushes straight to it.
        consumer = self.pd_picker.pick(consumers.available, key)
        if consumer is None:
            return json_error(503, f"no {consumers.role} endpoint available", rid, "service_unavailable")
        try:
            if items:
                te = time.perf_counter()
                encoded = await self._encode(body, items, rid, common, consumer.ec_zmq if self.mooncake else None)
                self.metrics.observe_stage("encode", time.perf_counter() - te)
            else:
                encoded = {}
        except UpstreamRejected as rej:
            return Response(body=rej.body, status=rej.status, headers={"Content-Type": rej.content_type, "x-request-id": rid})

        metadata_only = self.rewrite_embeds and any(enc.metadata for enc in encoded.values())
        # Raw items carry their uuid (SharedStorage finds a stored embedding under it); not with
        # Mooncake, whose consumer would wait for a push that nobody sends.
        pin = not self.mooncake
        prepared = rewrite_for_decode(body, items, encoded, pin_raw=pin, embeds=self.rewrite_embeds) if items else body

        def raw_media() -> dict:
            # The retry body after a consumer failed a metadata-only request: media kept,
            # uuids pinned, and the remembered items forgotten.
            for item in items:
                self.reuse.forget(reuse_key(body, item))
            return rewrite_for_decode(body, items, {}, pin_raw=pin)

        ctx = _Timing(t0, rid)
        try:
            if self.prefills is not None:
                return await self._prefill_then_decode(request, path, prepared, metadata_only, raw_media, consumer, headers, key, ctx)
            data = raw if prepared is body and raw is not None else orjson.dumps(prepared)
            return await self._serve_consumer(request, path, data, metadata_only, raw_media, consumer, headers, key, ctx)
        except UpstreamRejected as rej:
            return Response(body=rej.body, status=rej.status, headers={"Content-Type": rej.content_type, "x-request-id": rid})

    async def _serve_consumer(self, request, path, data, metadata_only, raw_media, ep, headers, key, ctx) -> StreamResponse:
        """E+PD: the PD instance answers; one retry elsewhere before the first byte."""
        pool = self.decodes
        try:
            return await self._stream_from(request, pool, ep, path, data, headers, ctx, metadata_only)
        except UpstreamFailure as failure:
            reason = "metadata_rejected" if metadata_only and failure.kind == "status" else failure.kind
            self.metrics.retries.labels("decode", reason).inc()
            if metadata_only and failure.kind == "status":
                data = orjson.dumps(raw_media())
            retry_ep = self.pd_picker.pick(pool.available, key, exclude=(ep,)) or ep
            try:
                return await self._stream_from(request, pool, retry_ep, path, data, headers, ctx, False)
            except UpstreamFailure as final:
                return final.response(ctx.rid, "decode")

    async def _prefill_then_decode(self, request, path, prepared, metadata_only, raw_media, p_ep, headers, key, ctx):
        """E/P/D: P computes the KV (max_tokens 1), D pulls it and answers."""
        tp = time.perf_counter()
        try:
            kv, p_ep, prepared = await self._prefill(path, prepared, metadata_only, raw_media, p_ep, headers, key)
        except UpstreamFailure as failure:
            return failure.response(ctx.rid, "prefill")
        self.metrics.observe_stage("prefill", time.perf_counter() - tp)
        d_ep = self.pd_picker.pick(self.decodes.available, key)
        if d_ep is None:
            return json_error(503, "no decode endpoint available", ctx.rid, "service_unavailable")
        data = orjson.dumps({**prepared, "kv_transfer_params": kv} if kv else prepared)
        try:
            return await self._stream_from(request, self.decodes, d_ep, path, data, headers, ctx, False)
        except UpstreamFailure as failure:
            self.metrics.retries.labels("decode", failure.kind).inc()
        # D's KV handle may be spent: prefill again on the P that worked, then another D.
        try:
            kv = await self._prefill_once(p_ep, path, orjson.dumps(prefill_request(prepared)), headers)
        except UpstreamFailure as failure:
            return failure.response(ctx.rid, "prefill")
        retry_ep = self.pd_picker.pick(self.decodes.available, key, exclude=(d_ep,)) or d_ep
        data = orjson.dumps({**prepared, "kv_transfer_params": kv} if kv else prepared)
        try:
            return await self._stream_from(request, self.decodes, retry_ep, path, data, headers, ctx, False)
        except UpstreamFailure as final:
            return final.response(ctx.rid, "decode")

    async def _prefill(self, path, prepared, metadata_only, raw_media, ep, headers, key):
        """Returns (kv_transfer_params, the P that answered, the body it accepted)."""
        try:
            return await self._prefill_once(ep, path, orjson.dumps(prefill_request(prepared)), headers, metadata_only), ep, prepared
        except UpstreamFailure as failure:
            reason = "metadata_rejected" if metadata_only and failure.kind == "status" else failure.kind
            self.metrics.retries.labels("prefill", reason).inc()
            if metadata_only and failure.kind == "status":
                prepared = raw_media()
        retry_ep = self.pd_picker.pick(self.prefills.available, key, exclude=(ep,)) or ep
        return await self._prefill_once(retry_ep, path, orjson.dumps(prefill_request(prepared)), headers), retry_ep, prepared

    async def _prefill_once(self, ep: Endpoint, path: str, data: bytes, headers: bytes, metadata_only: bool = False):
        self.prefills.acquire(ep)
        payload = await self._exchange(self.prefills, ep, path, data, headers, self.cfg.prefill_timeout, 1, metadata_only)
        try:
            return orjson.loads(payload).get("kv_transfer_params")
        except (orjson.JSONDecodeError, AttributeError):
            self.prefills.record_failure(ep, "reply")
            raise UpstreamFailure("reply") from None

    async def _exchange(self, pool: Pool, ep: Endpoint, path: str, data: bytes, headers: bytes, timeout: float, weight: int,
                        metadata_only: bool = False) -> bytes:
        """POST and read a whole JSON reply (encoder, prefill) within `timeout` seconds. `weight`
        in-flight units were acquired by the caller and are released here. A 400 to a
        metadata-only body is retryable, not final."""
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            r = await self.upstream.request(ep.origin, "POST", ep.prefix + path, headers, data,
                                            connect_timeout=min(self.cfg.connect_timeout, timeout), deadline=deadline)
            try:
                payload = await r.read(deadline)
            finally:
                r.release()
        except UpstreamError as exc:
            kind = "timeout" if exc.kind == "timeout" else "connect"
            pool.record_failure(ep, kind)
            raise UpstreamFailure(kind) from None
        finally:
            pool.release(ep, weight)
        status = r.status
        if status != 200:
            ct = r.content_type
            if client_error(status) and not (metadata_only and status == 400):
                raise UpstreamRejected(status, payload, ct)
            if not client_error(status):
                pool.record_failure(ep, "status")
            raise UpstreamFailure("status", status, payload, ct)
        pool.record_success(ep)
        return payload

    async def _stream_from(self, request, pool: Pool, ep: Endpoint, path, data, headers, ctx, metadata_only) -> StreamResponse:
        """One attempt at a generating backend. Raises UpstreamFailure only before the first byte."""
        td = time.perf_counter()
        pool.acquire(ep)
        resp = None
        try:
            try:
                resp = await self.upstream.request(ep.origin, "POST", ep.prefix + path, headers, data,
                                                   connect_timeout=self.cfg.connect_timeout, idle=self.cfg.decode_timeout)
            except UpstreamError as exc:
                kind = "timeout" if exc.kind == "timeout" else "connect"
                pool.record_failure(ep, kind)
                raise UpstreamFailure(kind) from None
            if resp.status >= 500 or (metadata_only and resp.status == 400):
                body = await _read_quietly(resp)
                if resp.status >= 500:
                    pool.record_failure(ep, "status")
                raise UpstreamFailure("status", resp.status, body, resp.content_type)
            out = await self._relay(request, resp, ctx, pool, ep)
            pool.record_success(ep)
            self.metrics.observe_stage("decode", time.perf_counter() - td)
            return out
        except BaseException:
            if resp is not None:
                resp.close()  # abort the upstream call (client gone, or giving up)
            raise
        finally:
            pool.release(ep)
            if resp is not None:
                resp.release()

    async def _relay(self, request: HttpRequest, resp: UpstreamResponse, ctx: "_Timing", pool: Pool, ep: Endpoint) -> StreamResponse:
        ct = resp.content_type
        if not ct.startswith("text/event-stream"):
            try:
                data = await resp.read()
            except UpstreamError:
                pool.record_failure(ep, "read")
                raise UpstreamFailure("read") from None
            self.metrics.observe_stage("ttfb", time.perf_counter() - ctx.t0)
            return Response(body=data, status=resp.status, headers={"Content-Type": ct, "x-request-id": ctx.rid})
        body = resp.iter_body()
        try:
            first = await anext(body, b"")
        except UpstreamError:
            pool.record_failure(ep, "read")
            raise UpstreamFailure("read") from None
        out = StreamResponse(status=resp.status, headers={"Content-Type": ct, "Cache-Control": "no-cache", "x-request-id": ctx.rid})
        await out.prepare(request)
        if first:
            await out.write(first)
        self.metrics.observe_stage("ttfb", time.perf_counter() - ctx.t0)
        try:
            async for chunk in body:
                try:
                    await out.write(chunk)
                except ConnectionResetError:
                    # The client went away mid-stream: stop decode's work too.
                    resp.close()
                    return out
        except UpstreamError as exc:
            # Bytes already reached the client: nothing to retry; end the stream where it broke.
            pool.record_failure(ep, "stream")
            log.warning("[%s] decode stream from %s broke after the first byte: %r", ctx.rid, ep.url, exc)
        await out.write_eof()
        return out

    # ---- encoders --------------------------------------------------------------------

    async def _encode(self, body: dict, items: list[MediaItem], rid: str, headers: bytes, consumer_zmq: str | None) -> dict[int, EncodedItem]:
        encoded: dict[int, EncodedItem] = {}
        todo = items
        if self.reuse.enabled:
            todo = []
            for item in items:
                hit = self.reuse.recall(reuse_key(body, item)) if item.content_addressed else None
                if hit is None:
                    todo.append(item)
                elif self.reuse_metadata:
                    hit.transfer_id = new_id()
                    encoded[item.index] = hit
                # else "pinned": the item goes raw with its uuid and the consumer loads the stored
                # embedding, or encodes locally if the janitor removed it meanwhile.
            self.metrics.count_items("reused", len(items) - len(todo))
        if not todo:
            return encoded
        if not self.encoders.available:
            self.metrics.count_items("fallback", len(todo))
            self.metrics.fallback_requests.labels("no_encoder").inc()
            return encoded
        failed = await self._encode_round(body, todo, rid, headers, consumer_zmq, encoded, {})
        if failed:
            self.metrics.retries.labels("encode", "encoder_failed").inc()
            failed = await self._encode_round(body, [item for item, _ in failed], rid, headers, consumer_zmq, encoded, dict(
                (item.index, ep) for item, ep in failed))
        if failed:
            self.metrics.fallback_requests.labels("encoder_failed").inc()
        self.metrics.count_items("encoded", sum(1 for i in todo if i.index in encoded and encoded[i.index].metadata))
        self.metrics.count_items("fallback", sum(1 for i in todo if not (i.index in encoded and encoded[i.index].metadata)))
        if self.reuse.enabled:
            for item in todo:
                if item.index in encoded and item.content_addressed:
                    self.reuse.remember(reuse_key(body, item), encoded[item.index])
        return encoded

    async def _encode_round(self, body, items, rid, headers, consumer_zmq, encoded, avoid: dict[int, Endpoint]):
        """Encode items concurrently (same-encoder images batched); returns (item, encoder) pairs that failed."""
        pool = self.encoders
        targets: list[Endpoint] = []
        for item in items:
            avoided = avoid.get(item.index)
            ep = self.encoder_picker.pick(pool.available, item.uuid, (avoided,) if avoided else ())
            if ep is None:
                ep = self.encoder_picker.pick(pool.available, item.uuid)
            if ep is None:  # every encoder was ejected meanwhile: send what is left raw
                return [(i, None) for i in items[len(targets):]] + await self._encode_groups(
                    body, items[: len(targets)], targets, rid, headers, consumer_zmq, encoded)
            pool.acquire(ep)  # count it now so the next item of this request sees the load
            targets.append(ep)
        return await self._encode_groups(body, items, targets, rid, headers, consumer_zmq, encoded)

    async def _encode_groups(self, body, items, targets, rid, headers, consumer_zmq, encoded):
        groups = group_for_encoders(items, targets, self.cfg.encoder_max_batch)
        if len(groups) == 1:  # the usual case: awaited in place, no task per call
            ep, group = groups[0]
            try:
                results = [await self._encode_group(ep, group, body, rid, headers, consumer_zmq)]
            except (UpstreamFailure, UpstreamRejected) as exc:
                results = [exc]
        else:
            results = await asyncio.gather(
                *(self._encode_group(ep, group, body, rid, headers, consumer_zmq) for ep, group in groups), return_exceptions=True
            )
        failed = []
        for (ep, group), result in zip(groups, results):
            if isinstance(result, UpstreamRejected):
                raise result
            if isinstance(result, UpstreamFailure):
                failed.extend((item, ep) for item in group)
            elif isinstance(result, BaseException):
                raise result
            else:
                encoded.update(result)
        return failed

    async def _encode_group(self, ep: Endpoint, group: list[MediaItem], body, rid, headers, consumer_zmq) -> dict[int, EncodedItem]:
        pool = self.encoders
        transfer_ids = [new_id() for _ in group]
        req = encoder_request(body, group, consumer_zmq, transfer_ids)
        sub_headers = headers + f"x-request-id: {rid}:{group[0].index}:{new_id()[:6]}\r\n".encode("latin-1")
        payload = await self._exchange(pool, ep, CHAT, orjson.dumps(req), sub_headers, self.cfg.encode_timeout, len(group))
        try:
            matched = match_encoder_reply(orjson.loads(payload).get("ec_transfer_params"), group)
        except (orjson.JSONDecodeError, AttributeError, EncoderReplyError) as exc:
            log.warning("[%s] encoder %s reply unusable: %s", rid, ep.url, exc)
            pool.record_failure(ep, "reply")
            raise UpstreamFailure("reply") from None
        tid = {item.index: t for item, t in zip(group, transfer_ids)}
        return {index: EncodedItem(mm_hash, report, tid[index]) for index, (mm_hash, report) in matched.items()}


class RouterServer:
    """A listening router: `url` to reach it, `cleanup()` to stop listening and stop its work."""

    def __init__(self, router: Router, server: asyncio.AbstractServer) -> None:
        self.router = router
        self.server = server
        host, port = server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    async def cleanup(self) -> None:
        self.server.close()
        await self.router.stop()


class _Timing:
    __slots__ = ("t0", "rid")

    def __init__(self, t0: float, rid: str) -> None:
        self.t0 = t0
        self.rid = rid


async def _read_quietly(resp: UpstreamResponse) -> bytes:
    try:
        return await resp.read()
    except UpstreamError:
        return b""
