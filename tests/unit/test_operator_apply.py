"""The operator's apply planning: what is written, and — as important — what is not."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from epd_operator.controller.apply import (
    APPLIED_HASH,
    HANDOVER_MANAGER,
    adopt,
    drift,
    needs_replicas_handover,
    owner_reference,
    plan,
    replicas_handover,
)
from epd_operator.kube import CHILD_RESOURCES, child_resource
from epd_operator.render import render
from tests.support.render_examples import example, example_files

EPD = {
    "apiVersion": "serving.epd.dev/v1alpha1",
    "kind": "EPDDeployment",
    "metadata": {"name": "vl", "namespace": "ns", "uid": "uid-1"},
}
OWNER = owner_reference(EPD)


def deployment(replicas: int | None = 2, image: str = "vllm:1") -> dict[str, Any]:
    container = {
        "name": "vllm",
        "image": image,
        "args": ["--a"],
        "resources": {"limits": {"cpu": "0.5", "nvidia.com/gpu": 1}},
    }
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "x"}},
        "template": {"spec": {"containers": [container]}},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vl-encoder", "namespace": "ns", "labels": {"serving.epd.dev/role": "encoder"}},
        "spec": spec,
    }


def live_copy(obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
    """What the API server would return: our object plus defaults and server metadata."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="child-uid", resourceVersion="7", **meta)
    if obj["kind"] == "Deployment":
        live["spec"]["strategy"] = {"type": "RollingUpdate"}
        container = live["spec"]["template"]["spec"]["containers"][0]
        container.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        container["resources"]["limits"] = {"cpu": "500m", "nvidia.com/gpu": "1"}
        live["status"] = {"replicas": 2}
    return live


def applied_by(*managers: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"manager": m, "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": fields} for m, fields in managers
    ]


