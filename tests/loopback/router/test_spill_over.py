"""Spill-over against scripted vLLM backends: while every encoder is busy, a request's new media go raw
to its consumer; once an encoder is free again, media go to encoders as before."""

import asyncio
from typing import Any

import pytest

from tests.support.prom import sample_values
from tests.support.router_stack import router_stack, until

CHAT = "/v1/chat/completions"


def image(name: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"https://img/{name}.png"}}


def chat(*parts):
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, *parts]}]}


def encoded_urls(fakes) -> list[str]:
    return [
        part["image_url"]["url"] for fake in fakes for body in fake.bodies() for part in body["messages"][0]["content"]
    ]


@pytest.mark.parametrize("rewrite", ["metadata", "pinned"])
async def test_while_every_encoder_is_busy_a_requests_new_media_go_raw_to_the_consumer(rewrite):
    async with router_stack(
        encoders=2,
        encoder_policy="least-loaded",  # a and b on one encoder each
        spill_encoder_inflight=1,
        reuse_ttl=60,
        immutable_media_urls=True,
        rewrite=rewrite,
    ) as s:
        for fake in s.encoders:
            fake.knobs.delay = 0.5
        busy = [asyncio.create_task(s.post(CHAT, chat(image(name)))) for name in ("a", "b")]
        await until(lambda: all(ep.inflight >= 1 for ep in s.router.encoders.endpoints.values()))
        spilled = await s.post(CHAT, chat(image("c"), image("d")))
        assert spilled.status == 200
        assert all(r.status == 200 for r in await asyncio.gather(*busy))
        # Neither of c and d reached an encoder; the consumer got both as raw media.
        assert sorted(encoded_urls(s.encoders)) == ["https://img/a.png", "https://img/b.png"]
        [pd_body] = [b for b in s.decodes[0].bodies() if "https://img/c.png" in str(b)]
        parts = pd_body["messages"][0]["content"][1:]
        assert [p["type"] for p in parts] == ["image_url", "image_url"]
        assert not pd_body.get("ec_transfer_params")
        metrics = (await s.get("/metrics")).body
        assert sample_values(metrics, "epd_router_spilled_items_total", reason="encoders_busy") == [2]
        assert sample_values(metrics, "epd_router_spilled_requests_total", reason="encoders_busy") == [1]
        assert sample_values(metrics, "epd_router_items_total", outcome="spilled") == [2]
        # With the encoders free again, c goes to an encoder: the spilled item was never remembered as
        # encoded (reuse would have skipped the encoder), nor as held by one.
        for fake in s.encoders:
            fake.knobs.delay = 0
        assert (await s.post(CHAT, chat(image("c")))).status == 200
        assert encoded_urls(s.encoders).count("https://img/c.png") == 1
        metrics = (await s.get("/metrics")).body
        assert sample_values(metrics, "epd_router_items_total", outcome="reused") == []
        assert sample_values(metrics, "epd_router_spilled_requests_total", reason="encoders_busy") == [1]


async def test_a_busy_consumer_takes_no_spilled_media_and_spill_over_off_queues_on_the_encoders():
    configs: list[dict[str, Any]] = [{"spill_encoder_inflight": 1, "spill_consumer_inflight": 1}, {}]
    for config in configs:
        async with router_stack(encoders=1, **config) as s:
            s.encoders[0].knobs.delay = 0.3
            s.decodes[0].knobs.delay = 0.3
            text = asyncio.create_task(s.post(CHAT, chat()))  # holds the consumer: 1 request in flight
            await until(lambda: s.router.decodes.available[0].inflight == 1)
            first = asyncio.create_task(s.post(CHAT, chat(image("a"))))
            await until(lambda: s.router.encoders.available[0].inflight == 1)
            second = asyncio.create_task(s.post(CHAT, chat(image("b"))))
            assert (await text).status == 200
            assert all(r.status == 200 for r in await asyncio.gather(first, second))
            assert sorted(encoded_urls(s.encoders)) == ["https://img/a.png", "https://img/b.png"]
            metrics = (await s.get("/metrics")).body
            assert sample_values(metrics, "epd_router_spilled_requests_total", reason="encoders_busy") == []
