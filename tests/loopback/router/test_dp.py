"""Data-parallel consumers: the router pins every request to one DP rank of one consumer pod
(`X-data-parallel-rank`, vLLM 0.32's pinning header), balances the (pod, rank) pairs by their own
load, and for Mooncake hands the encoder the control address of exactly that rank.

The fake backends refuse (400) a request that names no engine, or whose Mooncake items were pushed to
another rank's address (tests/support/fake_vllm.py), so a wrong pin shows as a failed request."""

from __future__ import annotations

import asyncio

from epd_operator.router.backends import HealthChecker
from tests.support.router_stack import router_stack

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def chat(text: str = "hi", image: str | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": text}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": image}})
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4}


def ranks(fake) -> list[str]:
    return [r.headers.get("X-data-parallel-rank") for r in fake.received]


MOONCAKE_ADDRS = ["tcp://10.0.0.1:14579", "tcp://10.0.0.1:14581", "tcp://10.0.0.2:14579", "tcp://10.0.0.2:14581"]


async def test_concurrent_requests_spread_over_every_pod_and_rank():
    async with router_stack(encoders=1, decodes=2, decode_dp_size=4) as stack:
        for fake in stack.decodes:
            fake.dp_size = 4
            fake.knobs.delay = 0.3  # all 16 in flight together: the picker sees every earlier pick
        replies = await asyncio.gather(*(stack.post("/v1/chat/completions", chat(f"q{i}")) for i in range(16)))
        assert [r.status for r in replies] == [200] * 16
        # 2 pods x 4 ranks = 8 (pod, rank) pairs, least-loaded: two requests each
        assert [fake.by_rank for fake in stack.decodes] == [{0: 2, 1: 2, 2: 2, 3: 2}] * 2
        assert all(fake.rank_errors == 0 for fake in stack.decodes)


async def test_a_busy_rank_gets_no_new_work_while_others_are_idle():
    async with router_stack(encoders=1, decodes=1, decode_dp_size=2, pd_policy="least-loaded") as stack:
        (pd,) = stack.decodes
        pd.dp_size = 2
        gate = asyncio.Event()
        pd.knobs.stream_gate = gate
        stuck = asyncio.create_task(stack.post("/v1/chat/completions", {**chat("long"), "stream": True}))
        while not pd.received:
            await asyncio.sleep(0.01)
        busy = ranks(pd)[0]
        pd.knobs.stream_gate = None
        for i in range(3):  # one after the other: a blind counter would alternate ranks
            assert (await stack.post("/v1/chat/completions", chat(f"q{i}"))).status == 200
        assert ranks(pd)[1:] == [str(1 - int(busy))] * 3
        gate.set()
        assert (await stuck).status == 200


async def test_every_call_of_a_request_carries_its_ranks_in_e_p_d():
    async with router_stack(encoders=1, prefills=1, decodes=1, prefill_dp_size=2, decode_dp_size=3) as stack:
        stack.prefills[0].dp_size, stack.decodes[0].dp_size = 2, 3
        stack.prefills[0].knobs.delay = stack.decodes[0].knobs.delay = 0.3  # all six in flight at each stage
        replies = await asyncio.gather(*(stack.post("/v1/chat/completions", chat(f"q{i}", IMAGE)) for i in range(6)))
        assert [r.status for r in replies] == [200] * 6
        assert stack.prefills[0].by_rank == {0: 3, 1: 3}
        assert stack.decodes[0].by_rank == {0: 2, 1: 2, 2: 2}
        # Encoders are not data-parallel consumers: no pin goes to them.
        assert all(r.headers.get("X-data-parallel-rank") is None for r in stack.encoders[0].received)
        # D got P's KV handle each time
        assert all(r.body.get("kv_transfer_params", {}).get("remote_engine_id") for r in stack.decodes[0].received)


async def test_mooncake_items_are_pushed_to_the_pinned_ranks_address():
    pushes: dict[str, str] = {}
    async with router_stack(encoders=2, decodes=2, decode_dp_size=2, ec_consumer_zmq_addrs=MOONCAKE_ADDRS) as stack:
        for encoder in stack.encoders:
            encoder.pushes = pushes
        for i, pd in enumerate(stack.decodes):
            pd.dp_size, pd.pushes, pd.ec_zmq_by_rank = 2, pushes, MOONCAKE_ADDRS[2 * i : 2 * i + 2]
        replies = await asyncio.gather(
            *(stack.post("/v1/chat/completions", chat(f"q{i}", IMAGE + str(i))) for i in range(8))
        )
        assert [r.status for r in replies] == [200] * 8
        assert sum(pd.misrouted for pd in stack.decodes) == 0
        assert sorted(set(pushes.values())) == sorted(MOONCAKE_ADDRS)  # every rank was pushed to


async def test_the_fake_refuses_an_unpinned_request():
    """The check the tests above rely on: a DP consumer the router does not pin fails the request."""
    async with router_stack(encoders=1, decodes=1) as stack:  # the router believes DP=1
        stack.decodes[0].dp_size = 2
        reply = await stack.post("/v1/chat/completions", chat())
        assert reply.status == 400 and stack.decodes[0].rank_errors == 1


async def test_external_load_of_a_rank_steers_picks_away_from_it():
    async with router_stack(encoders=1, decodes=1, decode_dp_size=3) as stack:
        (pd,) = stack.decodes
        pd.dp_size = 3
        pd.knobs.running_by_rank = {0: 0, 1: 6, 2: 0}  # another router keeps engine 1 busy
        cfg = stack.router.cfg
        health = HealthChecker(
            stack.router.pools, stack.router.session, cfg.health_interval, cfg.health_timeout, scrape_load=True
        )
        await health.check_all()
        loads = {ep.rank: ep.load for ep in stack.router.decodes.endpoints.values()}
        assert loads == {0: 0, 1: 6, 2: 0}
        for i in range(4):
            assert (await stack.post("/v1/chat/completions", chat(f"q{i}"))).status == 200
        assert pd.by_rank == {0: 2, 2: 2}
        # Health is per backend: one failed probe counts against every rank of it.
        pd.knobs.health_status = 503
        await health.check_all()
        assert {ep.failures for ep in stack.router.decodes.endpoints.values()} == {1}
