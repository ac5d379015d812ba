"""Every `vllm serve` command line the examples render, traced ones included, is accepted by vLLM's own
parser in every release the operator claims: 0.32's (the CPU venv) and 0.33's (the default image; its wheel's
parser over the CPU venv's packages). The JSON transfer configs are built into vLLM's own config objects and
the EC/KV connector names resolved by vLLM's connector factories (`tests/support/vllm_args.py`). No vLLM
server starts."""

from __future__ import annotations

import pytest

from epd_operator.render import render
from tests.support.render_examples import (
    MOONCAKE,
    NIXL_AUTOSCALED,
    example,
    rendered_examples,
    serve_argvs,
    variants,
)
from tests.support.vllm_args import VLLM_VERSIONS, check_serve_commands

pytestmark = [pytest.mark.usefixtures("vllm_ready"), pytest.mark.timeout(1200)]

ENDPOINT = "http://otel-collector.observability:4318/v1/traces"


def refused(argvs: list[list[str]], version: str) -> str:
    errors = check_serve_commands(argvs, version)
    lines = [f"{' '.join(argv)}\n  -> {error}" for argv, error in zip(argvs, errors, strict=True) if error]
    return f"vLLM {version} refuses:\n" + "\n".join(lines) if lines else ""


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_every_rendered_serve_command_parses_under_vllm(version):
    argvs = [argv for objects in rendered_examples().values() for argv in serve_argvs(objects)]
    argvs += [argv for epd in variants().values() for argv in serve_argvs(render(epd))]
    assert not refused(argvs, version)


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_the_checker_would_notice_a_bad_command_line(version):
    good = serve_argvs(render(example(MOONCAKE)))[0]
    bad_connector = [arg.replace("ECMooncakeConnector", "ECNoSuchConnector") for arg in good]
    bad_key = [arg.replace('"ec_role"', '"ec_rol"') for arg in good]
    unknown_flag, unknown_connector, unknown_key = check_serve_commands(
        [good + ["--no-such-flag"], bad_connector, bad_key], version
    )
    assert "--no-such-flag" in (unknown_flag or "")
    assert "ECNoSuchConnector" in (unknown_connector or "")
    assert "ec_rol" in (unknown_key or "")


@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_vllm_accepts_the_traced_command_lines(version):
    argvs = [
        argv
        for name in (NIXL_AUTOSCALED, MOONCAKE)
        for argv in serve_argvs(render(example(name, **{"spec.tracing": {"otlpEndpoint": ENDPOINT}})))
    ]
    assert all("--otlp-traces-endpoint" in argv for argv in argvs)
    assert not refused(argvs, version)
