"""controller/reconciler.py around its passes: each tier's inputs to the status (tier_inputs), what
watch events leave in the cache and queue, how long the resync and audit timers wait, and how a run
ends. On a recording stand-in for the API server (tests/support/recording_kube.py); the passes
themselves: test_reconciler_passes.py."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from epd_operator.api.labels import ROLE_LABEL
from epd_operator.controller import reconciler as reconciler_module
from epd_operator.controller.metrics import Metrics
from epd_operator.controller.reconciler import AUDIT_SECONDS, Reconciler, tier_inputs
from epd_operator.controller.workqueue import FULL
from tests.support.recording_kube import RecordingKube, as_kube
from tests.unit.controller.test_reconciler import KEY, NAME, NS, epd_body, held_reconciler, pod, queued
from tests.unit.controller.test_reconciler_runtime import child, known

# ----------------------------------------------------------------------------- tier_inputs


def workload(role: str, replicas: int | None = None, kind: str = "Deployment") -> dict[str, Any]:
    obj: dict[str, Any] = {"kind": kind, "metadata": {"name": f"{NAME}-{role}", "labels": {ROLE_LABEL: role}}}
    obj["spec"] = {} if replicas is None else {"replicas": replicas}
    return obj


def autoscaler(kind: str, role: str, **spec: int) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": f"{NAME}-{role}"}, "spec": spec}


def test_an_autoscaled_tier_not_created_yet_plans_its_autoscalers_minimum():
    objects = [
        {"kind": "ConfigMap", "metadata": {"name": f"{NAME}-transfer"}},  # no labels: not a tier
        workload("encoder"),
        autoscaler("HorizontalPodAutoscaler", "encoder", minReplicas=3),
        workload("prefill"),
        autoscaler("ScaledObject", "prefill", minReplicaCount=2),
        workload("decode"),
        autoscaler("ScaledObject", "decode"),  # KEDA's default minimum
        workload("router", replicas=2),
    ]
    tiers = tier_inputs(objects, [])
    assert {role: t.planned_replicas for role, t in tiers.items()} == {
        "encoder": 3,
        "prefill": 2,
        "decode": 1,
        "router": 2,
    }
    assert all(t.deployment is None and t.hpa is None and t.scaled_object is None for t in tiers.values())


def test_a_scale_to_zero_minimum_still_plans_one_replica():
    objects = [workload("encoder"), autoscaler("ScaledObject", "encoder", minReplicaCount=0)]
    assert tier_inputs(objects, [])["encoder"].planned_replicas == 1


def test_each_tier_gets_its_live_workload_hpa_and_scaled_object():
    encoder, decode = workload("encoder"), workload("decode", kind="LeaderWorkerSet")
    hpa = autoscaler("HorizontalPodAutoscaler", "encoder", minReplicas=2)
    scaled = autoscaler("ScaledObject", "decode", minReplicaCount=1)
    other_hpa = autoscaler("HorizontalPodAutoscaler", "router", minReplicas=1)
    live = [
        {**encoder, "status": {"readyReplicas": 1}},
        {**decode, "status": {"readyReplicas": 2}},
        hpa,
        scaled,
        other_hpa,
    ]
    tiers = tier_inputs([encoder, hpa, decode, scaled], live)
    assert tiers["encoder"].deployment == live[0] and tiers["encoder"].hpa == hpa
    assert tiers["encoder"].scaled_object is None
    assert tiers["decode"].deployment == live[1] and tiers["decode"].scaled_object == scaled
    assert tiers["decode"].hpa is None
    assert set(tiers) == {"encoder", "decode"}


def test_a_refused_specs_tiers_are_the_workloads_that_still_run():
    # Without rendered objects nothing says how many replicas were planned: one.
    live = [
        {"kind": "Deployment", "metadata": {"name": f"{NAME}-decode", "labels": {ROLE_LABEL: "decode"}}},
        workload("encoder", replicas=3),
        {"kind": "Service", "metadata": {"name": NAME}},
        {**workload("transfer"), "kind": "ConfigMap"},
    ]
    tiers = tier_inputs([], live)
    assert set(tiers) == {"decode", "encoder"}
    assert tiers["decode"].planned_replicas == 1 and tiers["decode"].deployment == live[0]
    assert tiers["encoder"].planned_replicas == 3


# ----------------------------------------------------------------------------- triggers


async def test_a_deleted_child_leaves_the_cache_and_an_unlabelled_one_queues_nothing():
    r, _ = known()
    await queued(r)
    r.child_event("ADDED", child())
    assert r.cache.get("Deployment", NS, f"{NAME}-decode") is not None
    await queued(r)
    r.child_event("DELETED", child())
    assert r.cache.get("Deployment", NS, f"{NAME}-decode") is None
    assert await queued(r) == FULL
    unlabelled = child()
    del unlabelled["metadata"]["labels"]
    r.child_event("MODIFIED", unlabelled)
    assert await queued(r) is None


async def test_a_deleted_pod_leaves_the_cache():
    r, _ = known()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    encoder = pod("encoder", "g1", ready=True, revision=30)
    r.pod_event("ADDED", encoder)
    assert r.cache.pods(NS, NAME, {}) == [encoder]
    r.pod_event("DELETED", encoder)
    assert r.cache.pods(NS, NAME, {}) == []


async def test_a_deleted_epddeployment_leaves_the_cache_and_its_queued_pass_finds_it_gone():
    r, kube = known()
    await queued(r)
    r.epd_event("DELETED", epd_body(1, 10))
    assert r.cache.get("EPDDeployment", NS, NAME) is None
    assert await r.full_pass(KEY) == "gone"  # a pass queued before the deletion
    assert await r.status_pass(KEY) == "gone"
    assert kube.calls == [] and r.known == {}


async def test_the_deletion_of_an_epddeployment_never_seen_is_just_recorded():
    kube = RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="test")
    r.epd_event("DELETED", epd_body(1, 10))
    assert r.known == {} and len(r.queue) == 0
    assert r.metrics.registry.get_sample_value("epd_operator_epddeployments") == 0


async def test_a_deleted_epddeployment_leaves_no_hold_behind():
    r, _, _, _, after = await held_reconciler()
    assert r._held
    r.epd_event("DELETED", after)
    assert r._held == {} and r._reconciled == {}


# ----------------------------------------------------------------------------- timers


class Stop(Exception):
    """Ends a timer loop at its first wait."""


def first_wait(monkeypatch: pytest.MonkeyPatch, spread: float) -> tuple[list[float], list[tuple[float, float]]]:
    """Stand-ins for the module's sleep (records the delay, then stops the loop) and jitter (`spread`)."""
    waits: list[float] = []
    ranges: list[tuple[float, float]] = []

    async def sleep(delay: float) -> None:
        waits.append(delay)
        raise Stop

    def uniform(a: float, b: float) -> float:
        ranges.append((a, b))
        return spread

    monkeypatch.setattr(reconciler_module, "asyncio", types.SimpleNamespace(sleep=sleep))
    monkeypatch.setattr(reconciler_module, "random", types.SimpleNamespace(uniform=uniform))
    return waits, ranges


