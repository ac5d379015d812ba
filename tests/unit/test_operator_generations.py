"""Capacity per compatibility generation, as the status and the operator's metrics report it."""

from __future__ import annotations

from epd_operator.controller.metrics import Metrics
from epd_operator.controller.status import generations

GEN = "serving.epd.dev/compat-generation"


def pod(role: str, generation: str | None, ready: bool = True, leaving: bool = False) -> dict:
    labels = {"serving.epd.dev/role": role, **({GEN: generation} if generation else {})}
    meta: dict = {"name": f"{role}-{generation}", "labels": labels}
    if leaving:
        meta["deletionTimestamp"] = "2026-11-30T21:00:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pods_are_counted_per_generation_current_first():
    pods = [
        pod("encoder", "aaa"),
        pod("decode", "aaa"),
        pod("decode", "aaa", ready=False),
        pod("encoder", "bbb"),
        pod("decode", "bbb", ready=False),
        pod("decode", "aaa", leaving=True),  # terminating: takes no new work
        pod("router", None),
        pod("encoder", None),
    ]  # the router has none; an unlabelled pod is not counted
    report = [g.model_dump() for g in generations(pods, current="bbb")]
    assert report == [
        {"name": "bbb", "current": True, "pods": {"encoder": 1, "decode": 1}, "readyPods": {"encoder": 1}},
        {
            "name": "aaa",
            "current": False,
            "pods": {"encoder": 1, "decode": 2},
            "readyPods": {"encoder": 1, "decode": 1},
        },
    ]


def test_without_pods_there_are_no_generations():
    assert generations([], current="aaa") == []


def series(metrics: Metrics) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "epd_operator_generation_ready_pods"
    }


def test_ready_pods_per_generation_metric_follows_the_rollout():
    metrics = Metrics()
    metrics.set_generations("ns", "vl", {"aaa": {"encoder": 1, "decode": 2}})
    metrics.set_generations("ns", "vl", {"bbb": {"encoder": 1, "decode": 0}, "aaa": {"encoder": 1, "decode": 2}})
    assert series(metrics) == {
        ("ns", "vl", "bbb", "encoder"): 1.0,
        ("ns", "vl", "bbb", "decode"): 0.0,
        ("ns", "vl", "aaa", "encoder"): 1.0,
        ("ns", "vl", "aaa", "decode"): 2.0,
    }
    metrics.set_generations("ns", "vl", {"bbb": {"encoder": 1, "decode": 2}})  # the old generation is gone
    assert series(metrics) == {("ns", "vl", "bbb", "encoder"): 1.0, ("ns", "vl", "bbb", "decode"): 2.0}
    metrics.forget("ns", "vl")
    assert series(metrics) == {}
