"""The vLLM command-line harness itself: it must accept what vLLM accepts and report what it refuses.

The renderer's tests trust this harness to say "vLLM 0.32 would start with these flags", so it
is checked here against command lines whose fate is known from the vLLM examples.
"""

import json

import pytest

from tests.support.vllm_args import check_serve_commands

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("vllm_ready"), pytest.mark.timeout(1200)]

MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"  # a hub id: the harness must substitute the local model


def ec_config(role: str, **extra) -> str:
    return json.dumps(
        {
            "ec_connector": "ECExampleConnector",
            "ec_role": role,
            "ec_connector_extra_config": {"shared_storage_path": "/shared/ec"},
            **extra,
        }
    )


def test_accepts_the_upstream_encoder_and_pd_command_lines():
    encoder = [
        "vllm",
        "serve",
        MODEL,
        "--port",
        "8000",
        "--mm-encoder-only",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--max-num-batched-tokens",
        "114688",
        "--ec-transfer-config",
        ec_config("ec_producer"),
    ]
    prefill = [
        "vllm",
        "serve",
        MODEL,
        "--port",
        "8001",
        "--enable-mm-embeds",
        "--ec-transfer-config",
        ec_config("ec_consumer"),
        "--kv-transfer-config",
        '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}',
    ]
    assert check_serve_commands([encoder, prefill]) == [None, None]


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--ec-transfer-config", ec_config("ec_sender")], "ec_role"),
        (["--ec-transfer-config", ec_config("ec_producer", ec_rol="x")], "ec_rol"),
        (["--ec-transfer-config", "{not json"], "Invalid JSON"),
        (["--kv-transfer-config", '{"kv_connector":"P2pNcclConnector","kv_role":"kv_consumer"}'], "P2pNcclConnector"),
        (["--disable-prefix-caching"], "unrecognized arguments"),  # 0.33 spelling, not 0.32
    ],
)
def test_reports_what_vllm_refuses(flags, complaint):
    [error] = check_serve_commands([["vllm", "serve", MODEL, *flags]])
    assert error is not None and complaint in error


def test_rejects_something_that_is_not_vllm_serve():
    [error] = check_serve_commands([["vllm", "bench", "serve", MODEL]])
    assert error is not None and "vllm serve" in error
