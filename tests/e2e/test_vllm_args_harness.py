"""The vLLM command-line harness itself: it must accept what vLLM accepts and report what it refuses.

The renderer's tests trust this harness to say "vLLM 0.32 (or 0.33) would start with these flags", so
it is checked here against command lines whose fate is known from the vLLM examples and releases.
"""

import json

import pytest

from tests.support.vllm_args import VLLM_VERSIONS, check_serve_commands

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


def test_each_release_answers_with_its_own_parser():
    """0.33 renamed the prefix-caching flag (`--disable-prefix-caching`) and kept the old spelling;
    0.32 knows only the old one: the answers differ only if each checker runs its own release."""
    argvs = [
        ["vllm", "serve", MODEL, "--disable-prefix-caching"],
        ["vllm", "serve", MODEL, "--no-enable-prefix-caching"],
    ]
    answers = {version: check_serve_commands(argvs, version) for version in VLLM_VERSIONS}
    assert answers["0.33.0"] == [None, None]
    new_spelling, old_spelling = answers["0.32.0"]
    assert "unrecognized arguments" in (new_spelling or "") and old_spelling is None
