"""Compatibility generations in the router: during a rollout that changes the image or a connector,
old and new pods run side by side, and a request must stay within one generation. The fake backends
stamp their transfer parameters with their generation and refuse (400, counted) another's, as vLLMs of
different builds would fail each other's."""

from __future__ import annotations

from epd_operator.router.backends import DiscoveredEndpoint
from tests.support.router_stack import Stack, router_stack

CHAT = "/v1/chat/completions"


def chat(n: int) -> dict:
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{n:08d}"}}
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}]}


def assign(stack: Stack, **generations: str | None) -> None:
    """Give each fake (by name) a generation, and tell the router's pools, as discovery would."""
    for fake in stack.all_backends():
        fake.generation = generations.get(fake.name)
    pools = {"encoder": (stack.router.encoders, stack.encoders), "decode": (stack.router.decodes, stack.decodes)}
    if stack.router.prefills is not None:
        pools["prefill"] = (stack.router.prefills, stack.prefills)
    for pool, fakes in pools.values():
        pool.update([DiscoveredEndpoint(f.url, True, f.name, None, f.generation) for f in fakes])


def series(stack: Stack, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `name` in the router's registry, by its labels."""
    return {
        tuple(sample.labels.items()): sample.value
        for family in stack.router.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    }


def generation_calls(stack: Stack) -> dict[str, int]:
    return {fake.name: len(fake.received) for fake in stack.all_backends()}


async def test_e_pd_requests_stay_within_the_consumers_generation():
    async with router_stack(encoders=2, decodes=2) as s:
        assign(s, e0="old", d0="old", e1="new", d1="new")
        replies = [await s.post(CHAT, chat(n)) for n in range(24)]
        assert [r.status for r in replies] == [200] * 24
        assert sum(f.foreign_refused for f in s.all_backends()) == 0
        calls = generation_calls(s)
        # both generations serve (the consumer picker balances over both) and each encoder only
        # worked for the consumer of its own generation
        assert calls["d0"] > 0 and calls["d1"] > 0
        assert calls["e0"] == calls["d0"] and calls["e1"] == calls["d1"]
        for decode in s.decodes:
            for body in decode.bodies():
                [embeds] = [p for p in body["messages"][0]["content"] if p["type"] == "image_embeds"]
                assert embeds["image_embeds"]["generation"] == [decode.generation]


async def test_a_generation_without_encoders_sends_its_media_raw_instead_of_to_another_generation():
    async with router_stack(encoders=1, decodes=2) as s:
        assign(s, e0="old", d0="old", d1="new")
        replies = [await s.post(CHAT, chat(n)) for n in range(16)]
        assert [r.status for r in replies] == [200] * 16
        assert sum(f.foreign_refused for f in s.all_backends()) == 0
        new_bodies = s.decodes[1].bodies()
        assert new_bodies, "the new generation's consumer got no work"
        for body in new_bodies:
            assert [p["type"] for p in body["messages"][0]["content"]] == ["text", "image_url"]
        assert len(s.encoders[0].received) == len(s.decodes[0].received)
        metrics = series(s, "epd_router_encoder_fallback_requests_total")
        assert metrics == {(("reason", "no_encoder_in_generation"),): len(new_bodies)}


async def test_e_p_d_starts_only_on_prefills_whose_generation_has_a_decode():
    async with router_stack(encoders=2, prefills=2, decodes=1) as s:
        # mid-rollout: the new prefill is up, the new decode is not yet
        assign(s, e0="old", e1="new", p0="old", p1="new", d0="old")
        replies = [await s.post(CHAT, chat(n)) for n in range(12)]
        assert [r.status for r in replies] == [200] * 12
        assert sum(f.foreign_refused for f in s.all_backends()) == 0
        calls = generation_calls(s)
        assert (calls["p1"], calls["e1"]) == (0, 0)
        assert calls["p0"] == calls["d0"] == calls["e0"] == 12
        for body in s.decodes[0].bodies():
            assert body["kv_transfer_params"]["generation"] == "old"


async def test_no_finishing_generation_is_a_503_not_a_mixed_request():
    async with router_stack(encoders=1, prefills=1, decodes=1) as s:
        assign(s, e0="new", p0="new", d0="old")
        r = await s.post(CHAT, chat(1))
        assert r.status == 503
        assert "no prefill endpoint available" in r.json()["error"]["message"]
        assert generation_calls(s) == {"e0": 0, "p0": 0, "d0": 0}


async def test_router_reports_available_backends_per_generation():
    async with router_stack(encoders=2, decodes=1) as s:
        assign(s, e0="old", e1="new", d0="old")
        gauge = series(s, "epd_router_generation_backends")
        assert gauge == {
            (("role", "encoder"), ("generation", "old")): 1.0,
            (("role", "encoder"), ("generation", "new")): 1.0,
            (("role", "decode"), ("generation", "old")): 1.0,
        }
        # the old encoder leaves: its series goes with it
        s.router.encoders.update([DiscoveredEndpoint(s.encoders[1].url, True, "e1", None, "new")])
        gauge = series(s, "epd_router_generation_backends")
        assert (("role", "encoder"), ("generation", "old")) not in gauge


async def test_a_failed_call_is_retried_on_another_instance_of_the_same_generation():
    async with router_stack(encoders=0, decodes=3) as s:
        assign(s, d0="new", d1="new", d2="old")
        s.decodes[0].knobs.fail_always = True
        replies = [await s.post(CHAT, chat(n)) for n in range(4)]
        assert [r.status for r in replies] == [200] * 4
        calls = generation_calls(s)
        assert calls["d0"] > 0, "no request started on the failing instance"
        # every request that failed on d0 was answered by a retry within its generation
        assert series(s, "epd_router_retries_total") == {(("stage", "decode"), ("reason", "status")): calls["d0"]}
        assert calls["d1"] >= calls["d0"] and sum(calls.values()) == 4 + calls["d0"]
        assert sum(f.foreign_refused for f in s.all_backends()) == 0
