"""Spill-over (router/encoding.py): when a request's new media items go raw to its consumer instead of
queuing on encoders, and what is counted and remembered when they do."""

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


class NoCalls:
    async def exchange(self, *args, **kwargs):
        raise AssertionError("a spilled request calls no encoder")


class LostEncoders:
    """Encoder calls that fail as a lost encoder's would: the items go raw after the retry round."""

    async def exchange(self, pool, ep, path, data, headers, timeout, n, *rest):
        pool.release(ep, n)
        raise RetryableFailure("connect", pool.role)


class RecordingPicker:
    def __init__(self) -> None:
        self.keys: list[str | None] = []

    def pick(self, endpoints, key=None, exclude=()):
        self.keys.append(key)
        return next((ep for ep in endpoints if ep not in exclude), None)


def stage(loads: list[int], generations: list[str | None] | None = None, calls=None, **config) -> EncoderStage:
    metrics = RouterMetrics(CollectorRegistry())
    pool = Pool("encoder", metrics)
    gens = generations or [None] * len(loads)
    pool.update([DiscoveredEndpoint(f"http://10.0.0.{i}:8000", generation=g) for i, g in enumerate(gens)])
    for ep, load in zip(pool.endpoints.values(), loads, strict=True):
        ep.inflight = load
    cfg = RouterConfig(encode_urls=["x"], decode_urls=["y"], **config)
    return EncoderStage(cfg, metrics, pool, RecordingPicker(), calls or NoCalls(), ReuseCache(60))  # type: ignore[arg-type]


def request(items: int = 2, consumer_load: int = 0, generation: str | None = None) -> RequestContext:
    parts = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{i}"}} for i in range(items)]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    consumer = Endpoint("http://10.0.1.1:8000", "decode", "pd-0", generation=generation)
    consumer.inflight = consumer_load
    media = [MediaItem(i, "image_url", part, f"uuid-{i}") for i, part in enumerate(parts)]
    return RequestContext(
        request=None,  # type: ignore[arg-type]
        route="/v1/chat/completions",
        rid="r",
        t0=0.0,
        body=body,
        raw=None,
        items=media,
        prepared=body,
        consumer=consumer,
        generation=generation,
    )


def counted(s: EncoderStage, name: str, **labels: str) -> float:
    return s.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    "loads, bound, consumer_load, limit, spills",
    [
        ([8, 8], 8, 0, 0, True),  # every encoder at the bound, no consumer bound
        ([9, 12], 8, 3, 4, True),  # past it, the consumer below its bound
        ([8, 7], 8, 0, 0, False),  # one encoder below the bound takes the items
        ([8, 8], 8, 4, 4, False),  # the consumer at its bound: queue on the encoders
        ([50, 50], 0, 0, 0, False),  # spill-over off
    ],
)
def test_a_request_spills_only_when_every_encoder_is_full_and_its_consumer_is_not(
    loads, bound, consumer_load, limit, spills
):
    s = stage(loads, spill_encoder_inflight=bound, spill_consumer_inflight=limit)
    assert s._spills(request(consumer_load=consumer_load)) is spills


def test_only_encoders_of_the_requests_generation_count():
    # The idle encoder is of another build: it cannot serve this request, so its encoders are all full.
    s = stage([8, 0], ["g1", "g2"], spill_encoder_inflight=8)
    assert s._spills(request(generation="g1"))
    assert not s._spills(request(generation="g2"))


def test_a_spilled_request_sends_all_its_new_items_raw_counts_them_and_remembers_nothing():
    s = stage([8, 9], spill_encoder_inflight=8)
    ctx = request(items=3)
    encoded = asyncio.run(s.encode(ctx))
    assert encoded == {}  # every item raw: none split off to an encoder
    assert s.picker.keys == []  # type: ignore[attr-defined]  # no encoder was picked: no home recorded
    assert len(s.reuse) == 0
    assert counted(s, "epd_router_spilled_items_total", reason="encoders_busy") == 3
    assert counted(s, "epd_router_spilled_requests_total", reason="encoders_busy") == 1
    assert counted(s, "epd_router_items_total", outcome="spilled") == 3
    assert counted(s, "epd_router_items_total", outcome="fallback") == 0
    assert [ep.inflight for ep in s.pool.endpoints.values()] == [8, 9]


def test_a_request_that_does_not_spill_goes_to_the_picker():
    s = stage([8, 7], calls=LostEncoders(), spill_encoder_inflight=8)
    asyncio.run(s.encode(request(items=1)))
    assert set(s.picker.keys) == {"uuid-0"}  # type: ignore[attr-defined]  # asked (again on the retry round)
    assert counted(s, "epd_router_spilled_requests_total", reason="encoders_busy") == 0


def test_the_flags_set_the_bounds_and_refuse_negative_ones():
    parser = build_parser()
    base = ["--decode-servers-urls", "http://d:8000"]
    cfg = config_from_args(
        parser.parse_args([*base, "--spill-encoder-inflight", "8", "--spill-consumer-inflight", "4"])
    )
    assert (cfg.spill_encoder_inflight, cfg.spill_consumer_inflight) == (8, 4)
    off = config_from_args(parser.parse_args(base))
    assert (off.spill_encoder_inflight, off.spill_consumer_inflight) == (0, 0)
    with pytest.raises(ValueError, match="--spill-encoder-inflight must be >= 0"):
        config_from_args(parser.parse_args([*base, "--spill-encoder-inflight", "-1"]))
    with pytest.raises(ValueError, match="--spill-consumer-inflight must be >= 0"):
        config_from_args(parser.parse_args([*base, "--spill-consumer-inflight", "-1"]))