def test_adopted_objects_are_owned_and_hashed():
    obj = adopt(deployment(), OWNER)
    assert obj["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "serving.epd.dev/v1alpha1",
            "kind": "EPDDeployment",
            "name": "vl",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert (
        adopt(deployment(), OWNER)["metadata"]["annotations"][APPLIED_HASH]
        == obj["metadata"]["annotations"][APPLIED_HASH]
    )
    assert (
        adopt(deployment(image="vllm:2"), OWNER)["metadata"]["annotations"][APPLIED_HASH]
        != obj["metadata"]["annotations"][APPLIED_HASH]
    )


def test_server_defaults_and_normalised_quantities_are_not_drift():
    desired = adopt(deployment(), OWNER)
    assert drift(desired, live_copy(desired)) == []


def test_zero_values_the_server_omits_are_not_drift():
    obj = deployment()
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container.update(
        env=[{"name": "EMPTY", "value": ""}], volumeMounts=[{"name": "v", "mountPath": "/v", "readOnly": False}]
    )
    obj["spec"]["template"]["spec"]["nodeSelector"] = {}
    desired = adopt(obj, OWNER)
    live = live_copy(desired)
    live_container = live["spec"]["template"]["spec"]["containers"][0]
    live_container["env"] = [{"name": "EMPTY"}]
    live_container["volumeMounts"] = [{"name": "v", "mountPath": "/v"}]
    del live["spec"]["template"]["spec"]["nodeSelector"]
    assert drift(desired, live) == []


def test_fields_added_by_others_are_not_drift():
    desired = adopt(deployment(), OWNER)
    live = live_copy(desired)
    live["metadata"]["labels"]["team"] = "a"
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"
    assert drift(desired, live) == []


def test_items_other_managers_add_to_keyed_lists_are_not_drift():
    # `kubectl set env` or a mesh's injected sidecar stay after our forced apply (server-side apply
    # merges keyed lists): judging them drift would re-apply on every resync, forever.
    obj = deployment()
    obj["spec"]["template"]["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    desired = adopt(obj, OWNER)
    live = live_copy(desired)
    spec = live["spec"]["template"]["spec"]
    spec["containers"][0]["env"].insert(0, {"name": "DEBUG", "value": "1"})
    spec["containers"].append({"name": "istio-proxy", "image": "proxy"})
    assert drift(desired, live) == []
    spec["containers"][0]["env"][1]["value"] = "2"  # our own item changed: drift, named by its key
    assert drift(desired, live) == ["spec.template.spec.containers[name=vllm].env[name=A].value"]
    spec["containers"].pop(0)  # our container is gone
    assert drift(desired, live) == ["spec.template.spec.containers[name=vllm]"]


@pytest.mark.parametrize(
    "edit, path",
    [
        (
            lambda o: o["spec"]["template"]["spec"]["containers"][0].update(image="other"),
            "spec.template.spec.containers[name=vllm].image",
        ),
        (
            lambda o: o["spec"]["template"]["spec"]["containers"][0]["args"].append("--b"),
            "spec.template.spec.containers[name=vllm].args",
        ),
        (lambda o: o["metadata"]["labels"].pop("serving.epd.dev/role"), "metadata.labels.serving.epd.dev/role"),
        (lambda o: o["metadata"].update(ownerReferences=[]), "metadata.ownerReferences"),
        (lambda o: o["spec"].update(replicas=5), "spec.replicas"),
    ],
)
def test_changes_to_what_we_apply_are_drift(edit, path):
    desired = adopt(deployment(), OWNER)
    live = live_copy(desired)
    edit(live)
    assert drift(desired, live) == [path]


def test_plan_creates_what_is_missing_and_leaves_what_matches_alone():
    desired = [adopt(deployment(), OWNER)]
    assert [(a.why, a.describe()) for a in plan(desired, [], "uid-1").applies] == [
        ("create", "Deployment vl-encoder created")
    ]
    assert not plan(desired, [live_copy(desired[0])], "uid-1")


def test_plan_updates_when_our_config_changed_even_if_only_a_field_was_dropped():
    old = adopt(deployment(), OWNER)
    new_obj = deployment()
    del new_obj["spec"]["template"]["spec"]["containers"][0]["args"]  # subset of live: only the hash tells
    new = adopt(new_obj, OWNER)
    assert drift(new, live_copy(old)) == [f"metadata.annotations.{APPLIED_HASH}"]
    assert [a.why for a in plan([new], [live_copy(old)], "uid-1").applies] == ["update"]


def test_plan_restores_drift_and_says_what_changed():
    desired = adopt(deployment(), OWNER)
    live = live_copy(desired)
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "other"
    [step] = plan([desired], [live], "uid-1").applies
    assert step.why == "drift"
    assert (
        step.describe()
        == "Deployment vl-encoder restored (spec.template.spec.containers[name=vllm].image had been changed)"
    )


def test_plan_prunes_only_our_own_children_that_are_no_longer_rendered():
    desired = [adopt(deployment(), OWNER)]
    ours = live_copy(
        adopt({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vl-prefill", "namespace": "ns"}}, OWNER)
    )
    foreign = live_copy(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "vl-other", "namespace": "ns", "ownerReferences": [{"uid": "someone"}]},
        }
    )
    todo = plan(desired, [live_copy(desired[0]), ours, foreign], "uid-1")
    assert [o["metadata"]["name"] for o in todo.prunes] == ["vl-prefill"]


def test_an_autoscaled_tier_never_gets_replicas_and_an_hpa_change_is_no_drift():
    desired = adopt(deployment(replicas=None), OWNER)
    live = live_copy(desired)
    live["spec"]["replicas"] = 7  # set by the HPA
    live["metadata"]["managedFields"] = applied_by(("epd-operator", {"f:spec": {"f:template": {}}}))
    assert not plan([desired], [live], "uid-1")


def test_replicas_are_handed_over_when_a_tier_becomes_autoscaled():
    before = adopt(deployment(replicas=3), OWNER)
    live = live_copy(before)
    live["metadata"]["managedFields"] = applied_by(("epd-operator", {"f:spec": {"f:replicas": {}, "f:template": {}}}))
    after = adopt(deployment(replicas=None), OWNER)
    [step] = plan([after], [live], "uid-1").applies
    assert step.why == "update"
    assert step.handover == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vl-encoder", "namespace": "ns"},
        "spec": {"replicas": 3},
    }
    assert replicas_handover(live)["spec"] == {"replicas": 3}


def test_no_handover_once_someone_else_manages_replicas():
    desired = adopt(deployment(replicas=None), OWNER)
    live = live_copy(adopt(deployment(replicas=None, image="old"), OWNER))
    live["spec"]["replicas"] = 4
    live["metadata"]["managedFields"] = applied_by(
        ("epd-operator", {"f:spec": {"f:template": {}}}), (HANDOVER_MANAGER, {"f:spec": {"f:replicas": {}}})
    )
    assert not needs_replicas_handover(desired, live)
    assert plan([desired], [live], "uid-1").applies[0].handover is None


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.name)
def test_every_rendered_kind_is_one_the_operator_can_apply_and_prune(path):
    for obj in render(example(path.name)):
        assert child_resource(obj) is CHILD_RESOURCES[obj["kind"]]


def test_unknown_kinds_are_refused_by_name():
    with pytest.raises(ValueError, match="does not manage batch/v1/Job"):
        child_resource({"apiVersion": "batch/v1", "kind": "Job"})
