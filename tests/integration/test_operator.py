"""The operator (in-process) on a REAL control plane: kube-apiserver, the Deployment, ReplicaSet,
HPA, EndpointSlice and garbage-collector controllers, kube-scheduler and kwok fake GPU nodes on
which the pods are scheduled and become Ready (tests/support/cluster.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from epd_operator.api.labels import GENERATION_LABEL as GENERATION
from epd_operator.api.validation import parse_epd
from epd_operator.controller.apply import HANDOVER_MANAGER
from epd_operator.controller.metrics import Metrics
from epd_operator.render.generation import compatibility_generation
from tests.support.cluster import KubeView, volumes
from tests.support.operator_run import (
    EPD_API,
    children,
    condition,
    create,
    deployed,
    deployment,
    epd,
    epd_doc,
    epd_path,
    events,
    full_passes,
    metric_value,
    observed,
    operator_in_process,
    patch_spec,
    phase,
    posted,
    resyncs,
    wait_until,
    writes,
)
from tests.support.render_examples import NIXL_AUTOSCALED

RESYNC = "0.3"


@pytest.fixture
def ns(kube: KubeView) -> KubeView:
    volumes(kube, "ec-cache", "models")
    return kube


@pytest.fixture
async def operator(ns: KubeView) -> AsyncIterator[Metrics]:
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC
    ) as metrics:
        yield metrics


def generations(kube: KubeView) -> dict[tuple[str, str], str]:
    """What changes when someone writes a child's spec: its generation where it has one (controllers
    write status all the time), else its resourceVersion."""
    return {
        k: str(o["metadata"].get("generation") or o["metadata"]["resourceVersion"]) for k, o in children(kube).items()
    }


async def test_create_makes_every_tier_owned_by_the_epddeployment(ns, operator):
    created = await create(ns, epd_doc())
    await deployed(ns, "vl-encoder", "vl-decode", "vl-router")
    await observed(ns, 1)

    objs = children(ns)
    assert {k for k in objs if k[0] == "Deployment"} == {
        ("Deployment", "vl-encoder"),
        ("Deployment", "vl-decode"),
        ("Deployment", "vl-router"),
    }
    assert ("Service", "vl") in objs and ("ConfigMap", "vl-transfer") in objs
    assert {k for k in objs if k[0] == "NetworkPolicy"} == {
        ("NetworkPolicy", "vl-backends"),
        ("NetworkPolicy", "vl-router"),
    }
    for key, obj in objs.items():
        refs = obj["metadata"]["ownerReferences"]
        assert refs == [
            {
                "apiVersion": EPD_API,
                "kind": "EPDDeployment",
                "name": "vl",
                "uid": created["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], key
        managers = {(m["manager"], m["operation"]) for m in obj["metadata"]["managedFields"]}
        assert ("epd-operator", "Apply") in managers, key

    status = epd(ns)["status"]
    assert status["topology"] == "E+PD"
    assert status["endpoint"] == f"http://vl.{ns.ns}.svc:8000"
    assert condition(epd(ns), "SpecValid")["status"] == "True"
    await posted(ns, "Normal", "Applied", "Deployment vl-encoder created")
    # No finalizer and no kopf bookkeeping on the user's object: deletion is left to owner references.
    meta = epd(ns)["metadata"]
    assert not meta.get("finalizers")
    assert not [a for a in meta.get("annotations", {}) if "kopf" in a]


async def test_pods_scheduled_on_gpu_nodes_make_it_ready_and_a_lost_pod_degrades_it(ns, operator):
    await create(ns, epd_doc())
    await phase(ns, "Ready", timeout=60)  # real pods, scheduled on the fake GPU nodes, Ready
    obj = epd(ns)
    assert condition(obj, "Ready")["status"] == "True" and condition(obj, "Progressing")["status"] == "False"
    assert obj["status"]["tiers"]["decode"] == {
        "replicas": 2,
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "availableReplicas": 2,
        "ready": "2/2",
    }
    assert await posted(ns, "Normal", "Ready") == "every tier has its pods ready"
    gpu_pods = [p for p in ns.pods(**{"serving.epd.dev/role": "decode"})]
    assert len(gpu_pods) == 2 and all(p["spec"]["nodeName"].startswith("gpu-node-") for p in gpu_pods)

    # A decode pod stops being ready.
    name = gpu_pods[0]["metadata"]["name"]
    ns.set_pod_ready(name, False)
    await phase(ns, "Degraded")
    degraded = condition(epd(ns), "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == (
        "True",
        "ReplicasUnavailable",
        "pods lost: decode 1/2",
    )
    await posted(ns, "Warning", "Degraded", "decode 1/2")

    ns.delete("v1", "Pod", name)  # its ReplicaSet replaces it, and the replacement becomes Ready
    await phase(ns, "Ready", timeout=60)


async def test_scaling_up_a_ready_tier_is_progressing_then_ready(ns, operator):
    doc = epd_doc()
    await create(ns, doc)
    await phase(ns, "Ready", timeout=60)
    await patch_spec(ns, {"decode": {**doc["spec"]["decode"], "replicas": 4}})
    await observed(ns, 2)
    seen = set()

    def settled() -> bool:
        seen.add(epd(ns)["status"]["phase"])
        return epd(ns)["status"]["tiers"]["decode"]["ready"] == "4/4" and epd(ns)["status"]["phase"] == "Ready"

    await wait_until(settled, 60, lambda: epd(ns)["status"])
    assert "Degraded" not in seen
    assert ("Warning", "Degraded") not in {(t, r) for t, r, _ in events(ns)}


async def test_a_tier_that_cannot_be_scheduled_says_which_and_why(ns, operator):
    doc = epd_doc()
    doc["spec"]["decode"]["resources"]["limits"]["nvidia.com/gpu"] = 64  # more than any node has
    await create(ns, doc)
    await wait_until(
        lambda: condition(epd(ns), "Ready").get("reason") == "Unschedulable", 60, lambda: epd(ns)["status"]
    )
    ready = condition(epd(ns), "Ready")
    assert "decode pods cannot be scheduled: 0/2 nodes are available" in ready["message"]
    assert "Insufficient nvidia.com/gpu" in ready["message"]
    assert "Insufficient nvidia.com/gpu" in epd(ns)["status"]["tiers"]["decode"]["message"]
    assert "message" not in epd(ns)["status"]["tiers"]["encoder"]
    await posted(ns, "Warning", "Unschedulable", "decode pods cannot be scheduled")


async def test_changing_one_tier_rolls_only_that_tier(ns, operator):
    doc = epd_doc()
    await create(ns, doc)
    await deployed(ns, "vl-encoder", "vl-decode", "vl-router")
    await observed(ns, 1)
    before = generations(ns)

    # (an image change is a new compatibility generation and rolls every vLLM tier: test_generation_rollout)
    encoder = {**doc["spec"]["encoder"], "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]}
    await patch_spec(ns, {"encoder": encoder})
    await observed(ns, 2)
    after = generations(ns)
    assert {k for k in before if before[k] != after[k]} == {("Deployment", "vl-encoder")}
    containers = deployment(ns, "vl-encoder")["spec"]["template"]["spec"]["containers"]
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in containers[0]["env"]

    decode = {**doc["spec"]["decode"], "extraArgs": ["--max-num-seqs", "64"]}
    await patch_spec(ns, {"decode": decode})
    await observed(ns, 3)
    again = generations(ns)
    assert {k for k in after if after[k] != again[k]} == {("Deployment", "vl-decode")}
    args = deployment(ns, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--max-num-seqs", "64"]


async def test_consumers_keep_their_generation_until_an_encoder_of_the_new_one_is_ready(ns, operator):
    doc = epd_doc()
    await create(ns, doc)
    await phase(ns, "Ready", timeout=60)
    old = compatibility_generation(parse_epd(doc))

    def template_generation(name: str) -> str:
        return str(deployment(ns, name)["spec"]["template"]["metadata"]["labels"][GENERATION])

    # A new encoder image (a new generation) whose pods cannot start: here no node fits them; on a real
    # node, an image that cannot be pulled is the same case.
    encoder = {**doc["spec"]["encoder"], "image": "vllm/vllm-openai:v0.33.1"}
    stuck = {**encoder, "resources": {**encoder["resources"], "limits": {"nvidia.com/gpu": 64}}}
    await patch_spec(ns, {"encoder": stuck})
    new = compatibility_generation(parse_epd({**doc, "spec": {**doc["spec"], "encoder": stuck}}))
    await observed(ns, 2)
    assert template_generation("vl-encoder") == new
    await wait_until(
        lambda: condition(epd(ns), "Progressing").get("reason") == "WaitingForEncoders", 30, lambda: epd(ns)["status"]
    )
    message = condition(epd(ns), "Progressing")["message"]
    assert message.startswith(
        f"decode (generation {old}) keep serving until an encoder pod of generation {new} is Ready"
    )
    assert "rolling out: encoder" in message
    await resyncs(operator, 5)  # full passes apply nothing to the decode tier meanwhile
    assert template_generation("vl-decode") == old
    assert epd(ns)["status"]["phase"] == "Progressing"

    # The new encoders fit: as soon as one is Ready, the decode tier follows.
    await patch_spec(ns, {"encoder": encoder})
    await wait_until(lambda: template_generation("vl-decode") == new, 60, lambda: epd(ns)["status"])
    await phase(ns, "Ready", timeout=60)
    assert condition(epd(ns), "Progressing")["reason"] == "RolloutComplete"


def status_passes(metrics: Metrics) -> float:
    return metric_value(metrics.exposition().decode(), "epd_operator_reconciles_total", kind="status")


async def test_while_consumers_are_held_only_the_awaited_encoder_turning_ready_costs_a_full_pass(ns: KubeView):
    """Watch events alone (the resync is an hour away): a held decode tier's and a never-ready encoder's
    events refresh the status without a full pass (no dry run per event), and the new encoder pod
    turning Ready moves the decode tier at once."""
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "3600") as m:
        doc = epd_doc()
        await create(ns, doc)
        await phase(ns, "Ready", timeout=60)
        encoder = {**doc["spec"]["encoder"], "image": "vllm/vllm-openai:v0.33.1"}
        stuck = {**encoder, "resources": {**encoder["resources"], "limits": {"nvidia.com/gpu": 64}}}
        await patch_spec(ns, {"encoder": stuck})
        new = compatibility_generation(parse_epd({**doc, "spec": {**doc["spec"], "encoder": stuck}}))
        await wait_until(
            lambda: condition(epd(ns), "Progressing").get("reason") == "WaitingForEncoders",
            30,
            lambda: epd(ns)["status"],
        )

        def waiting() -> list[str]:
            """The new generation's encoder pods (Pending: no node fits them)."""
            pods = ns.pods(**{"serving.epd.dev/role": "encoder"})
            return [p["metadata"]["name"] for p in pods if p["metadata"]["labels"].get(GENERATION) == new]

        await wait_until(waiting, 30, lambda: ns.pods())
        held = {p["metadata"]["name"] for p in ns.pods(**{"serving.epd.dev/role": "decode"})}
        assert held
        full = full_passes(m)
        # Pod and child events, one at a time, each seen by a status pass.
        for i, target in enumerate(
            [
                f"pod/{waiting()[0]}",
                *(f"pod/{name}" for name in sorted(held)),
                "deployment/vl-decode",
                "deployment/vl-encoder",
            ]
        ):
            passes = status_passes(m)
            ns.kubectl("annotate", "--overwrite", target, f"test.epd.dev/touch={i}")
            await wait_until(
                lambda passes=passes: status_passes(m) > passes, 20, f"no status pass after touching {target}"
            )
        assert full_passes(m) == full, "a watch event during the hold ran a full pass"
        assert condition(epd(ns), "Progressing")["reason"] == "WaitingForEncoders"

        # The new encoders fit: the spec change's own pass applies them; their pod's Ready event releases decode.
        await patch_spec(ns, {"encoder": encoder})
        await wait_until(
            lambda: deployment(ns, "vl-decode")["spec"]["template"]["metadata"]["labels"][GENERATION] == new,
            60,
            lambda: epd(ns)["status"],
        )
        await phase(ns, "Ready", timeout=60)


