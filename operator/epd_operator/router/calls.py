"""One call to one backend instance, with the pool's bookkeeping (in-flight load, failures that
count towards ejection) and the translation of what went wrong into `RetryableFailure` or
`BackendRejection`. Which instance to call, and what to do after a failure, is pipeline.py's."""

from __future__ import annotations

import asyncio
import logging
import time

from .backends import Endpoint, Pool
from .config import RouterConfig
from .context import RequestContext
from .failures import BackendRejection, RetryableFailure, is_client_error
from .http_messages import CACHE_CONTROL, CONTENT_TYPE, REQUEST_ID, Reply, Response, StreamResponse
from .metrics import RouterMetrics
from .upstream import BackendReply, TransportError, Upstream

log = logging.getLogger("epd_router")


class BackendCalls:
    def __init__(self, config: RouterConfig, metrics: RouterMetrics, upstream: Upstream) -> None:
        self.cfg = config
        self.metrics = metrics
        self.upstream = upstream

    async def exchange(
        self,
        pool: Pool,
        ep: Endpoint,
        path: str,
        data: bytes,
        headers: bytes,
        timeout: float,
        weight: int,
        tolerate_400: bool = False,
    ) -> bytes:
        """POST and read a whole JSON reply (encoder, prefill) within `timeout` seconds. `weight`
        in-flight units were acquired by the caller and are released here. With `tolerate_400`
        (a metadata-only body) a 400 is retryable, not final."""
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            r = await self.upstream.request(
                ep.origin,
                "POST",
                ep.prefix + path,
                headers + ep.rank_header,
                data,
                connect_timeout=min(self.cfg.connect_timeout, timeout),
                deadline=deadline,
            )
            try:
                payload = await r.read(deadline)
            finally:
                r.release()
        except TransportError as exc:
            kind = "timeout" if exc.kind == "timeout" else "connect"
            pool.record_failure(ep, kind)
            raise RetryableFailure(kind, pool.role) from None
        finally:
            pool.release(ep, weight)
        status = r.status
        if status != 200:
            ct = r.content_type
            if is_client_error(status) and not (tolerate_400 and status == 400):
                raise BackendRejection(status, payload, ct)
            if not is_client_error(status):
                pool.record_failure(ep, "status")
            raise RetryableFailure("status", pool.role, status, payload, ct)
        pool.record_success(ep)
        return payload

    async def stream(
        self, ctx: RequestContext, pool: Pool, ep: Endpoint, data: bytes, headers: bytes, tolerate_400: bool
    ) -> Reply:
        """One attempt at a generating backend, relayed to the client as it comes. Raises
        RetryableFailure only before the first byte reached the client."""
        td = time.perf_counter()
        pool.acquire(ep)
        resp = None
        try:
            try:
                resp = await self.upstream.request(
                    ep.origin,
                    "POST",
                    ep.prefix + ctx.route,
                    headers + ep.rank_header,
                    data,
                    connect_timeout=self.cfg.connect_timeout,
                    idle=self.cfg.decode_timeout,
                )
            except TransportError as exc:
                kind = "timeout" if exc.kind == "timeout" else "connect"
                pool.record_failure(ep, kind)
                raise RetryableFailure(kind, pool.role) from None
            if resp.status >= 500 or (tolerate_400 and resp.status == 400):
                body = await _read_quietly(resp)
                if resp.status >= 500:
                    pool.record_failure(ep, "status")
                raise RetryableFailure("status", pool.role, resp.status, body, resp.content_type)
            out = await self._relay(ctx, resp, pool, ep)
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

    async def _relay(self, ctx: RequestContext, resp: BackendReply, pool: Pool, ep: Endpoint) -> Reply:
        ct = resp.content_type
        if not ct.startswith("text/event-stream"):
            try:
                data = await resp.read()
            except TransportError:
                pool.record_failure(ep, "read")
                raise RetryableFailure("read", pool.role) from None
            self.metrics.observe_stage("ttfb", time.perf_counter() - ctx.t0)
            ctx.release_raw()  # E+PD: the consumer encoded the raw items
            return Response(body=data, status=resp.status, headers={CONTENT_TYPE: ct, REQUEST_ID: ctx.rid})
        body = resp.iter_body()
        try:
            first = await anext(body, b"")
        except TransportError:
            pool.record_failure(ep, "read")
            raise RetryableFailure("read", pool.role) from None
        out = StreamResponse(
            status=resp.status, headers={CONTENT_TYPE: ct, CACHE_CONTROL: "no-cache", REQUEST_ID: ctx.rid}
        )
        await out.prepare(ctx.request)
        if first:
            await out.write(first)
        self.metrics.observe_stage("ttfb", time.perf_counter() - ctx.t0)
        ctx.release_raw()  # E+PD: the consumer encoded the raw items
        try:
            async for chunk in body:
                try:
                    await out.write(chunk)
                except ConnectionResetError:
                    # The client went away mid-stream: stop decode's work too.
                    resp.close()
                    return out
        except TransportError as exc:
            # Bytes already reached the client: nothing to retry; end the stream where it broke.
            pool.record_failure(ep, "stream")
            log.warning("[%s] decode stream from %s broke after the first byte: %r", ctx.rid, ep.url, exc)
        await out.write_eof()
        return out


def unusable_reply(pool: Pool, ep: Endpoint) -> RetryableFailure:
    """A reply that came whole but is not what the call expects (not JSON, say): a failure of `ep`,
    retryable elsewhere."""
    pool.record_failure(ep, "reply")
    return RetryableFailure("reply", pool.role)


async def _read_quietly(resp: BackendReply) -> bytes:
    try:
        return await resp.read()
    except TransportError:
        return b""
