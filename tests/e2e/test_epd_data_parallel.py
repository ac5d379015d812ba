"""A data-parallel consumer on real vLLM (CPU): the shared-storage example with `decode.dataParallelSize: 2`,
rendered by `render()` and run locally. The PD instance runs two engines behind its API server (vLLM's
own `--data-parallel-size 2`, as rendered); the router, started with the rendered `--decode-dp-size 2`,
pins every request to one engine with `X-data-parallel-rank`. vLLM counts finished requests per engine
(`engine` label), so its own metrics say which engine each request reached.
"""

from __future__ import annotations

import concurrent.futures
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dev.local.client import chat, chat_body, image_part, metric_sum, text_part
from dev.local.cpu_sizing import fit_to_cpu
from dev.local.runner import load_spec, run_local
from tests.support.vllm_pipeline import ask

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "epd-shared-storage.yaml"


@pytest.fixture(scope="module")
def epd(vllm_ready, tmp_path_factory):
    spec, _ = fit_to_cpu(load_spec(EXAMPLE))
    spec["spec"]["decode"]["dataParallelSize"] = 2
    with run_local(spec, tmp_path_factory.mktemp("e-pd-dp")) as running:
        yield running


def served_by_engine(epd) -> dict[str, float]:
    return {rank: metric_sum(epd.url("decode"), "vllm:request_success_total", engine=rank) for rank in ("0", "1")}


def test_the_rendered_tiers_run_two_engines_and_the_router_knows(epd):
    argv = epd.plan.one("decode").argv
    assert argv[argv.index("--data-parallel-size") + 1] == "2"
    router = epd.plan.one("router").argv
    assert router[router.index("--decode-dp-size") + 1] == "2"


def test_requests_are_pinned_to_engines_and_spread_over_both(epd):
    before = served_by_engine(epd)
    for i in range(4):  # one at a time: equally idle engines take turns
        ask(epd, [text_part(f"hello {i}")])
    after = served_by_engine(epd)
    assert {rank: after[rank] - before[rank] for rank in after} == {"0": 2.0, "1": 2.0}


def test_concurrent_requests_with_images_all_succeed_on_both_engines(epd):
    before = served_by_engine(epd)
    bodies = [chat_body(epd.plan.served_model, [image_part(100 + i), text_part("what is it?")], 4) for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda body: chat(epd.router_url, body), bodies))
    assert all(reply.ok for reply in replies), replies
    after = served_by_engine(epd)
    assert sum(after.values()) - sum(before.values()) == 4
    assert all(after[rank] > before[rank] for rank in after), (before, after)


def test_vllm_refuses_a_rank_it_does_not_have(epd):
    """The header the router sends is the one vLLM acts on: a rank out of range is refused."""
    body = json.dumps(chat_body(epd.plan.served_model, [text_part("hi")], 2)).encode()
    request = urllib.request.Request(
        f"{epd.url('decode')}/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "X-data-parallel-rank": "2"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    assert "data_parallel_rank 2 is out of range" in refused.value.read().decode()
