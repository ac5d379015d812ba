"""The encoder autoscaling loop on real pods: real load, real metrics, the real HPA, real vLLM encoders.

examples/epd-local-cpu.yaml with `encoder.autoscaling: {minReplicas: 1, maxReplicas: 2, load:
{targetPerPod: 4}}` and a 30 s scale-down window runs on the real node; Prometheus and
prometheus-adapter (the operator chart's rules, unchanged) run in the node's network namespace and
serve the routers' per-encoder load to kube-controller-manager's HPA (tests/support/autoscale_loop.py).
Chat clients with images never sent before call the router Service's ClusterIP: one client with one
image per request, then a step of four clients with four images each, then one client again. The
HPA scales the encoder Deployment to 2 on the load it reads, the router sends images to the new
encoder once it is Ready (its own vLLM counter moves) and in the minute after it first serves the two
share the encoder requests within 35-65 %, and when the load drops the HPA scales back to 1 and the
leaving encoder drains: no client request fails during the whole run. The router runs with
spill-over on (the deployment's default); `make bench-autoscale` runs the loop with it off and on.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.support.autoscale_loop import (
    LOAD,
    TIMELINE,
    LoopConfig,
    LoopRecord,
    metrics_pipeline,
    run_loop,
    write_record,
)
from tests.support.mission import Mission, remove
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.long,  # tens of minutes: `-m "not long"` leaves it out
    pytest.mark.timeout(2400),  # image import, two vLLM starts and the loop on two shared cores
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]
CONFIG = LoopConfig()


@pytest.fixture(scope="module")
def loop(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopRecord]:
    tmp = tmp_path_factory.mktemp("autoscale")
    started, t = datetime.now(UTC), time.monotonic()
    m = dataclasses.replace(shared_mission, name="tiny-vl")
    try:
        with metrics_pipeline(m, tmp) as pipeline:
            record = run_loop(m, pipeline, CONFIG, tmp, say=lambda line: print(line, file=sys.stderr))
            # The run as `python -m bench.autoscale --from-record` reports it.
            write_record(tmp / "autoscale.json", record, started, time.monotonic() - t)
            print(f"loop record: {tmp / 'autoscale.json'}", file=sys.stderr)
            yield record
    finally:
        remove(m, m.name)


def test_the_hpa_scales_the_encoders_to_two_on_the_load_it_reads(loop: LoopRecord):
    light = [s for s in loop.samples if s.phase == "light"]
    assert light and all(s.replicas == 1 for s in light), "light load kept one encoder"
    conditions = {c["type"]: c for c in loop.scaled_up_hpa["conditions"]}
    assert conditions["ScalingActive"]["status"] == "True"
    assert conditions["ScalingActive"]["reason"] == "ValidMetricFound"
    assert LOAD in conditions["ScalingActive"]["message"]
    assert loop.scaled_up_hpa["desiredReplicas"] == 2
    assert loop.autoscaling_active["status"] == "True", loop.autoscaling_active
    # What the HPA acted on: the router's items in flight to the first encoder, as Prometheus scraped
    # them, went above the target between the step and the scale-up.
    inflight = loop.series[f"inflight:{loop.first_encoder}"]
    during = [v for t, v in inflight if loop.marks["step_start"] <= t <= loop.marks["scaled_up"]]
    before = [v for t, v in inflight if t < loop.marks["step_start"]]
    assert during and max(during) > CONFIG.target_per_pod, during
    assert before and max(before) <= CONFIG.light.images, before


def test_the_new_encoder_takes_35_to_65_percent_of_the_encoder_requests_once_it_serves(loop: LoopRecord):
    assert loop.second_encoder and loop.second_encoder != loop.first_encoder
    assert loop.marks["second_ready"] <= loop.marks["second_serving"]
    # The picker's doing: the newcomer, with nothing in flight, takes new images while the old one is
    # past the in-flight bound, then the hash ring shares them by recent work (router/pickers.py).
    share = loop.share_after_second()
    assert sum(share.values()) >= 20, share  # a minute of step load: enough requests for a share
    assert 0.35 <= loop.new_share() <= 0.65, share
    # Its way to serving, in order, as the loop saw it.
    seen = [name for name, _ in TIMELINE if name in loop.timeline]
    assert seen == [name for name, _ in TIMELINE], loop.timeline
    assert loop.timeline["pod_created"] <= loop.timeline["ready"] <= loop.timeline["router_first_request"] + 1


def test_the_scale_down_drains_the_leaving_encoder_without_a_failed_request(loop: LoopRecord):
    assert loop.marks["scaled_down"] < loop.marks["left_gone"]
    after = [r for r in loop.requests if r["phase"] == "light_after"]
    assert after, "light load ran through the scale-down"
    assert any(r["start"] <= loop.marks["left_gone"] for r in after)
    assert len(loop.requests) > 20
    assert loop.failures() == [], loop.failures()[:5]
