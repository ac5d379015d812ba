"""What a pass of controller/reconciler.py publishes: the status (endpoint, topology, tiers and why
they are not ready, generations, holds), its Events, the metrics it exports, and what it applies for
the operator's defaults. On a recording stand-in for the API server (tests/support/recording_kube.py);
the passes are awaited one by one. Which events queue which pass: test_reconciler.py and
test_reconciler_runtime.py."""

from __future__ import annotations

import copy
import logging
from typing import Any

from epd_operator.api.labels import GENERATION_LABEL, INSTANCE_LABEL, ROLE_LABEL
from epd_operator.api.validation import parse_epd
from epd_operator.controller import apply
from epd_operator.controller import reconciler as reconciler_module
from epd_operator.controller.metrics import Metrics
from epd_operator.controller.reconciler import Reconciler
from epd_operator.controller.status_lws import GROUP_INDEX_LABEL
from epd_operator.controller.workqueue import FULL, STATUS
from epd_operator.kube import ApiError
from epd_operator.render import render
from epd_operator.render.generation import compatibility_generation
from tests.support.recording_kube import RecordingKube, as_kube
from tests.support.render_examples import MULTI_NODE, NIXL_AUTOSCALED, example_document
from tests.unit.controller.test_reconciler import (
    KEY,
    NAME,
    NS,
    UID,
    epd_body,
    held_reconciler,
    pod,
    queued,
    spec_only,
    waiting_for_encoders,
)
from tests.unit.controller.test_reconciler_runtime import run_workers, sample

T0, T1 = "2026-12-01T10:00:00Z", "2026-12-01T10:05:00Z"


def body_of(example: str, generation: int = 1, revision: int = 10) -> dict[str, Any]:
    doc = copy.deepcopy(example_document(example))
    doc["metadata"] = {
        "name": NAME,
        "namespace": NS,
        "uid": UID,
        "generation": generation,
        "resourceVersion": str(revision),
    }
    return doc


def reconciler(body: dict[str, Any] | None = None, kube: RecordingKube | None = None, **options: Any):
    kube = kube or RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="test", **options)
    body = body if body is not None else epd_body(1, 10)
    kube.stored[("EPDDeployment", NS, NAME)] = body
    r.epd_event(None, body)
    return r, kube


def events(kube: RecordingKube) -> list[dict[str, Any]]:
    return [call[3] for call in kube.calls if call[0] == "create" and call[1] == "Event"]


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def update(r: Reconciler, kind: str, name: str, revision: int, **fields: Any) -> dict[str, Any]:
    """The cached child with `fields` set (a watch event of its controller's status, say)."""
    current = r.cache.get(kind, NS, name)
    assert current is not None
    changed = {**copy.deepcopy(current), **fields}
    changed["metadata"]["resourceVersion"] = str(revision)
    r.child_event("MODIFIED", changed)
    return changed


def ready_status(replicas: int) -> dict[str, Any]:
    return {
        "observedGeneration": 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }


def tier_pod(role: str, n: int, revision: int, status: dict[str, Any], **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME}-{role}-{n}",
            "namespace": NS,
            "uid": f"pod-{role}-{n}",
            "resourceVersion": str(revision),
            "labels": {INSTANCE_LABEL: NAME, ROLE_LABEL: role, **labels},
        },
        "status": status,
    }


