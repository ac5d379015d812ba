"""The encoder demand the router exports (`epd_router_encoder_demand`), read from its /metrics while requests
are held at scripted vLLM backends: items on encoders, spilled, or raw at zero count until the consumer
answers; audio-in-video and items whose encoder failed do not."""

from __future__ import annotations

import asyncio

from tests.support.prom import sample_values
from tests.support.router_stack import router_stack, until

CHAT = "/v1/chat/completions"
DEPLOYMENT = "qwen-vl"


def image(name: str) -> dict:
    return {"type": "image_url", "image_url": {"url": f"https://img/{name}.png"}}


def video(name: str) -> dict:
    return {"type": "video_url", "video_url": {"url": f"https://vid/{name}.mp4"}}


def chat(*parts, **extra):
    return {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, *parts]}],
        **extra,
    }


async def demand(s) -> float:
    (value,) = sample_values((await s.get("/metrics")).body, "epd_router_encoder_demand", epd_deployment=DEPLOYMENT)
    return value


async def test_spilled_items_count_beside_the_items_on_encoders():
    """The encoders read the spill bound each, as the per-encoder in-flight metric says; the demand also
    counts what spilled, so an autoscaler sees the whole step."""
    async with router_stack(
        encoders=2, encoder_policy="least-loaded", spill_encoder_inflight=1, deployment=DEPLOYMENT, demand_window=0
    ) as s:
        gate = asyncio.Event()
        s.decodes[0].knobs.reply_gate = gate
        for fake in s.encoders:
            fake.knobs.delay = 3.0
        busy = [asyncio.create_task(s.post(CHAT, chat(image(name)))) for name in ("a", "b")]
        await until(lambda: all(ep.inflight >= 1 for ep in s.router.encoders.endpoints.values()))
        spilled = asyncio.create_task(s.post(CHAT, chat(image("c"), image("d"), image("e"))))
        await until(lambda: any("https://img/c.png" in str(b) for b in s.decodes[0].bodies()))
        assert [ep.inflight for ep in s.router.encoders.endpoints.values()] == [1, 1]
        assert await demand(s) == 2 + 3
        gate.set()
        assert all(r.status == 200 for r in await asyncio.gather(*busy, spilled))
        assert await demand(s) == 0


async def test_raw_items_at_zero_count_until_the_consumers_first_byte_and_audio_in_video_does_not():
    async with router_stack(encoders=0, deployment=DEPLOYMENT, demand_window=0) as s:
        pd = s.decodes[0].knobs
        pd.delay = 1.0
        pd.stream_gate = asyncio.Event()
        body = chat(image("a"), video("v"), stream=True, mm_processor_kwargs={"use_audio_in_video": True})
        request = asyncio.create_task(s.post(CHAT, body))
        await until(lambda: len(s.decodes[0].bodies()) == 1)
        assert await demand(s) == 1  # the image; the video's consumer encodes it whatever the encoders do
        # after the consumer's first chunk (its delay), with the rest of the stream held: released
        for _ in range(200):
            if await demand(s) == 0:
                break
            await asyncio.sleep(0.025)
        assert await demand(s) == 0
        assert not request.done()
        assert s.router.decodes.available[0].inflight == 1
        pd.stream_gate.set()
        assert (await request).status == 200


async def test_items_whose_encoder_failed_are_not_demand():
    async with router_stack(encoders=1, deployment=DEPLOYMENT, demand_window=0) as s:
        s.encoders[0].knobs.fail_always = True
        gate = asyncio.Event()
        s.decodes[0].knobs.reply_gate = gate
        request = asyncio.create_task(s.post(CHAT, chat(image("a"), image("b"))))
        await until(lambda: len(s.decodes[0].bodies()) == 1)
        assert await demand(s) == 0  # raw after a failure: the failure counters say so, not the demand
        gate.set()
        assert (await request).status == 200
        fallback = sample_values((await s.get("/metrics")).body, "epd_router_items_total", outcome="fallback")
        assert fallback == [2]


async def test_the_gauge_holds_a_bursts_peak_for_the_window_then_falls():
    """The router's own refresh task ages the peak out (router/demand.py); the count went to 0 long before."""
    async with router_stack(encoders=1, deployment=DEPLOYMENT, demand_window=1) as s:
        assert (await s.post(CHAT, chat(image("a"), image("b"), image("c")))).status == 200
        assert s.router.pipeline.encoding.demand.now == 0
        assert await demand(s) == 3
        for _ in range(200):
            if await demand(s) == 0:
                break
            await asyncio.sleep(0.025)
        assert await demand(s) == 0
