"""The encoder tier scaled to zero and back by the real KEDA, on real pods under real load.

examples/epd-local-cpu.yaml with `encoder.autoscaling: {engine: KEDA, minReplicas: 0, maxReplicas: 2,
load: {targetPerPod: 4}}` (KEDA polling every 5 s, 30 s cooldown before zero, activation threshold 1,
a 30 s scale-down window for its HPA) runs on the real node. KEDA's operator and metrics server run in
the node's network namespace (`cluster.start_part("keda")`), where its Prometheus trigger reads the loop's
Prometheus, which scrapes the router and vLLM pods (tests/support/autoscale_loop.py). Chat clients with
images never sent before call the router Service's ClusterIP:

- idle, the encoder Deployment is at 0 and the EPDDeployment Ready, its encoder tier `ScaledToZero`;
- one client with one image every 2 s is served raw by the consumer (the PD pod encodes the image), the
  tier staying at zero (under 1 raw item per second: below the activation threshold);
- a step of four clients with four images each wakes the tier: KEDA activates it, an encoder starts, and
  the router sends it images once it is Ready (its own vLLM counter moves); KEDA's HPA takes the tier to
  2 when the load per encoder asks for it, and the second encoder serves too;
- one client again: KEDA takes the tier back to zero after its cooldown, the last encoder drains, and
  the EPDDeployment reads `ScaledToZero` again.

No client request fails in the whole run. The record is written as `python -m bench.autoscale --keda
--from-record` reads it (bench/results/autoscale-keda.*).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from bench.procs import commit
from tests.support.autoscale_loop import (
    KEDA_LOOP,
    KEDA_TIMELINE,
    LoopRecord,
    metrics_pipeline,
    run_loop,
    start_keda,
    write_record,
)
from tests.support.mission import Mission, remove
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.long,  # tens of minutes: `-m "not long"` leaves it out
    pytest.mark.timeout(2700),  # two vLLM starts at once under load on two shared cores, and the way back to zero
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@pytest.fixture(scope="module")
def loop(shared_mission: Mission, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopRecord]:
    tmp = tmp_path_factory.mktemp("keda")
    started, t, ran_at = datetime.now(UTC), time.monotonic(), commit()
    m = dataclasses.replace(shared_mission, name="tiny-vl")
    start_keda(m)  # builds KEDA first when `make k8s` has not (about 9 minutes), as the HPA loop its adapter
    try:
        with metrics_pipeline(m, tmp, adapter=False) as pipeline:
            record = run_loop(m, pipeline, KEDA_LOOP, tmp, say=lambda line: print(line, file=sys.stderr))
            write_record(tmp / "autoscale-keda.json", record, started, time.monotonic() - t, ran_at)
            print(f"loop record: {tmp / 'autoscale-keda.json'}", file=sys.stderr)
            yield record
    finally:
        remove(m, m.name)


def test_idle_the_encoders_are_at_zero_and_light_load_is_served_raw(loop: LoopRecord):
    idle = loop.statuses["idle"]
    assert idle["phase"] == "Ready", idle
    assert idle["encoder"]["reason"] == "ScaledToZero" and idle["encoder"]["ready"] == "0/0", idle
    assert idle["conditions"]["Ready"]["status"] == "True", idle
    assert idle["scaled_object"]["Ready"] == "True" and idle["scaled_object"]["Active"] == "False", idle
    # The EPDDeployment carries KEDA's own verdict: it can scale the tier, no trigger is active.
    assert idle["conditions"]["AutoscalingActive"]["status"] == "True", idle
    keda_says = {c["type"]: c["status"] for c in idle["encoder"]["autoscaling"]["conditions"]}
    assert (keda_says["Ready"], keda_says["Active"]) == ("True", "False"), idle
    light = [s for s in loop.samples if s.phase == "light"]
    assert light and all(s.replicas == 0 for s in light), "light load woke the tier"
    served = [r for r in loop.requests if r["phase"] == "light"]
    assert len(served) >= 5 and all(r["status"] == 200 for r in served), served[:5]
    # With no encoder, the router sent each image raw to the consumer.
    assert loop.statuses["raw_items_at_light_end"] >= len(served), loop.statuses


def test_a_load_step_wakes_the_tier_and_the_router_uses_the_new_encoder(loop: LoopRecord):
    assert loop.marks["step_start"] < loop.marks["activated"] < loop.marks["first_serving"]
    activated = loop.statuses["activated"]["scaled_object"]
    assert activated["Ready"] == "True", activated
    # Its way to serving, in order, as the loop saw it.
    seen = [name for name, _ in KEDA_TIMELINE if name in loop.timeline]
    assert seen == [name for name, _ in KEDA_TIMELINE], loop.timeline
    assert loop.timeline["pod_created"] <= loop.timeline["ready"] <= loop.timeline["router_first_request"] + 1
    # Both encoders answered the router when KEDA's HPA asked for a second one.
    if "scaled_up" in loop.marks:
        assert loop.second_encoder and loop.marks["second_serving"] > loop.marks["scaled_up"]
        conditions = {c["type"]: c for c in loop.scaled_up_hpa["conditions"]}
        assert conditions["ScalingActive"]["reason"] == "ValidMetricFound", conditions
        assert loop.counts_at_step_end[loop.second_encoder] > 0, loop.counts_at_step_end
    assert max(s.replicas for s in loop.samples if s.phase == "step") <= 2


def test_the_tier_goes_back_to_zero_draining_the_last_encoder_without_a_failed_request(loop: LoopRecord):
    assert loop.marks["light_after_start"] < loop.marks["scaled_down"] < loop.marks["left_gone"]
    again = loop.statuses["zero_again"]
    assert again["phase"] == "Ready" and again["encoder"]["reason"] == "ScaledToZero", again
    assert "ScaledToZero" in loop.statuses["events"], loop.statuses["events"]
    after = [r for r in loop.requests if r["phase"] == "light_after"]
    assert any(r["start"] <= loop.marks["left_gone"] <= r["end"] or r["start"] > loop.marks["left_gone"] for r in after)
    assert loop.failures() == [], loop.failures()[:5]
