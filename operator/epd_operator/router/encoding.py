"""The E stage: a request's media items to encoder instances and back as EC transfer handles.

Items already encoded recently come from the reuse cache. The rest are spread over encoders
(items bound for the same encoder go in one call, up to `encoder_max_batch`), concurrently.
An item whose encoder failed is tried once more on another; an item that still failed, or
that found no encoder, goes to the consumer raw (it encodes it locally): encoding never fails
a request, except when an encoder refuses it as a client error (`BackendRejection`).

Spill-over: while every encoder has `spill_encoder_inflight` items in flight or more (the tier is
behind, e.g. while a scale-up starts new encoders) and the request's consumer has fewer than
`spill_consumer_inflight` requests in flight (or that bound is 0), all of the request's new items go
raw to the consumer, which encodes them itself, instead of queuing. The decision is per request: its
items never split between the two paths, so the consumer gets either encoder outputs or raw media
for the new items, as after a fallback. A spilled item was never with an encoder: no picker records
a home for it and the reuse cache does not remember it.

Demand (`epd_router_encoder_demand`, what both autoscaling engines read): the media items this stage
wants encoded and that are not finished. An item sent to an encoder counts until its encoder rounds
end; an item sent raw because the tier is behind (spilled) or has no encoder for the request's
generation (at zero, say) counts until the consumer answers (`RequestContext.release_raw`):
either way it is encoder work that the tier did not absorb, and an autoscaler that stopped seeing it
once it spilled would ask for at most the spill bound's worth of encoders. Not counted: reused items,
the video of a request whose audio rides in it (its consumer must encode it anyway), and items whose
encoder failed (a failure is not load; it shows in the failure counters). The gauge shows the most
of them at once over the last `--demand-window` seconds (demand.py says why).
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from .backends import Endpoint, Pool
from .calls import BackendCalls, unusable_reply
from .config import RouterConfig
from .context import RequestContext
from .contract import SPILL_REASON_ENCODERS_BUSY
from .demand import EncoderDemand
from .failures import BackendRejection, RetryableFailure
from .http_messages import LATIN1
from .metrics import RouterMetrics
from .pickers import Picker
from .protocol import (
    EncodedItem,
    EncoderReplyError,
    MediaItem,
    audio_in_video,
    encoder_request,
    group_for_encoders,
    match_encoder_reply,
    new_id,
)
from .reuse import ReuseCache, encoder_key, reuse_key

log = logging.getLogger("epd_router")

CHAT = "/v1/chat/completions"  # encoders are always called on chat: media only travels there


class EncoderStage:
    def __init__(
        self,
        config: RouterConfig,
        metrics: RouterMetrics,
        pool: Pool,
        picker: Picker,
        calls: BackendCalls,
        reuse: ReuseCache,
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.pool = pool
        self.picker = picker
        self.calls = calls
        self.reuse = reuse
        self.reuse_metadata = config.reuse_mode == "metadata"
        self.demand = EncoderDemand(metrics.encoder_demand.labels(config.deployment), config.demand_window)

    async def encode(self, ctx: RequestContext) -> dict[int, EncodedItem]:
        """Transfer handles by item index; items missing from the result go raw."""
        body, items = ctx.body, ctx.items
        encoded: dict[int, EncodedItem] = {}
        if audio_in_video(body):  # each video carries its audio track: its consumer encodes it
            kept = [item for item in items if item.kind != "video_url"]
            self.metrics.count_items("fallback", len(items) - len(kept))
            items = kept
        todo = items
        if self.reuse.enabled:
            todo = []
            for item in items:
                if not item.content_addressed:  # what is behind its URL may change: never reused
                    todo.append(item)
                    continue
                hit = self.reuse.recall(reuse_key(body, item))
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
        if not self.pool.available_in(ctx.generation):
            # Consumers encode raw media themselves: slower, but never across generations.
            self.metrics.count_items("fallback", len(todo))
            reason = "no_encoder" if not self.pool.available else "no_encoder_in_generation"
            self.metrics.fallback_requests.labels(reason).inc()
            self._hold_raw(ctx, len(todo))
            return encoded
        if self._spills(ctx):
            reason = SPILL_REASON_ENCODERS_BUSY
            self.metrics.count_items("spilled", len(todo))
            self.metrics.spilled_items.labels(reason).inc(len(todo))
            self.metrics.spilled_requests.labels(reason).inc()
            if ctx.trace is not None:
                ctx.trace.event("encoder_spill", {"epd.reason": reason, "epd.items": len(todo)})
            self._hold_raw(ctx, len(todo))
            return encoded
        self.demand.inc(len(todo))
        try:
            failed = await self._round(ctx, todo, encoded, {})
            if failed:
                self.metrics.retries.labels("encode", "encoder_failed").inc()
                if ctx.trace is not None:
                    ctx.trace.event(
                        "retry", {"epd.stage": "encode", "epd.reason": "encoder_failed", "epd.items": len(failed)}
                    )
                failed = await self._round(
                    ctx, [item for item, _ in failed], encoded, {item.index: ep for item, ep in failed}
                )
        finally:
            self.demand.dec(len(todo))
        if failed:
            self.metrics.fallback_requests.labels("encoder_failed").inc()
        self.metrics.count_items("encoded", sum(1 for i in todo if i.index in encoded and encoded[i.index].metadata))
        self.metrics.count_items(
            "fallback", sum(1 for i in todo if not (i.index in encoded and encoded[i.index].metadata))
        )
        if self.reuse.enabled:
            for item in todo:
                if item.index in encoded and item.content_addressed:
                    self.reuse.remember(reuse_key(body, item), encoded[item.index])
        return encoded

    def _hold_raw(self, ctx: RequestContext, n: int) -> None:
        """Items sent raw instead of to an encoder: demand until the consumer answers (`ctx.release_raw`).
        A request is encoded once and holds its raw items once."""
        self.demand.inc(n)
        ctx.raw_demand = n
        ctx.demand = self.demand

    def _spills(self, ctx: RequestContext) -> bool:
        """Spill-over (module doc): every encoder of the request's generation is at the bound, and its consumer is not."""
        bound = self.cfg.spill_encoder_inflight
        if not bound:
            return False
        for ep in self.pool.available_in(ctx.generation):
            if ep.load < bound:
                return False
        limit, consumer = self.cfg.spill_consumer_inflight, ctx.consumer
        return not limit or consumer is None or consumer.load < limit

    async def _round(
        self,
        ctx: RequestContext,
        items: list[MediaItem],
        encoded: dict[int, EncodedItem],
        avoid: dict[int, Endpoint | None],
    ) -> list[tuple[MediaItem, Endpoint | None]]:
        """Encode items concurrently, avoiding each one's failed encoder; returns (item, encoder) pairs that failed."""
        pool = self.pool
        ready = pool.available_in(ctx.generation)
        if not ready:  # the encoders that failed the first round were ejected, and no other is left: all raw
            return [(item, None) for item in items]
        targets: list[Endpoint] = []
        for item in items:
            avoided = avoid.get(item.index)
            # Another encoder than the one that failed this item, else that one again (the only one left).
            ep = self.picker.pick(ready, encoder_key(ctx.body, item), (avoided,)) or avoided
            assert ep is not None  # `ready` is not empty
            pool.acquire(ep)  # count it now so the next item of this request sees the load
            targets.append(ep)
        return await self._groups(ctx, items, targets, encoded)

    async def _groups(
        self, ctx: RequestContext, items: list[MediaItem], targets: list[Endpoint], encoded: dict[int, EncodedItem]
    ) -> list[tuple[MediaItem, Endpoint | None]]:
        """One call per group of items bound for the same encoder, concurrently. An encoder's client error
        (`BackendRejection`) fails the request: the other calls are cancelled and it is raised."""
        failed: list[tuple[MediaItem, Endpoint | None]] = []

        async def call(ep: Endpoint, group: list[MediaItem]) -> None:
            try:
                encoded.update(await self._call(ctx, ep, group))
            except RetryableFailure:
                failed.extend((item, ep) for item in group)

        groups = group_for_encoders(items, targets, self.cfg.encoder_max_batch)
        if len(groups) == 1:  # the usual case: awaited in place, no task per call
            await call(*groups[0])
            return failed
        try:
            async with asyncio.TaskGroup() as calls:
                for ep, group in groups:
                    calls.create_task(call(ep, group))
        except* BackendRejection as rejected:
            raise rejected.exceptions[0] from None
        return failed

    async def _call(self, ctx: RequestContext, ep: Endpoint, group: list[MediaItem]) -> dict[int, EncodedItem]:
        """One encoder call for a group of items (its in-flight units were acquired by `_round`)."""
        headers = ctx.common_headers + f"x-request-id: {ctx.rid}:{group[0].index}:{new_id()[:6]}\r\n".encode(LATIN1)
        if ctx.trace is None:
            return await self._encoder_call(ctx, ep, group, headers)
        with ctx.trace.call("encode", ep, CHAT, {"epd.items": len(group)}) as call:
            return await self._encoder_call(ctx, ep, group, headers + call.headers)

    async def _encoder_call(
        self, ctx: RequestContext, ep: Endpoint, group: list[MediaItem], headers: bytes
    ) -> dict[int, EncodedItem]:
        pool = self.pool
        transfer_ids = {item.index: new_id() for item in group}
        req = encoder_request(ctx.body, group, ctx.consumer_zmq, list(transfer_ids.values()))
        payload = await self.calls.exchange(
            pool, ep, CHAT, orjson.dumps(req), headers, self.cfg.encode_timeout, len(group)
        )
        try:
            matched = match_encoder_reply(orjson.loads(payload).get("ec_transfer_params"), group)
        except (orjson.JSONDecodeError, AttributeError, EncoderReplyError) as exc:
            log.warning("[%s] encoder %s reply unusable: %s", ctx.rid, ep.url, exc)
            raise unusable_reply(pool, ep) from None
        return {
            index: EncodedItem(mm_hash, report, transfer_ids[index]) for index, (mm_hash, report) in matched.items()
        }
