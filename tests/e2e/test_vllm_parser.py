"""Every `vllm serve` command line the examples render, traced ones included, is accepted by vLLM 0.32's own
parser, with its EC/KV connector names resolved by vLLM's connector factories (`tests/support/vllm_args.py`).
No vLLM server starts; the parser runs in the cached vLLM CPU venv."""

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
from tests.support.vllm_args import check_serve_commands

pytestmark = [pytest.mark.usefixtures("vllm_ready"), pytest.mark.timeout(1200)]

ENDPOINT = "http://otel-collector.observability:4318/v1/traces"


def test_every_rendered_serve_command_parses_under_vllm():
    argvs = [argv for objects in rendered_examples().values() for argv in serve_argvs(objects)]
    argvs += [argv for epd in variants().values() for argv in serve_argvs(render(epd))]
    errors = check_serve_commands(argvs)
    refused = [f"{' '.join(argv)}\n  -> {error}" for argv, error in zip(argvs, errors, strict=True) if error]
    assert not refused, "\n".join(refused)


def test_the_checker_would_notice_a_bad_command_line():
    good = serve_argvs(render(example(MOONCAKE)))[0]
    bad_connector = [arg.replace("ECMooncakeConnector", "ECNoSuchConnector") for arg in good]
    unknown_flag, unknown_connector = check_serve_commands([good + ["--no-such-flag"], bad_connector])
    assert "--no-such-flag" in unknown_flag
    assert "ECNoSuchConnector" in unknown_connector


def test_vllm_accepts_the_traced_command_lines():
    argvs = [
        argv
        for name in (NIXL_AUTOSCALED, MOONCAKE)
        for argv in serve_argvs(render(example(name, **{"spec.tracing": {"otlpEndpoint": ENDPOINT}})))
    ]
    assert all("--otlp-traces-endpoint" in argv for argv in argvs)
    errors = check_serve_commands(argvs)
    refused = [f"{' '.join(argv)}\n  -> {error}" for argv, error in zip(argvs, errors, strict=True) if error]
    assert not refused, "\n".join(refused)
