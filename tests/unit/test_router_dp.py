"""Data-parallel consumers: the router pins every request to one DP rank of one consumer pod
(`X-data-parallel-rank`, vLLM 0.32's pinning header), balances the (pod, rank) pairs by their own
load, and for Mooncake hands the encoder the control address of exactly that rank.

The fake backends refuse (400) a request that names no engine, or whose Mooncake items were pushed to
another rank's address (tests/support/fake_vllm.py), so a wrong pin shows as a failed request.
"""

from __future__ import annotations

import asyncio

import pytest

from epd_operator.router.backends import DiscoveredEndpoint, HealthChecker, Pool, rank_zmq, scraped_queue_depths
from epd_operator.router.config import RouterConfig
from epd_operator.router.discovery import slice_endpoints
from epd_operator.router.main import build_parser, config_from_args
from epd_operator.router.metrics import RouterMetrics
from tests.support.router_stack import router_stack

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def chat(text: str = "hi", image: str | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": text}]
    if image:
        content.insert(0, {"type": "image_url", "image_url": {"url": image}})
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4}


def ranks(fake) -> list[str]:
    return [r.headers.get("X-data-parallel-rank") for r in fake.received]


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


MOONCAKE_ADDRS = ["tcp://10.0.0.1:14579", "tcp://10.0.0.1:14581", "tcp://10.0.0.2:14579", "tcp://10.0.0.2:14581"]


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


def test_ranked_mooncake_addresses_follow_ec_port_plus_rank_times_tp():
    pool = Pool("decode", RouterMetrics(), dp_size=3, zmq_rank_stride=2)
    pool.update([DiscoveredEndpoint("http://10.0.0.7:8000", pod="pd-0", ec_zmq="tcp://10.0.0.7:14579")])
    assert [(ep.key, ep.rank, ep.ec_zmq) for ep in pool.endpoints.values()] == [
        ("10.0.0.7:8000#dp0", 0, "tcp://10.0.0.7:14579"),
        ("10.0.0.7:8000#dp1", 1, "tcp://10.0.0.7:14581"),
        ("10.0.0.7:8000#dp2", 2, "tcp://10.0.0.7:14583"),
    ]
    assert [ep.rank_header for ep in pool.endpoints.values()] == [
        b"X-data-parallel-rank: 0\r\n",
        b"X-data-parallel-rank: 1\r\n",
        b"X-data-parallel-rank: 2\r\n",
    ]
    assert rank_zmq("tcp://[fd00::1]:20000", 5, 4) == "tcp://[fd00::1]:20020"
    assert rank_zmq(None, 1, 1) is None


def test_a_pool_without_dp_keeps_one_unpinned_endpoint_per_backend():
    pool = Pool("decode", RouterMetrics())
    pool.update([DiscoveredEndpoint("http://10.0.0.7:8000", ec_zmq="tcp://10.0.0.7:14579")])
    (ep,) = pool.endpoints.values()
    assert (ep.key, ep.rank, ep.rank_header, ep.ec_zmq) == ("10.0.0.7:8000", None, b"", "tcp://10.0.0.7:14579")
    with pytest.raises(ValueError):
        Pool("decode", RouterMetrics(), dp_size=0)


def test_queue_depth_is_read_per_engine():
    text = (
        b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        b'vllm:num_requests_running{model_name="m",engine="1"} 7.0\n'
        b'vllm:num_requests_waiting_by_reason{engine="1",model_name="m",reason="capacity"} 9.0\n'
        b"vllm:num_requests_running 4.0\n"
    )
    assert scraped_queue_depths(text) == {"0": 3, "1": 7, None: 4}
    assert scraped_queue_depths(b"# nothing\n") == {}


async def test_external_load_of_a_rank_steers_picks_away_from_it():
    async with router_stack(encoders=1, decodes=1, decode_dp_size=3) as stack:
        (pd,) = stack.decodes
        pd.dp_size = 3
        pd.knobs.running_by_rank = {0: 0, 1: 6, 2: 0}  # another router keeps engine 1 busy
        health = HealthChecker(stack.router.pools, stack.router.session, scrape_load=True)
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


def test_command_line_dp_sizes_and_vllms_consumer_flag():
    cfg = config_from_args(
        build_parser().parse_args(
            [
                "--decode-servers-urls",
                "http://a:8000,http://b:8000",
                "--ec-consumer-dp-size",
                "2",
                "--ec-consumer-zmq-addrs",
                ",".join(MOONCAKE_ADDRS),
                "--ec-consumer-tp-size",
                "2",
            ]
        )
    )
    assert (cfg.decode_dp_size, cfg.prefill_dp_size, cfg.ec_consumer_tp_size) == (2, 1, 2)
    cfg = config_from_args(
        build_parser().parse_args(
            [
                "--decode-servers-urls",
                "http://d:8000",
                "--prefill-servers-urls",
                "http://p:8000",
                "--ec-consumer-dp-size",
                "4",
                "--decode-dp-size",
                "3",
            ]
        )
    )
    assert (cfg.prefill_dp_size, cfg.decode_dp_size) == (4, 3)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"decode_dp_size": 0}, "--decode-dp-size must be >= 1"),
        ({"ec_consumer_tp_size": 0}, "--ec-consumer-tp-size must be >= 1"),
        ({"decode_dp_size": 2, "ec_consumer_zmq_addrs": ["tcp://a:1"]}, "one address per EC consumer"),
    ],
)
def test_bad_dp_settings_are_refused(changes, problem):
    with pytest.raises(ValueError, match=problem):
        RouterConfig(decode_urls=["http://a:8000"], **changes).validate()


def test_kubernetes_discovery_reads_each_ranks_control_port_from_the_slice():
    slice_ = {
        "ports": [{"name": "http", "port": 8000}, {"name": "ec-dp1", "port": 20007}, {"name": "ec-dp0", "port": 20003}],
        "endpoints": [{"addresses": ["10.0.0.9"], "targetRef": {"kind": "Pod", "name": "pd-1"}}],
    }
    (found,) = slice_endpoints(slice_, "http", 8000, ec_port=14579)
    assert (found.url, found.ec_zmq, found.ec_zmq_ranks) == (
        "http://10.0.0.9:8000",
        "tcp://10.0.0.9:20003",
        ("tcp://10.0.0.9:20003", "tcp://10.0.0.9:20007"),
    )
    pool = Pool("decode", RouterMetrics(), dp_size=3, zmq_rank_stride=2)
    pool.update([found])
    # ranks the Service names come from it; a rank it does not name falls back to ec_port + d * TP
    assert [ep.ec_zmq for ep in pool.endpoints.values()] == [
        "tcp://10.0.0.9:20003",
        "tcp://10.0.0.9:20007",
        "tcp://10.0.0.9:20007",
    ]


def test_a_slice_with_a_gap_in_its_rank_ports_is_not_trusted():
    slice_ = {
        "ports": [{"name": "http", "port": 8000}, {"name": "ec-dp1", "port": 20007}],
        "endpoints": [{"addresses": ["10.0.0.9"]}],
    }
    (found,) = slice_endpoints(slice_, "http", 8000, ec_port=14579)
    assert (found.ec_zmq, found.ec_zmq_ranks) == ("tcp://10.0.0.9:14579", ())
    (plain,) = slice_endpoints(slice_, "http", 8000, ec_port=None)  # not Mooncake: no addresses at all
    assert (plain.ec_zmq, plain.ec_zmq_ranks) == (None, ())
