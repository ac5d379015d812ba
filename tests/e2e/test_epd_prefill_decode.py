"""E/P/D on real vLLM (CPU): the NIXL example, rendered by `render()` and run locally.

Encoder, prefill (EC consumer + KV producer), decode (KV consumer) and `epd-router`. NIXL on
CPU is erratic (transfers from 3 ms to 42 s), so the local runner swaps the KV connector for
vLLM's ExampleConnector over a shared directory (a recorded deviation); everything else is the
rendered command line. Started once for the module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.client import image_part, text_part
from dev.cpu_sizing import fit_to_cpu
from dev.runner import load_spec, run_local
from tests.support.vllm_pipeline import MAX_TOKENS, ask, prompt_tokens, requests_served

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]  # the first run also builds the vLLM venv

EXAMPLE = Path(__file__).parents[2] / "examples" / "epd-nixl-autoscaled.yaml"


@pytest.fixture(scope="module")
def epd(vllm_ready, tmp_path_factory):
    spec, _ = fit_to_cpu(load_spec(EXAMPLE))
    with run_local(spec, tmp_path_factory.mktemp("e-p-d")) as running:
        yield running


def test_runs_as_three_tiers_with_the_local_kv_connector(epd):
    assert epd.plan.topology == "E/P/D"
    for role in ("prefill", "decode"):
        assert any("ExampleConnector" in note for note in epd.plan.one(role).deviations)


def test_image_request_passes_encoder_prefill_and_decode(epd):
    before = {role: requests_served(epd, role) for role in ("encoder", "prefill", "decode")}
    received = prompt_tokens(epd, "decode", "external_kv_transfer")

    reply = ask(epd, [text_part("Describe the image."), image_part(1001)])

    assert reply.completion_tokens == MAX_TOKENS
    assert {role: requests_served(epd, role) - n for role, n in before.items()} == {
        "encoder": 1,
        "prefill": 1,
        "decode": 1,
    }
    assert prompt_tokens(epd, "decode", "external_kv_transfer") > received, "decode took the prompt's KV from prefill"


def test_text_only_request_skips_the_encoder_and_still_transfers_kv(epd):
    encoder = requests_served(epd, "encoder")
    received = prompt_tokens(epd, "decode", "external_kv_transfer")

    reply = ask(epd, "Tell me about prefill and decode.")

    assert reply.completion_tokens == MAX_TOKENS
    assert requests_served(epd, "encoder") == encoder
    assert prompt_tokens(epd, "decode", "external_kv_transfer") > received
