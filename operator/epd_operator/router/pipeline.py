"""The EPD pipeline: one generation request through E → (P) → D, carried by a `RequestContext` (context.py).

    pick the EC consumer ─ encode media (encoding.py) ─ rewrite the body for the consumer
      E+PD:  the PD instance answers                       (retry_once on the decode pool)
      E/P/D: P computes the KV (max_tokens 1)              (retry_once on the prefill pool)
             then D pulls it and answers                   (retry_once on the decode pool,
                                                            prefilling again before the retry)

Every prefill and decode step goes through `retry_once`, the router's one retry policy: on a
`RetryableFailure` before the client saw a byte, count it, and try once more on another
instance of the same tier (the same instance if it is alone); a consumer that refused a
metadata-only body gets the media itself the second time. A second failure answers the client.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson

from .backends import Endpoint, Pool, finishing_consumers
from .calls import BackendCalls, unusable_reply
from .config import RouterConfig
from .context import RequestContext
from .encoding import EncoderStage
from .failures import BackendRejection, RetryableFailure, json_error
from .http_messages import LATIN1, Reply
from .metrics import RouterMetrics
from .pickers import Picker
from .protocol import prefill_request, prompt_prefix, rewrite_for_decode
from .reuse import ReuseCache, reuse_key

T = TypeVar("T")
UPSTREAM_HEADERS = b"Content-Type: application/json\r\nAccept-Encoding: identity\r\n"


class Pipeline:
    def __init__(
        self,
        config: RouterConfig,
        metrics: RouterMetrics,
        encoders: Pool,
        prefills: Pool | None,
        decodes: Pool,
        encoder_picker: Picker,
        pd_pickers: dict[str, Picker],
        calls: BackendCalls,
        reuse: ReuseCache,
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.prefills = prefills
        self.decodes = decodes
        # One picker per consumer pool (keyed by role): a prefix-aware picker remembers each key's home,
        # and one shared by prefill and decode would overwrite the one pool's home with the other's.
        self.pd_pickers = pd_pickers
        self.calls = calls
        self.reuse = reuse
        self.encoding = EncoderStage(config, metrics, encoders, encoder_picker, calls, reuse)
        self.prefix_keys = config.pd_policy == "prefix-aware"
        self.rewrite_embeds = config.rewrite == "metadata"
        self.mooncake = config.mooncake

    async def run(self, ctx: RequestContext) -> Reply:
        auth = ctx.request.headers.get("authorization")
        # Values were decoded as latin-1 by http_server, so they go back out byte for byte.
        ctx.common_headers = (
            UPSTREAM_HEADERS + b"Authorization: %s\r\n" % auth.encode(LATIN1) if auth else UPSTREAM_HEADERS
        )
        ctx.headers = ctx.common_headers + b"x-request-id: %s\r\n" % ctx.rid.encode(LATIN1)
        consumers = self.prefills if self.prefills is not None else self.decodes
        ctx.key = prompt_prefix(ctx.body, ctx.items, self.cfg.prefix_chars) if self.prefix_keys else None
        # The EC consumer is chosen before encoding: a Mooncake encoder pushes straight to it. Its
        # generation then binds the request: encoders and decodes of another build cannot talk to it.
        candidates = finishing_consumers(consumers, self.decodes if self.prefills is not None else None)
        consumer = ctx.consumer = self.pd_pickers[consumers.role].pick(candidates, ctx.key)
        if consumer is None:
            return json_error(503, f"no {consumers.role} endpoint available", ctx.rid, "service_unavailable")
        ctx.generation = consumer.generation
        ctx.consumer_zmq = consumer.ec_zmq if self.mooncake else None
        try:
            if ctx.items:
                te = time.perf_counter()
                ctx.encoded = await self.encoding.encode(ctx)
                if ctx.trace is not None:
                    ctx.trace.encoded(len(ctx.items), sum(1 for enc in ctx.encoded.values() if enc.metadata))
                self.metrics.observe_stage("encode", time.perf_counter() - te)
            ctx.metadata_only = self.rewrite_embeds and any(enc.metadata for enc in ctx.encoded.values())
            # Raw items carry their uuid (SharedStorage finds a stored embedding under it); not
            # with Mooncake, whose consumer would wait for a push that nobody sends.
            if ctx.items:
                ctx.prepared = rewrite_for_decode(
                    ctx.body, ctx.items, ctx.encoded, pin_raw=not self.mooncake, embeds=self.rewrite_embeds
                )
            if self.prefills is not None:
                return await self._prefill_then_decode(ctx, self.prefills, consumer)
            return await self._pd(ctx, consumer)
        except BackendRejection as rejection:
            return rejection.response(ctx.rid)
        finally:
            ctx.release_raw()  # whatever way the request ended

    async def _pd(self, ctx: RequestContext, consumer: Endpoint) -> Reply:
        """E+PD: the PD instance chosen as EC consumer answers."""
        try:
            return await self.retry_once(ctx, self.decodes, consumer, self._decode_attempt, ctx.metadata_only)
        except RetryableFailure as failure:
            return failure.response(ctx.rid)

    async def _prefill_then_decode(self, ctx: RequestContext, prefills: Pool, consumer: Endpoint) -> Reply:
        """E/P/D: P (the EC consumer) computes the KV with max_tokens 1, D pulls it and answers."""
        tp = time.perf_counter()
        try:
            p_ep = await self.retry_once(ctx, prefills, consumer, self._prefill_attempt, ctx.metadata_only)
        except RetryableFailure as failure:
            return failure.response(ctx.rid)
        ctx.release_raw()  # prefill, the EC consumer, encoded the raw items
        self.metrics.observe_stage("prefill", time.perf_counter() - tp)
        d_ep = self.pd_pickers[self.decodes.role].pick(self.decodes.available_in(ctx.generation), ctx.key)
        if d_ep is None:
            return json_error(503, "no decode endpoint available", ctx.rid, "service_unavailable")

        async def prefill_again() -> None:
            # D's KV handle may be spent: prefill again on the P that worked, then another D.
            await self._prefill_attempt(ctx, p_ep, False)

        try:
            return await self.retry_once(ctx, self.decodes, d_ep, self._decode_attempt, False, prefill_again)
        except RetryableFailure as failure:
            return failure.response(ctx.rid)

    async def retry_once(
        self,
        ctx: RequestContext,
        pool: Pool,
        ep: Endpoint,
        attempt: Callable[[RequestContext, Endpoint, bool], Awaitable[T]],
        metadata_only: bool,
        before_retry: Callable[[], Awaitable[None]] | None = None,
    ) -> T:
        """The retry policy. `attempt(ctx, ep, metadata_only)` on `ep`; after a RetryableFailure,
        once more on another instance of `pool` (or `ep` again when it is alone), after
        `before_retry`. A 400 to a metadata-only body counts as retryable, and the second
        attempt carries the media. The second failure is raised."""
        try:
            return await attempt(ctx, ep, metadata_only)
        except RetryableFailure as failure:
            metadata_rejected = metadata_only and failure.kind == "status"
            reason = "metadata_rejected" if metadata_rejected else failure.kind
            self.metrics.retries.labels(pool.role, reason).inc()
            if ctx.trace is not None:
                ctx.trace.event("retry", {"epd.stage": pool.role, "epd.reason": reason})
            if metadata_rejected:
                self._send_media(ctx)
        if before_retry is not None:
            await before_retry()
        retry_ep = self.pd_pickers[pool.role].pick(pool.available_in(ctx.generation), ctx.key, exclude=(ep,)) or ep
        return await attempt(ctx, retry_ep, False)

    def _send_media(self, ctx: RequestContext) -> None:
        """After a consumer failed a metadata-only body: the media goes again, uuids pinned, and
        the remembered encodings of these items are forgotten."""
        for item in ctx.items:
            self.reuse.forget(reuse_key(ctx.body, item))
        ctx.prepared = rewrite_for_decode(ctx.body, ctx.items, {}, pin_raw=not self.mooncake)
        ctx.metadata_only = False
        ctx.payload = None

    async def _prefill_attempt(self, ctx: RequestContext, ep: Endpoint, metadata_only: bool) -> Endpoint:
        """Prefill on `ep`, keeping its KV handle in the context; returns `ep`, the P that answered."""
        if ctx.trace is None:
            await self._prefill_call(ctx, ep, metadata_only, ctx.headers)
        else:
            with ctx.trace.call("prefill", ep, ctx.route) as call:
                await self._prefill_call(ctx, ep, metadata_only, ctx.headers + call.headers)
        return ep

    async def _prefill_call(self, ctx: RequestContext, ep: Endpoint, metadata_only: bool, headers: bytes) -> None:
        pool = self.prefills
        assert pool is not None  # only E/P/D prefills
        pool.acquire(ep)
        payload = await self.calls.exchange(
            pool,
            ep,
            ctx.route,
            orjson.dumps(prefill_request(ctx.prepared)),
            headers,
            self.cfg.prefill_timeout,
            1,
            metadata_only,
        )
        try:
            ctx.kv = orjson.loads(payload).get("kv_transfer_params")
        except (orjson.JSONDecodeError, AttributeError):
            raise unusable_reply(pool, ep) from None

    async def _decode_attempt(self, ctx: RequestContext, ep: Endpoint, metadata_only: bool) -> Reply:
        if self.prefills is None:
            return await self._decode_call(ctx, ep, metadata_only)
        # E/P/D: what became of prefill's KV, as far as the router sees it. A failed KV load fails
        # the request in vLLM (a 5xx): counted, so a transfer problem shows before the retry hides it.
        try:
            out = await self._decode_call(ctx, ep, metadata_only)
        except RetryableFailure:
            if ctx.kv:
                self.metrics.kv_handoffs.labels("failed").inc()
            raise
        self.metrics.kv_handoffs.labels("pulled" if ctx.kv else "missing").inc()
        return out

    async def _decode_call(self, ctx: RequestContext, ep: Endpoint, metadata_only: bool) -> Reply:
        if self.prefills is not None:
            data = orjson.dumps({**ctx.prepared, "kv_transfer_params": ctx.kv} if ctx.kv else ctx.prepared)
        elif ctx.payload is not None:
            data = ctx.payload
        else:
            data = ctx.payload = (
                ctx.raw if ctx.prepared is ctx.body and ctx.raw is not None else orjson.dumps(ctx.prepared)
            )
        if ctx.trace is None:
            return await self.calls.stream(ctx, self.decodes, ep, data, ctx.headers, metadata_only)
        with ctx.trace.call("decode", ep, ctx.route) as call:
            out = await self.calls.stream(ctx, self.decodes, ep, data, ctx.headers + call.headers, metadata_only)
            call.answered(out.status)
            return out