async def test_the_resync_waits_its_period_spread_by_up_to_ten_percent(monkeypatch):
    r, _ = known()
    r.resync_seconds = 120.0
    waits, ranges = first_wait(monkeypatch, 1.1)
    with pytest.raises(Stop):
        await r._resync()
    assert ranges == [(0.9, 1.1)]
    assert waits == [pytest.approx(132.0)]


async def test_the_cache_audit_waits_ten_minutes_spread_by_up_to_ten_percent(monkeypatch):
    r, _ = known()
    waits, ranges = first_wait(monkeypatch, 0.9)
    with pytest.raises(Stop):
        await r._audits()
    assert AUDIT_SECONDS == 600.0
    assert ranges == [(0.9, 1.1)]
    assert waits == [pytest.approx(540.0)]


# ----------------------------------------------------------------------------- ending


async def test_run_returns_only_once_every_task_it_started_has_ended(monkeypatch):
    """A task that fails ends the run: the others are cancelled, and run() waits until each has
    finished its cleanup, even one that takes several steps (an audit closing its request)."""
    r, _ = known()
    audit_started, audit_ended = asyncio.Event(), []

    async def audit() -> None:
        audit_started.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            audit_ended.append(True)

    async def resync() -> None:
        await audit_started.wait()
        raise RuntimeError("resync broke")

    monkeypatch.setattr(reconciler_module, "AUDIT_SECONDS", 0.0)
    monkeypatch.setattr(r, "audit", audit)
    monkeypatch.setattr(r, "_resync", resync)
    with pytest.raises(RuntimeError, match="resync broke"):
        await asyncio.wait_for(r.run(), 5)
    assert audit_ended == [True]
    assert [t for t in asyncio.all_tasks() if t.get_name().startswith("epd-")] == []
