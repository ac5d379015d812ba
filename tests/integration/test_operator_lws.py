"""Multi-node tiers on the real control plane, with LeaderWorkerSet's own CRD (sigs.k8s.io/lws, from its
Go module) installed: the API server validates every rendered LeaderWorkerSet against LWS's schema,
and the operator applies, owns, reports on and prunes them.

No LWS controller runs here (it would need its webhook and certificates): the group's pods are not
created. Its status is written the way that controller writes it (the status subresource), so the
operator's reading of a real LeaderWorkerSet object is what is tested.
"""

from __future__ import annotations

import pytest

from epd_operator.render import render
from tests.support.cluster import KubeView, install_crd, lws_crd, volumes
from tests.support.operator_run import (
    condition,
    create,
    epd,
    epd_doc,
    observed,
    operator_in_process,
    patch_spec,
    posted,
    wait_until,
)
from tests.support.render_examples import rendered_examples, variants

RESYNC = "0.3"
LWS_API = "leaderworkerset.x-k8s.io/v1"
MULTI_NODE_DECODE = {"nodesPerReplica": 2, "tensorParallelSize": 2, "replicas": 2}


@pytest.fixture
def ns(kube: KubeView) -> KubeView:
    install_crd(kube.cluster, lws_crd())  # cluster-scoped and idempotent: every test here may ask
    volumes(kube, "ec-cache", "models")
    return kube


def lws_path(kube: KubeView, name: str = "") -> str:
    return f"/apis/{LWS_API}/namespaces/{kube.ns}/leaderworkersets" + (f"/{name}" if name else "")


def test_the_api_server_accepts_every_rendered_leader_worker_set_strictly(ns):
    rendered = [*rendered_examples().values(), *(render(epd_) for epd_ in variants().values())]
    sets = [obj for objects in rendered for obj in objects if obj["kind"] == "LeaderWorkerSet"]
    assert len(sets) >= 2  # the variants (and the multi-node example)
    for obj in sets:
        body = {**obj, "metadata": {**obj["metadata"], "namespace": ns.ns}}
        # Strict: a field LWS's schema does not know is an error, not silently pruned.
        status, answer = ns.request(
            "PATCH",
            lws_path(ns, obj["metadata"]["name"]) + "?fieldManager=epd-tests&dryRun=All&fieldValidation=Strict",
            body,
            content_type="application/apply-patch+yaml",
        )
        assert status == 200, (obj["metadata"]["name"], answer)
        assert answer["spec"]["leaderWorkerTemplate"]["size"] == obj["spec"]["leaderWorkerTemplate"]["size"]


def test_the_api_server_refuses_a_leader_worker_set_lws_would_refuse(ns):
    obj = next(o for o in render(variants()["nixl-multi-node-decode-tp4-pp2"]) if o["kind"] == "LeaderWorkerSet")
    obj = {
        **obj,
        "metadata": {**obj["metadata"], "namespace": ns.ns},
        "spec": {**obj["spec"], "startupPolicy": "WhenReady"},
    }
    status, answer = ns.request(
        "PATCH",
        lws_path(ns, obj["metadata"]["name"]) + "?fieldManager=epd-tests&dryRun=All",
        obj,
        content_type="application/apply-patch+yaml",
    )
    assert status == 422 and "startupPolicy" in str(answer), answer


async def test_a_multi_node_tier_is_applied_owned_reported_and_pruned(ns):
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC):
        doc = epd_doc()
        doc["spec"]["decode"].update(MULTI_NODE_DECODE)
        created = await create(ns, doc)
        await observed(ns, 1)
        lws = ns.get(LWS_API, "LeaderWorkerSet", "vl-decode")
        assert lws is not None, epd(ns)["status"]
        assert lws["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert ns.get("apps/v1", "Deployment", "vl-decode") is None
        service = ns.get("v1", "Service", "vl-decode")
        assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
        await posted(ns, "Normal", "Applied", "LeaderWorkerSet vl-decode created")

        # What the LWS controller reports once both groups are up: the tier is ready.
        generation = lws["metadata"]["generation"]

        def said(type_: str, reason: str, message: str) -> list[dict]:
            other = "Progressing" if type_ == "Available" else "Available"
            stamp = {"observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z"}
            return [
                {"type": type_, "status": "True", "reason": reason, "message": message, **stamp},
                {"type": other, "status": "False", "reason": other, "message": "", **stamp},
            ]

        available = said("Available", "AllGroupsReady", "All replicas are ready")
        status = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "observedGeneration": generation}
        ns.ok("PATCH", lws_path(ns, "vl-decode") + "/status", {"status": {**status, "conditions": available}})
        await wait_until(
            lambda: epd(ns)["status"]["tiers"]["decode"]["ready"] == "2/2" and epd(ns)["status"]["phase"] == "Ready",
            20,
            lambda: f"decode tier not reported ready: {epd(ns)['status']}",
        )
        progressing = said("Progressing", "GroupsProgressing", "Replicas are progressing")
        ns.ok(
            "PATCH", lws_path(ns, "vl-decode") + "/status", {"status": {"readyReplicas": 1, "conditions": progressing}}
        )
        await wait_until(
            lambda: epd(ns)["status"]["tiers"]["decode"].get("reason") == "GroupsNotReady",
            20,
            lambda: f"a lost group not reported: {epd(ns)['status']['tiers']}",
        )
        decode = epd(ns)["status"]["tiers"]["decode"]
        assert decode["ready"] == "1/2"
        # No LWS controller here, so no group's pods: both groups are named.
        assert decode["message"] == "groups 0, 1 of 2 not ready (LeaderWorkerSet vl-decode: Replicas are progressing)"

        # Back to one node: the LeaderWorkerSet goes, a Deployment takes its place.
        await patch_spec(ns, {"decode": {**doc["spec"]["decode"], "nodesPerReplica": 1}})
        await observed(ns, 2)
        await wait_until(lambda: ns.get(LWS_API, "LeaderWorkerSet", "vl-decode") is None, 20, "the LWS was not pruned")
        assert ns.get("apps/v1", "Deployment", "vl-decode") is not None
        assert (
            "leaderworkerset.sigs.k8s.io/worker-index" not in ns.get("v1", "Service", "vl-decode")["spec"]["selector"]
        )
        assert condition(epd(ns), "SpecValid")["status"] == "True"
