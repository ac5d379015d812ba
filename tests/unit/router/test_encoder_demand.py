"""The encoder tier's demand (router/encoding.py, `epd_router_encoder_demand`): the media items the router
wants encoded and has not finished, whichever way they went (to an encoder, spilled, raw at zero), and
nothing that is not encoder work. The one quantity both autoscaling engines read."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from epd_operator.router.backends import DiscoveredEndpoint, Endpoint, Pool
from epd_operator.router.config import RouterConfig
from epd_operator.router.context import RequestContext
from epd_operator.router.encoding import EncoderStage
from epd_operator.router.failures import RetryableFailure
from epd_operator.router.flags import build_parser, config_from_args
from epd_operator.router.metrics import RouterMetrics
from epd_operator.router.protocol import MediaItem
from epd_operator.router.reuse import ReuseCache

DEPLOYMENT = "qwen-vl"


class FirstReady:
    def pick(self, endpoints, key=None, exclude=()):
        return next((ep for ep in endpoints if ep not in exclude), None)


class HeldCalls:
    """Encoder calls that wait until the test lets them go, then fail (as a lost encoder would)."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.calls = 0

    async def exchange(self, pool, ep, path, data, headers, timeout, n, *rest):
        self.calls += 1
        await self.go.wait()
        pool.release(ep, n)
        raise RetryableFailure("connect", pool.role)


async def reaches_an_encoder(task: asyncio.Task, calls: HeldCalls) -> None:
    """Until the stage called an encoder (failing, not hanging, where it never does)."""
    async with asyncio.timeout(5):
        while calls.calls == 0:
            assert not task.done(), f"the stage ended without an encoder call: {task}"
            await asyncio.sleep(0)


def stage(encoders: int, loads: int = 0, **config) -> tuple[EncoderStage, HeldCalls]:
    metrics = RouterMetrics(CollectorRegistry())
    pool = Pool("encoder", metrics)
    pool.update([DiscoveredEndpoint(f"http://10.0.0.{i}:8000") for i in range(encoders)])
    for ep in pool.endpoints.values():
        ep.inflight = loads
    calls = HeldCalls()
    config.setdefault("demand_window", 0)  # the count itself; demand.py's peak: tests/unit/router/test_demand_peak.py
    cfg = RouterConfig(encode_urls=["x"], decode_urls=["y"], deployment=DEPLOYMENT, **config)
    return EncoderStage(cfg, metrics, pool, FirstReady(), calls, ReuseCache(60)), calls  # type: ignore[arg-type]


def request(kinds: tuple[str, ...] = ("image_url", "image_url"), **body_extra) -> RequestContext:
    parts = [{"type": kind, kind: {"url": f"data:x;base64,{i}"}} for i, kind in enumerate(kinds)]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}], **body_extra}
    media = [MediaItem(i, kind, part, f"uuid-{i}") for i, (kind, part) in enumerate(zip(kinds, parts, strict=True))]
    return RequestContext(
        request=None,  # type: ignore[arg-type]
        route="/v1/chat/completions",
        rid="r",
        t0=0.0,
        body=body,
        raw=None,
        items=media,
        prepared=body,
        consumer=Endpoint("http://10.0.1.1:8000", "decode", "pd-0"),
    )


def demand(s: EncoderStage) -> float:
    value = s.metrics.registry.get_sample_value("epd_router_encoder_demand", {"epd_deployment": DEPLOYMENT})
    assert value is not None, "the demand gauge is not exported"
    return value


def test_the_demand_is_exported_at_zero_before_any_request():
    s, _ = stage(encoders=1)
    assert demand(s) == 0


def test_spilled_items_are_demand_until_the_consumer_answers():
    s, calls = stage(encoders=2, loads=8, spill_encoder_inflight=8)
    ctx = request(("image_url", "image_url", "image_url"))
    assert asyncio.run(s.encode(ctx)) == {}
    assert calls.calls == 0  # spilled: no encoder called
    # the encoders read 8 each, at the spill bound; the tier's demand is theirs plus these 3
    assert demand(s) == 3
    ctx.release_raw()
    assert demand(s) == 0
    ctx.release_raw()  # the pipeline may release twice (first byte, then the request's end)
    assert demand(s) == 0


def test_items_sent_raw_while_the_tier_is_at_zero_are_demand():
    s, _ = stage(encoders=0)
    ctx = request(("image_url", "video_url"))
    asyncio.run(s.encode(ctx))
    assert demand(s) == 2  # what wakes the tier, in the unit that then sizes it
    ctx.release_raw()
    ctx.release_raw()  # the request ended after its consumer answered: nothing more to give back
    assert (demand(s), ctx.raw_demand) == (0, 0)


def test_a_video_whose_audio_rides_in_it_is_not_encoder_work():
    s, _ = stage(encoders=0)
    ctx = request(("image_url", "video_url"), mm_processor_kwargs={"use_audio_in_video": True})
    asyncio.run(s.encode(ctx))
    assert demand(s) == 1  # the image; the video goes to its consumer whatever the encoders do
    ctx.release_raw()
    assert demand(s) == 0


def test_items_on_an_encoder_are_demand_while_there_and_a_failure_is_not():
    s, calls = stage(encoders=2)
    ctx = request()

    async def scenario() -> tuple[float, float]:
        task = asyncio.create_task(s.encode(ctx))
        await reaches_an_encoder(task, calls)
        during = demand(s)
        calls.go.set()  # both rounds fail: the items go raw, as a fallback
        await asyncio.wait_for(task, 5)
        return during, demand(s)

    during, after = asyncio.run(scenario())
    assert during == 2
    assert after == 0  # items whose encoder failed are not load that keeps the tier up
    assert ctx.raw_demand == 0
    assert s.metrics.registry.get_sample_value("epd_router_items_total", {"outcome": "fallback"}) == 2


def test_a_cancelled_request_leaves_no_demand_behind():
    s, calls = stage(encoders=1)

    async def scenario() -> None:
        task = asyncio.create_task(s.encode(request()))
        await reaches_an_encoder(task, calls)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert demand(s) == 0


def test_the_flag_names_the_deployment_on_the_gauge():
    parser = build_parser()
    cfg = config_from_args(parser.parse_args(["--decode-servers-urls", "http://d:8000", "--deployment", "vl"]))
    assert cfg.deployment == "vl"
