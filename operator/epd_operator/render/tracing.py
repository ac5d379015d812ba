"""`spec.tracing` as flags and environment: one OTLP/HTTP endpoint for the router and every vLLM tier.

vLLM 0.32 exports over gRPC unless `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` says `http/protobuf`
(vllm/tracing/otel.py), and the router speaks only OTLP/HTTP: the tiers are told to speak it
too, so the one endpoint serves all. vLLM's tracer provider reads the standard sampler
variables; `parentbased_traceidratio` makes a tier follow the router's sampling decision (the
traceparent the router sends) and sample requests that come without one at the same ratio.
"""

from __future__ import annotations

from ..api.spec import EPDDeployment, EPDDeploymentSpec
from ..router import contract
from .naming import VllmRole


def vllm_tracing_args(spec: EPDDeploymentSpec) -> list[str]:
    return ["--otlp-traces-endpoint", spec.tracing.otlpEndpoint] if spec.tracing is not None else []


def vllm_tracing_env(epd: EPDDeployment, role: VllmRole) -> list[dict[str, str]]:
    tracing = epd.spec.tracing
    if tracing is None:
        return []
    return [
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
        {"name": "OTEL_SERVICE_NAME", "value": f"{epd.name}-{role}"},
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": str(tracing.sampleRatio)},
    ]


def router_tracing_args(spec: EPDDeploymentSpec) -> list[str]:
    tracing = spec.tracing
    if tracing is None:
        return []
    return [
        contract.OTLP_TRACES_ENDPOINT,
        tracing.otlpEndpoint,
        contract.TRACE_SAMPLE_RATIO,
        str(tracing.sampleRatio),
    ]
