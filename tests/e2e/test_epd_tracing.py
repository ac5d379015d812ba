"""Traces through real vLLM (CPU): the shared-storage example with `spec.tracing` pointing at an
in-test OTLP receiver, run locally from its rendered command lines and environment. vLLM's own
`llm_request` spans must join the router's trace, each under the router span of its call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dev.local.client import image_part, text_part
from dev.local.cpu_sizing import fit_to_cpu
from dev.local.runner import load_spec, run_local
from tests.support.otlp_receiver import receiver_in_thread, wait_for_spans
from tests.support.vllm_pipeline import ask

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "epd-shared-storage.yaml"
REQUEST_SPAN = "POST /v1/chat/completions"


@pytest.fixture(scope="module")
def traced(vllm_ready, tmp_path_factory):
    # Export every 200 ms instead of every 5 s (the BatchSpanProcessor reads this; every process inherits it).
    saved = os.environ.get("OTEL_BSP_SCHEDULE_DELAY")
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"
    try:
        with receiver_in_thread() as rx:
            spec, _ = fit_to_cpu(load_spec(EXAMPLE))
            spec["spec"]["tracing"] = {"otlpEndpoint": rx.url}
            with run_local(spec, tmp_path_factory.mktemp("traced")) as running:
                yield running, rx, spec["metadata"]["name"]
    finally:
        if saved is None:
            os.environ.pop("OTEL_BSP_SCHEDULE_DELAY", None)
        else:
            os.environ["OTEL_BSP_SCHEDULE_DELAY"] = saved


def test_vllm_spans_join_the_routers_trace_under_the_call_that_made_them(traced):
    epd, rx, name = traced
    ask(epd, [text_part("Describe the image."), image_part(4242)])

    def complete(spans) -> bool:
        roots = [s for s in spans if s.name == REQUEST_SPAN]
        return (
            bool(roots) and sum(1 for s in spans if s.name == "llm_request" and s.trace_id == roots[-1].trace_id) >= 2
        )

    spans = wait_for_spans(rx, complete, "router trace with the encoder's and PD's llm_request spans")
    [request] = [s for s in spans if s.name == REQUEST_SPAN]
    trace = [s for s in spans if s.trace_id == request.trace_id]
    calls = {s.span_id: s for s in trace if s.parent_id == request.span_id and s.service == "epd-router"}
    assert sorted(s.name for s in calls.values()) == ["decode", "encode"]
    vllm = [s for s in trace if s.name == "llm_request"]
    joined = {(calls[s.parent_id].name, s.service) for s in vllm if s.parent_id in calls}
    assert joined == {("encode", f"{name}-encoder"), ("decode", f"{name}-decode")}, (
        f"vLLM spans not under the router's calls: {[(s.service, s.parent_id) for s in vllm]}"
    )
