"""The operator (kopf in-process) against the strict API emulator: the reconcile contract.

No kubelet or deployment controller runs here: tests report Deployment status themselves, and
scale through /scale as the HPA controller would.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from epd_operator.controller.apply import HANDOVER_MANAGER
from epd_operator.controller.metrics import Metrics
from tests.support.apiserver import StrictKubernetesEmulator
from tests.support.operator_run import (EPD_API, NS, api_request, children, condition, create, deployed, deployment,
                                        deployment_path, epd, epd_crd, epd_doc, events, metric_value, observed,
                                        operator_in_process, patch_spec, phase, posted, relaxed_epd_crd, resyncs,
                                        scale_deployment, set_deployment_ready, wait_until)
from tests.support.render_examples import NIXL_AUTOSCALED

RESYNC = "0.2"


@pytest.fixture
def cluster(apiserver: StrictKubernetesEmulator) -> StrictKubernetesEmulator:
    apiserver.create_object(epd_crd())
    return apiserver


@pytest.fixture
async def operator(cluster: StrictKubernetesEmulator, apiserver_url: str) -> AsyncIterator[Metrics]:
    async with operator_in_process(apiserver_url, "--namespace", NS, "--no-leader-election",
                                   "--resync-seconds", RESYNC) as metrics:
        yield metrics


async def test_create_makes_every_tier_owned_by_the_epddeployment(cluster, apiserver_url, operator):
    created = await create(apiserver_url, epd_doc())
    await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
    await observed(cluster, 1)

    objs = children(cluster)
    assert {k for k in objs if k[0] == "Deployment"} == {("Deployment", "vl-encoder"), ("Deployment", "vl-decode"),
                                                          ("Deployment", "vl-router")}
    assert ("Service", "vl") in objs and ("ConfigMap", "vl-transfer") in objs
    for key, obj in objs.items():
        refs = obj["metadata"]["ownerReferences"]
        assert refs == [{"apiVersion": EPD_API, "kind": "EPDDeployment", "name": "vl", "uid": created["metadata"]["uid"],
                         "controller": True, "blockOwnerDeletion": True}], key
        managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
        assert ("epd-operator", "Apply") in managers, key

    status = epd(cluster)["status"]
    assert status["topology"] == "E+PD" and status["phase"] == "Progressing"
    assert status["endpoint"] == "http://vl.default.svc:8000"
    assert status["tiers"]["decode"]["ready"] == "0/2"
    assert condition(epd(cluster), "SpecValid")["status"] == "True"
    await posted(cluster, "Normal", "Applied", "Deployment vl-encoder created")
    # No finalizer and no kopf bookkeeping on the user's object: deletion is left to owner references.
    meta = epd(cluster)["metadata"]
    assert not meta.get("finalizers")
    assert not [a for a in meta.get("annotations", {}) if "kopf" in a]


async def test_status_follows_the_readiness_of_the_children(cluster, apiserver_url, operator):
    await create(apiserver_url, epd_doc())
    await observed(cluster, 1)
    for name in ("vl-encoder", "vl-decode"):
        await set_deployment_ready(apiserver_url, NS, name)
    await wait_until(lambda: epd(cluster)["status"]["tiers"]["decode"]["ready"] == "2/2", 10)
    assert epd(cluster)["status"]["phase"] == "Progressing"  # the router is not ready yet
    assert "router 0/2" in condition(epd(cluster), "Ready")["message"]

    await set_deployment_ready(apiserver_url, NS, "vl-router")
    await phase(cluster, "Ready")
    obj = epd(cluster)
    assert condition(obj, "Ready")["status"] == "True" and condition(obj, "Progressing")["status"] == "False"
    assert obj["status"]["tiers"]["router"] == {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2,
                                                "availableReplicas": 2, "ready": "2/2"}
    assert await posted(cluster, "Normal", "Ready") == "every tier has its pods ready"

    await set_deployment_ready(apiserver_url, NS, "vl-decode", ready=1)  # a decode pod died
    await phase(cluster, "Degraded")
    degraded = condition(epd(cluster), "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ReplicasUnavailable"
    assert "decode 1/2" in degraded["message"]
    await posted(cluster, "Warning", "Degraded", "decode 1/2")

    await set_deployment_ready(apiserver_url, NS, "vl-decode")
    await phase(cluster, "Ready")


async def test_a_stuck_rollout_is_degraded(cluster, apiserver_url, operator):
    await create(apiserver_url, epd_doc())
    await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
    for name in ("vl-decode", "vl-router"):
        await set_deployment_ready(apiserver_url, NS, name)
    await set_deployment_ready(apiserver_url, NS, "vl-encoder", ready=0, conditions=[
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}])
    await phase(cluster, "Degraded")
    assert condition(epd(cluster), "Degraded")["reason"] == "ProgressDeadlineExceeded"


async def test_changing_one_tier_rolls_only_that_tier(cluster, apiserver_url, operator):
    doc = epd_doc()
    await create(apiserver_url, doc)
    await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
    await observed(cluster, 1)
    before = {k: o["metadata"]["resourceVersion"] for k, o in children(cluster).items()}

    encoder = {**doc["spec"]["encoder"], "image": "vllm/vllm-openai:v0.33.1"}
    await patch_spec(apiserver_url, {"encoder": encoder})
    await observed(cluster, 2)
    after = {k: o["metadata"]["resourceVersion"] for k, o in children(cluster).items()}
    assert {k for k in before if before[k] != after[k]} == {("Deployment", "vl-encoder")}
    containers = deployment(cluster, "vl-encoder")["spec"]["template"]["spec"]["containers"]
    assert containers[0]["image"] == "vllm/vllm-openai:v0.33.1"

    decode = {**doc["spec"]["decode"], "extraArgs": ["--max-num-seqs", "64"]}
    await patch_spec(apiserver_url, {"decode": decode})
    await observed(cluster, 3)
    again = {k: o["metadata"]["resourceVersion"] for k, o in children(cluster).items()}
    assert {k for k in after if after[k] != again[k]} == {("Deployment", "vl-decode")}
    args = deployment(cluster, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--max-num-seqs", "64"]


async def test_replicas_set_by_the_hpa_survive_reconciles(cluster, apiserver_url, operator):
    doc = epd_doc(NIXL_AUTOSCALED)
    await create(apiserver_url, doc)
    await observed(cluster, 1)
    assert "replicas" not in deployment(cluster, "vl-encoder")["spec"]  # the operator leaves it to the HPA
    assert cluster.get_object("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder", NS)["spec"]["maxReplicas"] == 8

    await scale_deployment(apiserver_url, NS, "vl-encoder", 5)  # the HPA scales out, and says so
    status, body = await api_request(
        apiserver_url, "PATCH", f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/vl-encoder/status",
        {"status": {"desiredReplicas": 5, "currentReplicas": 2}}, manager="kube-controller-manager")
    assert status == 200, body
    await wait_until(lambda: epd(cluster)["status"]["tiers"]["encoder"].get("autoscaling", {}).get("desiredReplicas") == 5,
                     10, lambda: epd(cluster)["status"]["tiers"]["encoder"])
    assert epd(cluster)["status"]["tiers"]["encoder"]["ready"] == "0/5"
    mark = cluster.mark()
    await resyncs(operator)
    decode = {**doc["spec"]["decode"], "image": "vllm/vllm-openai:v0.33.1"}
    await patch_spec(apiserver_url, {"decode": decode})
    await observed(cluster, 2)
    await resyncs(operator)
    assert deployment(cluster, "vl-encoder")["spec"]["replicas"] == 5
    assert cluster.writes(mark, path_contains="/deployments/vl-encoder") == []

    await scale_deployment(apiserver_url, NS, "vl-encoder", 3, manager="kubectl")  # by hand: not reverted either
    await resyncs(operator)
    assert deployment(cluster, "vl-encoder")["spec"]["replicas"] == 3


async def test_a_tier_that_becomes_autoscaled_keeps_its_replicas(cluster, apiserver_url, operator):
    doc = epd_doc()
    doc["spec"]["encoder"]["replicas"] = 3
    await create(apiserver_url, doc)
    await deployed(cluster, "vl-encoder")
    assert deployment(cluster, "vl-encoder")["spec"]["replicas"] == 3

    autoscaled = {**doc["spec"]["encoder"], "autoscaling": {"minReplicas": 2, "maxReplicas": 6}}
    await patch_spec(apiserver_url, {"encoder": autoscaled})
    await wait_until(lambda: cluster.get_object("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder", NS), 10)
    await observed(cluster, 2)
    dep = deployment(cluster, "vl-encoder")
    # Server-side apply drops a field its only manager stops applying; the handover kept it.
    assert dep["spec"]["replicas"] == 3
    managers = {m["manager"] for m in dep["metadata"]["managedFields"] if "f:replicas" in m["fieldsV1"].get("f:spec", {})}
    assert managers == {HANDOVER_MANAGER}
    status = epd(cluster)["status"]["tiers"]["encoder"]
    assert status["autoscaling"]["minReplicas"] == 2 and status["autoscaling"]["maxReplicas"] == 6

    await scale_deployment(apiserver_url, NS, "vl-encoder", 6)
    await resyncs(operator)
    assert deployment(cluster, "vl-encoder")["spec"]["replicas"] == 6

    await patch_spec(apiserver_url, {"encoder": {"autoscaling": None, "replicas": 4}})
    await wait_until(lambda: cluster.get_object("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder", NS) is None, 10)
    await wait_until(lambda: deployment(cluster, "vl-encoder")["spec"]["replicas"] == 4, 10)  # the spec owns it again
    await posted(cluster, "Normal", "Pruned", "HorizontalPodAutoscaler vl-encoder")


async def test_removing_the_prefill_tier_prunes_its_objects(cluster, apiserver_url, operator):
    await create(apiserver_url, epd_doc(NIXL_AUTOSCALED))
    await observed(cluster, 1)
    prefill = {k for k, o in children(cluster).items() if o["metadata"]["labels"].get("serving.epd.dev/role") == "prefill"}
    assert {kind for kind, _ in prefill} == {"Deployment", "Service", "PodDisruptionBudget"}
    kept = set(children(cluster)) - prefill

    await patch_spec(apiserver_url, {"prefill": None, "kvTransfer": None})
    await wait_until(lambda: not prefill & set(children(cluster)), 10, "prefill objects were not pruned")
    assert kept <= set(children(cluster))
    await wait_until(lambda: epd(cluster)["status"].get("topology") == "E+PD", 10)
    assert "prefill" not in epd(cluster)["status"]["tiers"]
    await posted(cluster, "Normal", "Pruned", "Deployment vl-prefill")


async def test_drift_in_a_child_is_restored_on_resync(cluster, apiserver_url, operator):
    await create(apiserver_url, epd_doc())
    await deployed(cluster, "vl-decode")
    await observed(cluster, 1)
    original = deployment(cluster, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["image"]

    status, body = await api_request(apiserver_url, "PATCH", deployment_path(NS, "vl-decode"), {
        "metadata": {"labels": {"serving.epd.dev/role": "oops"}},
        "spec": {"template": {"spec": {"containers": [{"name": "vllm", "image": "someone/else:latest"}]}}}},
        content_type="application/strategic-merge-patch+json", manager="kubectl-edit")
    assert status == 200, body
    mark = cluster.mark()
    await wait_until(lambda: deployment(cluster, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["image"] == original,
                     10, "the edited image was not restored")
    assert deployment(cluster, "vl-decode")["metadata"]["labels"]["serving.epd.dev/role"] == "decode"
    await posted(cluster, "Normal", "Applied", "Deployment vl-decode restored")
    # Only what drifted was written again (plus the Event saying so).
    assert {(w.method, w.path) for w in cluster.writes(mark)} == {
        ("PATCH", deployment_path(NS, "vl-decode")), ("POST", f"/api/v1/namespaces/{NS}/events")}


async def test_steady_state_issues_no_writes(cluster, apiserver_url, operator):
    await create(apiserver_url, epd_doc(NIXL_AUTOSCALED))
    await deployed(cluster, "vl-encoder", "vl-prefill", "vl-decode", "vl-router")
    for name in ("vl-encoder", "vl-prefill", "vl-decode", "vl-router"):
        await set_deployment_ready(apiserver_url, NS, name)
    await phase(cluster, "Ready")
    await posted(cluster, "Normal", "Ready")
    mark = cluster.mark()
    await resyncs(operator, 5)
    assert cluster.writes(mark) == []


async def test_a_restart_causes_no_churn(cluster, apiserver_url):
    args = ("--namespace", NS, "--no-leader-election", "--resync-seconds", RESYNC)
    async with operator_in_process(apiserver_url, *args):
        await create(apiserver_url, epd_doc())
        await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
        for name in ("vl-encoder", "vl-decode", "vl-router"):
            await set_deployment_ready(apiserver_url, NS, name)
        await phase(cluster, "Ready")
        await posted(cluster, "Normal", "Ready")
    mark = cluster.mark()
    async with operator_in_process(apiserver_url, *args) as metrics:
        await resyncs(metrics, 3)
    assert cluster.writes(mark) == []


async def test_deleting_the_epddeployment_collects_its_children(cluster, apiserver_url, operator):
    await create(apiserver_url, epd_doc())
    await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
    await wait_until(lambda: len(children(cluster)) == 13, 10)
    status, body = await api_request(apiserver_url, "DELETE", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/vl")
    assert status == 200, body
    await wait_until(lambda: not children(cluster), 10, lambda: f"left behind: {sorted(children(cluster))}")
    assert cluster.get_object(EPD_API, "EPDDeployment", "vl", NS) is None


async def test_failed_writes_are_retried_and_reported(cluster, apiserver_url, operator):
    cluster.inject_failure("PATCH", r"/deployments/vl-decode$", code=500, times=2)
    await create(apiserver_url, epd_doc())
    await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
    assert metric_value(operator.exposition().decode(), "epd_operator_reconcile_errors_total") >= 1
    await posted(cluster, "Warning", "ReconcileFailed", "injected failure")


# ----------------------------------------------------------------------------- refused specs


@pytest.fixture
def stale_crd_cluster(apiserver: StrictKubernetesEmulator) -> StrictKubernetesEmulator:
    apiserver.create_object(relaxed_epd_crd())
    return apiserver


async def test_a_refused_spec_is_reported_and_nothing_is_created(stale_crd_cluster, apiserver_url):
    cluster = stale_crd_cluster
    async with operator_in_process(apiserver_url, "--namespace", NS, "--no-leader-election", "--resync-seconds", RESYNC):
        doc = epd_doc()
        doc["spec"]["kvTransfer"] = {"connector": "Nixl"}  # KV transfer needs a prefill tier
        mark = cluster.mark()
        await create(apiserver_url, doc)
        await phase(cluster, "Failed")
        spec_valid = condition(epd(cluster), "SpecValid")
        assert spec_valid["status"] == "False" and spec_valid["reason"] == "InvalidSpec"
        assert spec_valid["message"].startswith("spec.kvTransfer: kvTransfer moves KV from prefill to decode")
        await posted(cluster, "Warning", "InvalidSpec")
        warnings = [m for t, r, m in events(cluster) if (t, r) == ("Warning", "InvalidSpec")]
        assert len(warnings) == 1 and "spec.kvTransfer" in warnings[0]
        assert children(cluster) == {}
        writes = {(w.method, w.path.rsplit("/", 1)[-1]) for w in cluster.writes(mark)}
        assert writes == {("POST", "epddeployments"), ("PATCH", "status"), ("POST", "events")}

        await patch_spec(apiserver_url, {"kvTransfer": None})
        await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
        await wait_until(lambda: condition(epd(cluster), "SpecValid").get("status") == "True", 10)


async def test_a_refused_update_changes_nothing(stale_crd_cluster, apiserver_url):
    cluster = stale_crd_cluster
    async with operator_in_process(apiserver_url, "--namespace", NS, "--no-leader-election", "--resync-seconds", RESYNC):
        await create(apiserver_url, epd_doc())
        await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
        await observed(cluster, 1)
        before = {k: o["metadata"]["resourceVersion"] for k, o in children(cluster).items()}
        await patch_spec(apiserver_url, {"router": {"encoderPolicy": "random"}})
        await phase(cluster, "Failed")
        assert "spec.router.encoderPolicy" in condition(epd(cluster), "SpecValid")["message"]
        assert epd(cluster)["status"]["observedGeneration"] == 2
        assert {k: o["metadata"]["resourceVersion"] for k, o in children(cluster).items()} == before


async def test_the_crd_refuses_a_cel_violation_at_apply(cluster, apiserver_url):
    doc = epd_doc()
    doc["spec"]["kvTransfer"] = {"connector": "Nixl"}  # E+PD has no prefill to send KV from
    status, body = await api_request(
        apiserver_url, "PATCH", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/vl?fieldManager=kubectl&force=true",
        doc, content_type="application/apply-patch+yaml")
    assert status == 422, body
    assert "kvTransfer moves KV from prefill to decode" in body["message"]
    assert cluster.get_object(EPD_API, "EPDDeployment", "vl", NS) is None


async def test_a_deleted_tier_is_recreated_at_once(cluster, apiserver_url):
    # A resync far away: only the deletion event can bring the tier back within the test.
    async with operator_in_process(apiserver_url, "--namespace", NS, "--no-leader-election", "--resync-seconds", "3600"):
        await create(apiserver_url, epd_doc())
        await observed(cluster, 1)
        old_uid = deployment(cluster, "vl-decode")["metadata"]["uid"]
        cluster.delete_object("apps/v1", "Deployment", "vl-decode", NS)
        await wait_until(lambda: (deployment(cluster, "vl-decode") or {}).get("metadata", {}).get("uid") not in (None, old_uid),
                         10, "the deleted decode Deployment was not recreated")
        await wait_until(lambda: ("Normal", "Applied", "Deployment vl-decode created") in events(cluster), 10)