UNSCHEDULABLE = {
    "conditions": [
        {"type": "Ready", "status": "False"},
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes have a GPU"},
    ]
}
CRASHING = {
    "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
    "containerStatuses": [
        {"name": "vllm", "ready": False, "state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}
    ],
}


# ----------------------------------------------------------------------------- the operator's defaults


async def test_the_operators_router_image_and_prometheus_are_used_where_the_spec_names_none():
    body = body_of(NIXL_AUTOSCALED)
    body["spec"]["encoder"]["autoscaling"]["engine"] = "KEDA"
    r, kube = reconciler(body, router_image="registry.example/epd-router:7", prometheus_address="http://prom:9090")
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    router = r.cache.get("Deployment", NS, f"{NAME}-router")
    assert router is not None
    assert {c["image"] for c in router["spec"]["template"]["spec"]["containers"]} == {"registry.example/epd-router:7"}
    scaled = r.cache.get("ScaledObject", NS, f"{NAME}-encoder")
    assert scaled is not None
    assert scaled["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom:9090"
    assert conditions(kube.statuses()[-1])["SpecValid"]["status"] == "True"


# ----------------------------------------------------------------------------- the status


async def test_the_status_gives_the_router_endpoint_the_topology_and_every_tier():
    r, kube = reconciler()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    status = kube.statuses()[-1]
    assert status["endpoint"] == f"http://{NAME}.{NS}.svc:8000"
    assert status["topology"] == "E+PD"
    assert status["observedGeneration"] == 1
    assert {tier: t["ready"] for tier, t in status["tiers"].items()} == {
        "encoder": "0/1",
        "decode": "0/2",
        "router": "0/2",
    }
    assert all(c["lastTransitionTime"] for c in status["conditions"])


async def test_tiers_the_server_refused_to_create_are_still_listed_with_their_planned_replicas():
    kube = RecordingKube(refuse={("Deployment", f"{NAME}-decode"): ApiError(422, {"message": "quota"}, "dry run")})
    r, _ = reconciler(kube=kube)
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    status = kube.statuses()[-1]
    assert status["phase"] == "Failed"
    assert {tier: t["ready"] for tier, t in status["tiers"].items()} == {
        "encoder": "0/1",
        "decode": "0/2",
        "router": "0/2",
    }


async def test_a_spec_refused_from_the_start_applies_nothing_and_says_why():
    body = epd_body(1, 10)
    body["spec"]["decode"] = {**body["spec"]["decode"], "replicas": -1}
    r, kube = reconciler(body)
    await queued(r)
    assert await r.full_pass(KEY) == "invalid"
    assert [c for c in kube.calls if c[0] == "apply"] == []
    status = kube.statuses()[-1]
    spec_valid = conditions(status)["SpecValid"]
    assert (status["phase"], spec_valid["status"], spec_valid["reason"]) == ("Failed", "False", "InvalidSpec")
    assert "spec.decode.replicas" in spec_valid["message"]
    (event,) = events(kube)
    assert (event["type"], event["reason"]) == ("Warning", "InvalidSpec")


async def test_a_spec_turned_invalid_keeps_describing_the_children_that_still_run():
    r, kube = reconciler()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    update(r, "Deployment", f"{NAME}-decode", 50, status=ready_status(2))
    invalid = copy.deepcopy(kube.stored[("EPDDeployment", NS, NAME)])
    invalid["metadata"].update(generation=2, resourceVersion="60")
    invalid["spec"]["decode"] = {**invalid["spec"]["decode"], "replicas": -1}
    kube.stored[("EPDDeployment", NS, NAME)] = invalid
    r.epd_event("MODIFIED", invalid)
    assert await r.full_pass(KEY) == "invalid"
    status = kube.statuses()[-1]
    assert status["phase"] == "Failed" and status["observedGeneration"] == 2
    assert (status["endpoint"], status["topology"]) == (f"http://{NAME}.{NS}.svc:8000", "E+PD")
    assert status["tiers"]["decode"]["readyReplicas"] == 2
    assert set(status["tiers"]) == {"encoder", "decode", "router"}


async def test_conditions_keep_their_transition_time_while_they_hold(monkeypatch):
    r, kube = reconciler()
    await queued(r)
    monkeypatch.setattr(reconciler_module, "utcnow", lambda: T0)
    assert await r.full_pass(KEY) == "success"
    first = conditions(kube.statuses()[-1])
    assert first["SpecValid"]["lastTransitionTime"] == T0
    monkeypatch.setattr(reconciler_module, "utcnow", lambda: T1)
    update(r, "Deployment", f"{NAME}-decode", 50, status=ready_status(2))
    assert await r.status_pass(KEY) == "success"
    second = conditions(kube.statuses()[-1])
    assert kube.statuses()[-1]["tiers"]["decode"]["readyReplicas"] == 2
    assert second["SpecValid"]["lastTransitionTime"] == T0
    assert second["Ready"]["lastTransitionTime"] == T0  # still False


async def test_pods_are_counted_per_generation_in_the_status_and_the_metrics():
    r, kube = reconciler()
    await queued(r)
    current = compatibility_generation(parse_epd(spec_only(epd_body(1, 10))))
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    not_ready = {"conditions": [{"type": "Ready", "status": "False"}]}
    r.pod_event(None, tier_pod("encoder", 0, 20, ready, **{GENERATION_LABEL: current}))
    r.pod_event(None, tier_pod("decode", 0, 21, not_ready, **{GENERATION_LABEL: current}))
    r.pod_event(None, tier_pod("decode", 1, 22, ready, **{GENERATION_LABEL: "old"}))
    elsewhere = tier_pod("decode", 9, 23, ready, **{GENERATION_LABEL: current})
    r.pod_event(None, {**elsewhere, "metadata": {**elsewhere["metadata"], "namespace": "other"}})  # not this one's
    assert await r.full_pass(KEY) == "success"
    assert kube.statuses()[-1]["generations"] == [
        {"name": current, "current": True, "pods": {"encoder": 1, "decode": 1}, "readyPods": {"encoder": 1}},
        {"name": "old", "current": False, "pods": {"decode": 1}, "readyPods": {"decode": 1}},
    ]

    def ready_pods(generation: str, tier: str) -> float | None:
        return sample(
            r, "epd_operator_generation_ready_pods", epd_namespace=NS, epd_name=NAME, generation=generation, tier=tier
        )

    assert (ready_pods(current, "encoder"), ready_pods(current, "decode"), ready_pods("old", "decode")) == (1, 0, 1)


# ----------------------------------------------------------------------------- why tiers are not ready


async def test_unready_tiers_name_the_schedulers_and_the_kubelets_reasons_once():
    r, kube = reconciler()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    # The encoder tier is ready; the decode tier cannot place a pod; a router pod cannot pull its image.
    update(r, "Deployment", f"{NAME}-encoder", 50, status=ready_status(1))
    r.pod_event(None, tier_pod("encoder", 0, 51, {"conditions": [{"type": "Ready", "status": "True"}]}))
    r.pod_event(None, tier_pod("decode", 0, 52, UNSCHEDULABLE))
    r.pod_event(None, tier_pod("router", 0, 53, CRASHING))
    kube.calls.clear()
    assert await r.status_pass(KEY) == "success"
    tiers = kube.statuses()[-1]["tiers"]
    assert "reason" not in tiers["encoder"]
    assert (tiers["decode"]["reason"], tiers["decode"]["message"]) == ("Unschedulable", "0/3 nodes have a GPU")
    assert tiers["router"]["reason"] == "ErrImagePull"
    assert tiers["router"]["message"] == f"pod {NAME}-router-0 container vllm: no such image"
    warnings = {e["reason"]: e for e in events(kube)}
    assert set(warnings) == {"Unschedulable", "ErrImagePull"}
    assert warnings["Unschedulable"]["type"] == "Warning"
    assert warnings["Unschedulable"]["message"] == "decode pods cannot be scheduled: 0/3 nodes have a GPU"
    assert warnings["Unschedulable"]["reportingInstance"] == "test"
    # The decode tier's pod is placed, the router's still fails: a new status, no new Event for the router.
    kube.calls.clear()
    placed = tier_pod("decode", 0, 60, {"conditions": [{"type": "Ready", "status": "False"}]})
    r.pod_event("MODIFIED", placed)
    assert await r.status_pass(KEY) == "success"
    assert "reason" not in kube.statuses()[-1]["tiers"]["decode"]
    assert [e["reason"] for e in events(kube)] == []


async def test_a_multi_node_tier_names_its_groups_that_are_not_ready():
    r, kube = reconciler(body_of(MULTI_NODE))
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    # The example's decode tier: a LeaderWorkerSet of 2 groups of 2 pods. Group 0 is ready, group 1 has no pods.
    status = {"observedGeneration": 1, "replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}
    update(r, "LeaderWorkerSet", f"{NAME}-decode", 50, status=status)
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    for i in range(2):
        r.pod_event(None, tier_pod("decode", i, 51 + i, ready, **{GROUP_INDEX_LABEL: "0"}))
    assert await r.status_pass(KEY) == "success"
    decode = kube.statuses()[-1]["tiers"]["decode"]
    assert (decode["reason"], decode["message"]) == (
        "GroupsNotReady",
        f"group 1 of 2 not ready (LeaderWorkerSet {NAME}-decode)",
    )


# ----------------------------------------------------------------------------- holds


async def test_held_consumers_are_not_applied_while_everything_else_is():
    _, kube, _, _, _ = await held_reconciler()
    applied = {call[1] for call in kube.calls if call[0] == "apply" and not call[4]}
    assert ("Deployment", f"{NAME}-encoder") in applied
    assert ("Deployment", f"{NAME}-decode") not in applied


async def test_a_refused_plan_drops_the_hold():
    r, kube, _, new, after = await held_reconciler()
    kube.refuse[("Deployment", f"{NAME}-encoder")] = ApiError(422, {"message": "quota"}, "dry run")
    changed = copy.deepcopy(after)
    changed["metadata"].update(generation=3, resourceVersion="300")
    changed["spec"]["encoder"] = {**changed["spec"]["encoder"], "image": "vllm/vllm-openai:v0.34.0"}
    kube.stored[("EPDDeployment", NS, NAME)] = changed
    r.epd_event("MODIFIED", changed)
    assert await queued(r) == FULL
    assert await r.full_pass(KEY) == "success"
    assert conditions(kube.statuses()[-1])["SpecValid"]["reason"] == "RefusedByAPIServer"
    assert not waiting_for_encoders(kube)
    r.pod_event("MODIFIED", pod("encoder", new, ready=True, revision=310))
    assert await queued(r) == STATUS


async def test_consumers_brought_up_to_date_by_someone_else_end_the_hold():
    r, kube, _, new, after = await held_reconciler()
    owner = apply.owner_reference(after)
    for revision, obj in enumerate(render(parse_epd(spec_only(after))), start=400):  # the whole spec, as applied
        desired = apply.adopt(obj, owner)
        desired["metadata"].update(uid=f"uid-{obj['kind']}-{obj['metadata']['name']}", resourceVersion=str(revision))
        r.child_event("MODIFIED", desired)
    await queued(r)
    dry_runs = kube.dry_runs()
    assert await r.full_pass(KEY) == "success"
    assert kube.dry_runs() == dry_runs  # nothing left to apply
    assert not waiting_for_encoders(kube)
    r.pod_event("MODIFIED", pod("encoder", new, ready=True, revision=410))
    assert await queued(r) == STATUS


async def test_a_status_pass_over_a_spec_turned_invalid_reports_no_hold():
    # The spec changed while consumers were held; a status pass that reads it before the full pass runs.
    r, kube, _, _, _ = await held_reconciler()
    invalid = copy.deepcopy(kube.stored[("EPDDeployment", NS, NAME)])
    invalid["metadata"].update(generation=3, resourceVersion="500")
    invalid["spec"]["decode"] = {**invalid["spec"]["decode"], "replicas": -1}
    kube.stored[("EPDDeployment", NS, NAME)] = invalid
    r.epd_event("MODIFIED", invalid)
    assert await r.status_pass(KEY) == "invalid"
    assert not waiting_for_encoders(kube)
    assert kube.statuses()[-1]["phase"] == "Failed"


# ----------------------------------------------------------------------------- converging


def leftover(kind: str, name: str, api_version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "resourceVersion": "40",
            "labels": {INSTANCE_LABEL: NAME, "app.kubernetes.io/managed-by": "epd-operator"},
            "ownerReferences": [{"kind": "EPDDeployment", "name": NAME, "uid": UID}],
        },
    }


async def test_every_applied_and_pruned_object_is_logged_and_named_in_one_event_each(caplog):
    r, kube = reconciler()
    await queued(r)
    r.child_event("ADDED", leftover("ConfigMap", f"{NAME}-stale"))
    r.child_event("ADDED", leftover("Service", f"{NAME}-old"))
    with caplog.at_level(logging.INFO, logger="epd_operator.controller.reconciler"):
        assert await r.full_pass(KEY) == "success"
    applied = [c[1] for c in kube.calls if c[0] == "apply" and not c[4]]
    assert len(applied) > 2
    by_reason = {e["reason"]: e for e in events(kube)}
    steps = by_reason["Applied"]["message"].split("; ")
    assert [step.split(" ")[:2] for step in steps] == [[kind, name] for kind, name in applied]
    assert f"Deployment {NAME}-decode created" in steps
    pruned = by_reason["Pruned"]
    assert pruned["message"] == f"ConfigMap {NAME}-stale, Service {NAME}-old deleted (no longer in the spec)"
    assert (pruned["type"], pruned["reportingInstance"]) == ("Normal", "test")
    messages = caplog.messages
    assert [f"{NS}/{NAME}: {step}" for step in steps] == [m for m in messages if "pruning" not in m]
    assert [m for m in messages if "pruning" in m] == [
        f"{NS}/{NAME}: pruning ConfigMap {NAME}-stale",
        f"{NS}/{NAME}: pruning Service {NAME}-old",
    ]


async def test_an_autoscaler_pruned_with_the_autoscaling_it_served_leaves_the_status_at_once():
    body = body_of(NIXL_AUTOSCALED)
    r, kube = reconciler(body)
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    assert "autoscaling" in kube.statuses()[-1]["tiers"]["encoder"]
    fixed = copy.deepcopy(kube.stored[("EPDDeployment", NS, NAME)])
    fixed["metadata"].update(generation=2, resourceVersion="70")
    del fixed["spec"]["encoder"]["autoscaling"]
    fixed["spec"]["encoder"]["replicas"] = 2
    kube.stored[("EPDDeployment", NS, NAME)] = fixed
    r.epd_event("MODIFIED", fixed)
    assert await r.full_pass(KEY) == "success"
    assert [c[1:4] for c in kube.calls if c[0] == "delete"] == [("HorizontalPodAutoscaler", NS, f"{NAME}-encoder")]
    assert "autoscaling" not in kube.statuses()[-1]["tiers"]["encoder"]


# ----------------------------------------------------------------------------- the workers


async def test_a_pass_is_timed_from_its_start():
    r, _ = reconciler()
    await run_workers(r, lambda: sample(r, "epd_operator_reconciles_total", kind="full", result="success") == 1)
    took = sample(r, "epd_operator_reconcile_duration_seconds_sum", kind="full")
    assert took is not None and 0 <= took < 30