async def test_the_real_hpa_owns_replicas_and_the_operator_never_resets_them(ns, operator):
    doc = epd_doc(NIXL_AUTOSCALED)
    await create(ns, doc)
    await observed(ns, 1)
    dep = deployment(ns, "vl-encoder")
    # The operator leaves replicas to the HPA: it never applies the field (the server defaults it).
    assert (
        "f:replicas"
        not in next(m for m in dep["metadata"]["managedFields"] if m["manager"] == "epd-operator")["fieldsV1"]["f:spec"]
    )
    hpa = ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)

    # The HPA controller enforces minReplicas (the Deployment defaulted to 1 replica).
    await wait_until(
        lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 2,
        30,
        lambda: ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder").get("status"),
    )
    await wait_until(
        lambda: epd(ns)["status"]["tiers"]["encoder"].get("autoscaling", {}).get("desiredReplicas") == 2,
        30,
        lambda: epd(ns)["status"]["tiers"]["encoder"],
    )

    ns.kubectl("scale", "deployment/vl-encoder", "--replicas=5")  # a person (or the HPA) scales out
    await resyncs(operator)
    decode = {**doc["spec"]["decode"], "image": "vllm/vllm-openai:v0.33.1"}
    await patch_spec(ns, {"decode": decode})
    await observed(ns, 2)
    await resyncs(operator)
    dep = deployment(ns, "vl-encoder")
    assert dep["spec"]["replicas"] == 5
    owners = {
        m["manager"]
        for m in dep["metadata"]["managedFields"]
        if "f:replicas" in m.get("fieldsV1", {}).get("f:spec", {})
    }
    assert "epd-operator" not in owners

    ns.kubectl("scale", "deployment/vl-encoder", "--replicas=1")  # below minReplicas: the HPA restores it
    await wait_until(lambda: deployment(ns, "vl-encoder")["spec"]["replicas"] == 2, 30)
    await resyncs(operator)
    assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 2


