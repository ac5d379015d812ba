"""Encoder first (controller/rollout.py): which consumer workloads wait for an encoder of their new generation."""

from __future__ import annotations

import copy
from typing import Any

from epd_operator.api.labels import GENERATION_LABEL as GEN
from epd_operator.api.labels import ROLE_LABEL
from epd_operator.controller.rollout import Held, held_consumers, pod_labels
from epd_operator.render import render
from epd_operator.render.generation import compatibility_generation
from tests.support.render_examples import NIXL_AUTOSCALED, SHARED_STORAGE, example

NEW_IMAGE = "vllm/vllm-openai:v0.33.1"


def workloads(epd: Any) -> list[dict[str, Any]]:
    return [o for o in render(epd) if o["kind"] in ("Deployment", "LeaderWorkerSet")]


def encoder_pod(generation: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": f"encoder-{generation}", "labels": {ROLE_LABEL: "encoder", GEN: generation}},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_new_generation_holds_every_consumer_until_an_encoder_of_it_is_ready():
    before, after = example(NIXL_AUTOSCALED), example(NIXL_AUTOSCALED, **{"spec.encoder.image": NEW_IMAGE})
    old, new = compatibility_generation(before), compatibility_generation(after)
    assert old != new
    live, desired = workloads(before), workloads(after)

    held = held_consumers(desired, live, [encoder_pod(old), encoder_pod(new, ready=False)])
    name = before.metadata.name
    assert held == [
        Held("Deployment", f"{name}-prefill", "prefill", runs=old, waits_for=new),
        Held("Deployment", f"{name}-decode", "decode", runs=old, waits_for=new),
    ]
    assert held_consumers(desired, live, [encoder_pod(old), encoder_pod(new)]) == []


def test_nothing_is_held_without_a_generation_change_a_live_consumer_or_encoder_replicas():
    before = example(SHARED_STORAGE)
    after = example(SHARED_STORAGE, **{"spec.image": NEW_IMAGE})
    # Same generation: a replicas change moves at once.
    assert (
        held_consumers(workloads(example(SHARED_STORAGE, **{"spec.decode.replicas": 3})), workloads(before), []) == []
    )
    # A new EPDDeployment: every tier starts at once.
    assert held_consumers(workloads(after), [], []) == []
    # Consumers already on the new generation: they are not sent back.
    assert held_consumers(workloads(after), workloads(after), []) == []
    # The encoder tier asks for no pod: nothing would ever release the consumers.
    no_encoders = copy.deepcopy(workloads(after))
    for w in no_encoders:
        if pod_labels(w).get(ROLE_LABEL) == "encoder":
            w["spec"]["replicas"] = 0
    assert held_consumers(no_encoders, workloads(before), []) == []
    # The router has no generation: it is never held.
    assert [h.role for h in held_consumers(workloads(after), workloads(before), [])] == ["decode"]


def test_a_multi_node_consumer_is_held_by_its_worker_template_labels():
    before = example("epd-multi-node.yaml")
    after = example("epd-multi-node.yaml", **{"spec.image": NEW_IMAGE})
    lws = [w for w in workloads(after) if w["kind"] == "LeaderWorkerSet"]
    assert lws and pod_labels(lws[0])[GEN] == compatibility_generation(after)
    held = held_consumers(workloads(after), workloads(before), [])
    assert {(h.kind, h.name) for h in held} >= {(w["kind"], w["metadata"]["name"]) for w in lws}
    assert pod_labels({"kind": "Service", "spec": {"selector": {"a": "b"}}}) == {}


def test_nothing_is_held_while_keda_keeps_the_encoder_tier_at_zero():
    at_zero = {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 4, "keda": {"prometheusAddress": "http://p:9090"}}
    before = example(SHARED_STORAGE, **{"spec.encoder.autoscaling": at_zero})
    after = example(SHARED_STORAGE, **{"spec.encoder.autoscaling": at_zero, "spec.image": NEW_IMAGE})
    live = copy.deepcopy(workloads(before))
    encoder = next(w for w in live if pod_labels(w).get(ROLE_LABEL) == "encoder")
    encoder["spec"]["replicas"] = 1  # KEDA activated the tier: consumers wait for a new encoder
    assert [h.role for h in held_consumers(workloads(after), live, [])] == ["decode"]
    encoder["spec"]["replicas"] = 0  # KEDA scaled it to zero: no encoder is coming, nothing is held
    assert held_consumers(workloads(after), live, []) == []
