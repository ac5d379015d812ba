"""spec.tracing: one OTLP endpoint rendered onto the router and every vLLM tier, and accepted by the router's
own parser; vLLM 0.32's and 0.33's parsers check the tiers' lines in tests/e2e/test_vllm_parser.py."""

from __future__ import annotations

import pytest

from epd_operator.api import parse_epd
from epd_operator.render import render
from epd_operator.router.main import build_parser, config_from_args
from tests.support.render_examples import (
    MOONCAKE,
    NIXL_AUTOSCALED,
    container,
    env_of,
    example,
    example_document,
    flag,
)

ENDPOINT = "http://otel-collector.observability:4318/v1/traces"


def vllm_deployments(objects: list[dict]) -> list[dict]:
    return [
        o
        for o in objects
        if o["kind"] == "Deployment" and any(c["name"] == "vllm" for c in o["spec"]["template"]["spec"]["containers"])
    ]


def router_container(objects: list[dict]) -> dict:
    [router] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-router")]
    return container(router, "router")


@pytest.mark.parametrize("name", [NIXL_AUTOSCALED, MOONCAKE])  # E/P/D and E+PD
def test_every_tier_and_the_router_export_to_the_one_endpoint(name):
    epd = example(name, **{"spec.tracing": {"otlpEndpoint": ENDPOINT, "sampleRatio": 0.25}})
    objects = render(epd)
    tiers = vllm_deployments(objects)
    assert len(tiers) == (3 if epd.spec.prefill is not None else 2)
    for deployment in tiers:
        vllm = container(deployment, "vllm")
        role = deployment["metadata"]["name"].rsplit("-", 1)[1]
        assert flag(vllm["args"], "--otlp-traces-endpoint") == ENDPOINT
        env = env_of(vllm)
        assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"  # vLLM's default is gRPC
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"] == f"{epd.name}-{role}"
    args = router_container(objects)["args"]
    cfg = config_from_args(build_parser().parse_args(args))
    assert (cfg.otlp_traces_endpoint, cfg.trace_sample_ratio) == (ENDPOINT, 0.25)


def test_tracing_is_off_unless_asked_for():
    objects = render(example(NIXL_AUTOSCALED))
    for deployment in vllm_deployments(objects):
        vllm = container(deployment, "vllm")
        assert "--otlp-traces-endpoint" not in vllm["args"]
        assert not [name for name in env_of(vllm) if name.startswith("OTEL_")]
    assert "--otlp-traces-endpoint" not in router_container(objects)["args"]
    assert config_from_args(build_parser().parse_args(router_container(objects)["args"])).otlp_traces_endpoint is None


@pytest.mark.parametrize(
    "tracing, field",
    [
        ({"otlpEndpoint": "otel-collector:4317"}, "otlpEndpoint"),  # no scheme: not an OTLP/HTTP URL
        ({"otlpEndpoint": ENDPOINT, "sampleRatio": 1.5}, "sampleRatio"),
        ({"sampleRatio": 0.5}, "otlpEndpoint"),
        ({"otlpEndpoint": ENDPOINT, "protocol": "grpc"}, "protocol"),
    ],
)
def test_bad_tracing_settings_are_refused_naming_the_field(tracing, field):
    doc = example_document(NIXL_AUTOSCALED)
    doc["spec"]["tracing"] = tracing
    with pytest.raises(Exception) as err:
        parse_epd(doc)
    assert f"spec.tracing.{field}" in str(err.value), str(err.value)