async def test_a_tier_that_becomes_autoscaled_keeps_its_replicas(ns, operator):
    doc = epd_doc()
    doc["spec"]["encoder"]["replicas"] = 3
    await create(ns, doc)
    await deployed(ns, "vl-encoder")
    assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 3

    autoscaled = {
        **doc["spec"]["encoder"],
        "autoscaling": {
            "minReplicas": 2,
            "maxReplicas": 6,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 80}},
                }
            ],
        },
    }
    autoscaled.setdefault("resources", {}).setdefault("requests", {})["cpu"] = "4"
    await patch_spec(ns, {"encoder": autoscaled})
    await wait_until(lambda: ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder"), 20)
    await observed(ns, 2)
    dep = deployment(ns, "vl-encoder")
    # Server-side apply drops a field its only manager stops applying; the handover kept it.
    assert dep["spec"]["replicas"] == 3
    managers = {
        m["manager"] for m in dep["metadata"]["managedFields"] if "f:replicas" in m["fieldsV1"].get("f:spec", {})
    }
    assert HANDOVER_MANAGER in managers and "epd-operator" not in managers
    status = epd(ns)["status"]["tiers"]["encoder"]
    assert status["autoscaling"]["minReplicas"] == 2 and status["autoscaling"]["maxReplicas"] == 6
    await resyncs(operator)
    assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 3  # within [2, 6]: the HPA keeps it too

    await patch_spec(ns, {"encoder": {"autoscaling": None, "replicas": 4}})
    await wait_until(lambda: ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is None, 20)
    await wait_until(lambda: deployment(ns, "vl-encoder")["spec"]["replicas"] == 4, 20)  # the spec owns it again
    await posted(ns, "Normal", "Pruned", "HorizontalPodAutoscaler vl-encoder")


async def test_removing_the_prefill_tier_prunes_its_objects(ns, operator):
    await create(ns, epd_doc(NIXL_AUTOSCALED))
    await observed(ns, 1)
    prefill = {k for k, o in children(ns).items() if o["metadata"]["labels"].get("serving.epd.dev/role") == "prefill"}
    # the NetworkPolicy: what prefill accepts from decode for the KV transfer (`vl-prefill-transfer`)
    assert {kind for kind, _ in prefill} == {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"}
    # decode accepted prefill's KV transfer: that policy goes too (E+PD on shared storage opens no connection)
    gone = prefill | {("NetworkPolicy", "vl-decode-transfer")}
    kept = set(children(ns)) - gone

    await patch_spec(ns, {"prefill": None, "kvTransfer": None})
    await wait_until(lambda: not gone & set(children(ns)), 20, "prefill objects were not pruned")
    assert kept <= set(children(ns))
    await wait_until(lambda: epd(ns)["status"].get("topology") == "E+PD", 20)
    assert "prefill" not in epd(ns)["status"]["tiers"]
    await posted(ns, "Normal", "Pruned", "Deployment vl-prefill")
    await wait_until(lambda: not ns.pods(**{"serving.epd.dev/role": "prefill"}), 30, "prefill pods left behind")


async def test_drift_in_a_child_is_restored_on_resync(ns, operator):
    await create(ns, epd_doc())
    await deployed(ns, "vl-decode")
    await observed(ns, 1)
    await resyncs(operator, 1)
    original = deployment(ns, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["image"]
    mark = metric_value(
        operator.exposition().decode(), "epd_operator_api_writes_total", verb="PATCH", kind="Deployment"
    )

    ns.kubectl("label", "deployment/vl-decode", "serving.epd.dev/role=oops", "--overwrite")
    ns.kubectl("set", "image", "deployment/vl-decode", "vllm=someone/else:latest")
    await wait_until(
        lambda: deployment(ns, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["image"] == original,
        20,
        "the edited image was not restored",
    )
    await wait_until(lambda: deployment(ns, "vl-decode")["metadata"]["labels"]["serving.epd.dev/role"] == "decode", 20)
    await posted(ns, "Normal", "Applied", "Deployment vl-decode restored")
    restores = (
        metric_value(operator.exposition().decode(), "epd_operator_api_writes_total", verb="PATCH", kind="Deployment")
        - mark
    )
    assert 1 <= restores <= 2  # the edits may land in one resync or two; nothing else is rewritten


async def test_items_another_manager_adds_to_our_lists_are_kept_and_not_fought(ns, operator):
    await create(ns, epd_doc())
    await deployed(ns, "vl-decode")
    await observed(ns, 1)
    ns.kubectl("set", "env", "deployment/vl-decode", "-c", "vllm", "EXTRA_DEBUG=1")
    await resyncs(operator, 2)

    def applies() -> float:
        return metric_value(
            operator.exposition().decode(), "epd_operator_api_writes_total", verb="PATCH", kind="Deployment"
        )

    mark = applies()
    await resyncs(operator, 4)
    assert applies() == mark  # no endless re-apply
    env = deployment(ns, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "EXTRA_DEBUG", "value": "1"} in env


async def test_a_user_env_named_like_ours_replaces_ours_in_place(ns, operator):
    doc = epd_doc(NIXL_AUTOSCALED)
    doc["spec"]["decode"]["env"] = [{"name": "UCX_TLS", "value": "tcp"}, {"name": "MY_FLAG", "value": "x"}]
    await create(ns, doc)  # the real API server refuses duplicate keys in a server-side apply
    await observed(ns, 1)
    assert condition(epd(ns), "SpecValid")["status"] == "True", epd(ns)["status"]
    env = deployment(ns, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert len(names) == len(set(names)), names
    assert {"name": "UCX_TLS", "value": "tcp"} in env and {"name": "MY_FLAG", "value": "x"} in env


async def test_an_object_the_api_server_refuses_fails_the_spec_and_changes_nothing(ns, operator):
    doc = epd_doc()
    await create(ns, doc)
    await observed(ns, 1)
    before = generations(ns)
    bad = {**doc["spec"]["decode"], "nodeSelector": {"not a valid key!": "x"}}  # passes the CRD, not the Deployment
    await patch_spec(ns, {"decode": bad, "encoder": {**doc["spec"]["encoder"], "image": "vllm/vllm-openai:v9"}})
    await phase(ns, "Failed")
    spec_valid = condition(epd(ns), "SpecValid")
    assert (spec_valid["status"], spec_valid["reason"]) == ("False", "RefusedByAPIServer")
    assert spec_valid["message"].startswith('Deployment vl-decode: Deployment.apps "vl-decode" is invalid')
    assert "spec.template.spec.nodeSelector" in spec_valid["message"]
    await posted(ns, "Warning", "RefusedByAPIServer", "spec.template.spec.nodeSelector")
    assert generations(ns) == before  # not even the valid encoder change went out: nothing half-applied
    await resyncs(operator, 3)
    assert condition(epd(ns), "SpecValid")["reason"] == "RefusedByAPIServer"  # no flapping behind a stale status
    assert [r for t, r, _ in events(ns) if r == "RefusedByAPIServer"] == ["RefusedByAPIServer"]

    await patch_spec(ns, {"decode": {**doc["spec"]["decode"], "nodeSelector": None}})  # merge patch: None removes
    await wait_until(lambda: condition(epd(ns), "SpecValid").get("status") == "True", 30, lambda: epd(ns)["status"])
    assert deployment(ns, "vl-encoder")["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v9"


async def test_steady_state_issues_no_writes(ns, operator):
    await create(ns, epd_doc(NIXL_AUTOSCALED))
    # This cluster serves no custom metrics API, so the encoder HPA cannot read its load: the
    # deployment rests Degraded, which it says once (test_autoscaling_status.py).
    await phase(ns, "Degraded", timeout=60)
    await posted(ns, "Warning", "AutoscalingInactive")
    # At rest also means the real HPA controller has caught up (its status is part of ours).
    await wait_until(
        lambda: (
            epd(ns)["status"]["tiers"]["encoder"].get("autoscaling", {}).get("currentReplicas") == 2
            and epd(ns)["status"]["tiers"]["encoder"]["ready"] == "2/2"
        ),
        30,
        lambda: epd(ns)["status"]["tiers"]["encoder"],
    )
    await resyncs(operator, 2)
    mark, before = writes(operator), generations(ns)
    status_before = epd(ns)["status"]
    await resyncs(operator, 5)
    assert writes(operator) == mark, "\n".join(
        [
            str(status_before["tiers"]),
            str(epd(ns)["status"]["tiers"]),
            *[
                line
                for line in operator.exposition().decode().splitlines()
                if line.startswith("epd_operator_api_writes_total")
            ],
        ]
    )
    assert generations(ns) == before


async def test_a_restart_causes_no_churn(ns):
    args = ("--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC)
    async with operator_in_process(ns, *args):
        await create(ns, epd_doc())
        await phase(ns, "Ready", timeout=60)
        await posted(ns, "Normal", "Ready")
    before = generations(ns)
    rv = epd(ns)["metadata"]["resourceVersion"]
    async with operator_in_process(ns, *args) as metrics:
        await resyncs(metrics, 3)
        assert writes(metrics) == 0
    assert generations(ns) == before
    assert epd(ns)["metadata"]["resourceVersion"] == rv


async def test_deleting_the_epddeployment_collects_every_child_and_pod(ns, operator):
    await create(ns, epd_doc())
    await phase(ns, "Ready", timeout=60)
    assert len(children(ns)) == 15 and len(ns.pods(**{"app.kubernetes.io/instance": "vl"})) == 5
    ns.ok("DELETE", epd_path(ns))
    # The real garbage collector follows the owner references, down to ReplicaSets and Pods.
    await wait_until(lambda: not children(ns), 30, lambda: f"left behind: {sorted(children(ns))}")
    await wait_until(lambda: not ns.list("apps/v1", "ReplicaSet"), 30, "ReplicaSets left behind")
    await wait_until(
        lambda: not ns.pods(), 30, lambda: f"pods left behind: {[p['metadata']['name'] for p in ns.pods()]}"
    )
    assert ns.get(EPD_API, "EPDDeployment", "vl") is None


async def test_the_crd_refuses_a_cel_violation_with_its_field_path(ns):
    doc = epd_doc()
    doc["spec"]["kvTransfer"] = {"connector": "Nixl"}  # E+PD has no prefill to send KV from
    status, body = ns.request(
        "PATCH", f"{epd_path(ns)}?fieldManager=kubectl&force=true", doc, content_type="application/apply-patch+yaml"
    )
    assert status == 422, body
    [cause] = [c for c in body["details"]["causes"] if c["field"] == "spec.kvTransfer"]
    assert cause["reason"] == "FieldValueForbidden"
    assert "kvTransfer moves KV from prefill to decode" in cause["message"]
    assert ns.get(EPD_API, "EPDDeployment", "vl") is None


async def test_a_deleted_tier_is_recreated_at_once(ns):
    # A resync far away: only the deletion event can bring the tier back within the test.
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "3600"):
        await create(ns, epd_doc())
        await observed(ns, 1)
        old_uid = deployment(ns, "vl-decode")["metadata"]["uid"]
        ns.delete("apps/v1", "Deployment", "vl-decode")
        await wait_until(
            lambda: (
                (ns.get("apps/v1", "Deployment", "vl-decode") or {}).get("metadata", {}).get("uid")
                not in (None, old_uid)
            ),
            20,
            "the deleted decode Deployment was not recreated",
        )
        await wait_until(lambda: ("Normal", "Applied", "Deployment vl-decode created") in events(ns), 20)


GATEWAY = {
    "parentRefs": [{"name": "inference", "namespace": "gateways", "sectionName": "https"}],
    "hostnames": ["vl.example.com"],
}


@pytest.fixture
def httproutes(ns: KubeView) -> None:
    """The Gateway API's own HTTPRoute CRD, with its CEL rules: installed before the operator starts, as
    an optional kind must be for the operator to watch it from its start (controller/served_kinds.py)."""
    from tests.support.cluster import gateway_api_crd, install_crd

    install_crd(ns.cluster, gateway_api_crd("httproutes"))


async def test_a_gateway_route_is_applied_owned_and_pruned(ns, httproutes, operator):
    doc = epd_doc()
    doc["spec"]["router"]["gateway"] = GATEWAY
    created = await create(ns, doc)
    await observed(ns, 1)
    route = ns.get("gateway.networking.k8s.io/v1", "HTTPRoute", "vl")
    assert route is not None, epd(ns)["status"]
    assert route["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "vl"
    # Defaulted by the Gateway API's schema (the server's, not ours): the route was validated by it.
    assert route["spec"]["rules"][0]["backendRefs"][0]["weight"] == 1
    await posted(ns, "Normal", "Applied", "HTTPRoute vl created")

    await patch_spec(ns, {"router": {**doc["spec"]["router"], "gateway": None}})
    await wait_until(
        lambda: ns.get("gateway.networking.k8s.io/v1", "HTTPRoute", "vl") is None, 20, "the HTTPRoute was not pruned"
    )
    await posted(ns, "Normal", "Pruned", "HTTPRoute vl")
