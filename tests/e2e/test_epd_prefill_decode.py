"""E/P/D on real vLLM (CPU): the NIXL example, rendered by `render()` and run locally.

Encoder, prefill (EC consumer + NixlConnector kv_producer), decode (NixlConnector kv_consumer)
and `epd-router`, each with its rendered command line: the prompt's KV moves from prefill to
decode over NIXL (UCX on loopback). The NIXL tiers run with the local runner's two CPU
adaptations (`dev/builds/cpu_vllm/sitecustomize.py`: no pinning, a 1 ms progress-thread delay), without
which instances sharing 2 cores starve each other. What happened is read from vLLM's own metrics
and prefill's log (`dev.local.kv_transfer`). Started once for the module.
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path

import pytest

from dev.local import kv_transfer
from dev.local.client import chat, chat_body, image_part, text_part
from dev.local.cpu_sizing import fit_to_cpu
from dev.local.runner import load_spec, run_local
from tests.support.vllm_pipeline import MAX_TOKENS, ask, requests_served

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the first run also builds the vLLM venv

EXAMPLE = Path(__file__).parents[2] / "examples" / "epd-nixl-autoscaled.yaml"


@pytest.fixture(scope="module")
def epd(vllm_ready, tmp_path_factory):
    spec, _ = fit_to_cpu(load_spec(EXAMPLE))
    with run_local(spec, tmp_path_factory.mktemp("e-p-d")) as running:
        yield running


def test_runs_as_three_tiers_with_the_rendered_nixl_connector(epd):
    assert epd.plan.topology == "E/P/D"
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        process = epd.plan.one(role)
        argv = process.argv
        config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
        assert (config["kv_connector"], config["kv_role"]) == ("NixlConnector", kv_role)
        log = epd.log_path(role).read_text(errors="replace")
        assert "NIXL KV-transfer core reservation off" in log
        assert "NIXL progress-thread delay 1000 us in nixl_cu13._api" in log


def test_image_request_passes_encoder_prefill_and_decode_over_nixl(epd):
    before = {role: requests_served(epd, role) for role in ("encoder", "prefill", "decode")}
    kv = kv_transfer.read(epd)

    reply = ask(epd, [text_part("Describe the image."), image_part(1001)])

    assert reply.completion_tokens == MAX_TOKENS
    assert {role: requests_served(epd, role) - n for role, n in before.items()} == {
        "encoder": 1,
        "prefill": 1,
        "decode": 1,
    }
    moved = kv_transfer.read(epd).since(kv)
    assert not moved.problems(), moved


def test_text_only_request_skips_the_encoder_and_still_transfers_kv(epd):
    encoder = requests_served(epd, "encoder")
    kv = kv_transfer.read(epd)

    reply = ask(epd, "Tell me about prefill and decode.")

    assert reply.completion_tokens == MAX_TOKENS
    assert requests_served(epd, "encoder") == encoder
    moved = kv_transfer.read(epd).since(kv)
    assert not moved.problems(), moved


@pytest.mark.parametrize(
    "content",
    [
        "Greedy answers do not depend on where the KV was computed.",
        [text_part("And with an image?"), image_part(1002)],
    ],
    ids=["text", "image"],
)
def test_the_p_d_path_answers_as_a_single_instance(epd, content):
    """Greedy tokens through E -> P -> (NIXL) -> D equal one vLLM instance computing it all: the
    prefill instance itself, asked directly without KV-transfer parameters, as a plain server."""
    body = chat_body(epd.plan.served_model, content, max_tokens=16)
    kv = kv_transfer.read(epd)

    through_p_d = ask(epd, body["messages"][0]["content"], max_tokens=16)
    alone = chat(epd.url("prefill"), body)

    assert alone.ok, alone
    assert through_p_d.token_ids == alone.token_ids
    moved = kv_transfer.read(epd).since(kv)
    assert not moved.problems(), moved


def test_a_burst_of_concurrent_requests_leaves_no_expired_lease(epd):
    """The starvation NIXL on a busy CPU shows first: leases expiring under concurrent load."""
    kv = kv_transfer.read(epd)
    bodies = [chat_body(epd.plan.served_model, f"request {i} of a burst", 8) for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda body: chat(epd.router_url, body), bodies))
    assert all(reply.ok for reply in replies), [str(r) for r in replies if not r.ok]
    moved = kv_transfer.read(epd).since(kv)
    assert not moved.problems(), moved
    assert moved.transfers >= len(bodies)
