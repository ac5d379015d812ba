"""controller/apply: what the plan writes and, as important, what it does not (drift, adoption, pruning,
replicas handed over to an HPA, on the examples' rendered objects); the writes `execute` makes and in what
order, the dry run's verdicts, the plan's reasons and descriptions. Every expected value is written out by hand."""

from __future__ import annotations

import asyncio
import copy
from decimal import Decimal
from typing import Any

import pytest

from epd_operator.controller.apply import (
    APPLIED_HASH,
    HANDOVER_MANAGER,
    REFUSED_WHEN_WRITTEN,
    Apply,
    ApplyRefused,
    Plan,
    _drift,
    _gone,
    _same_scalar,
    admission_denial,
    adopt,
    applied_hash,
    drift,
    execute,
    is_owned_by,
    key_of,
    manages_replicas,
    needs_replicas_handover,
    owner_reference,
    plan,
    refusal,
    refused_by_server,
    replaced_autoscaler,
    replicas_handover,
    scale_target,
    wake_for_hpa,
)
from epd_operator.kube import CHILD_RESOURCES, ApiError, child_resource
from epd_operator.render import render
from tests.support.recording_kube import RecordingKube, as_kube
from tests.support.render_examples import example, example_files, variants

VARIANTS = variants()

OWNER = owner_reference({"metadata": {"name": "vl", "uid": "uid-1"}})


def obj(kind: str = "Service", name: str = "vl-router", api: str = "v1", **spec) -> dict:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def dep(name: str = "vl-encoder", replicas: int | None = 2) -> dict:
    return obj("Deployment", name, "apps/v1", **({"replicas": replicas} if replicas is not None else {}))


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


def test_owner_reference_is_the_controlling_owner():
    # called here, not only at import: a mutant is switched on only while a test runs
    assert owner_reference({"metadata": {"name": "vl", "uid": "uid-1"}}) == {
        "apiVersion": "serving.epd.dev/v1alpha1",
        "kind": "EPDDeployment",
        "name": "vl",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_applied_hash_is_20_hex_of_the_canonical_json():
    # `printf '%s' '{"a":1,"b":[2]}' | sha256sum | cut -c1-20`: sorted keys, no spaces
    assert applied_hash({"b": [2], "a": 1}) == "0855bfc20eb6cfaa4be7"
    assert applied_hash({"a": 1}) == "015abd7f5cc57a2dd94b"


def test_adopt_leaves_the_rendered_object_alone():
    rendered = obj(ports=[{"port": 80}])
    before = copy.deepcopy(rendered)
    adopted = adopt(rendered, OWNER)
    assert rendered == before
    assert adopted["metadata"]["ownerReferences"] == [OWNER]
    # the hash covers the owner too: the same object for another owner is another apply
    other = adopt(rendered, {**OWNER, "uid": "uid-2"})
    assert other["metadata"]["annotations"][APPLIED_HASH] != adopted["metadata"]["annotations"][APPLIED_HASH]


def test_is_owned_by_reads_every_reference():
    refs = {"metadata": {"ownerReferences": [{"uid": "a"}, {"uid": "b"}]}}
    assert is_owned_by(refs, "b") and not is_owned_by(refs, "c")
    assert not is_owned_by({"metadata": {"ownerReferences": None}}, "a")
    assert not is_owned_by({}, "a")


@pytest.mark.parametrize(
    "want,have,same",
    [
        (1, 1, True),
        ("a", "a", True),
        (1, "1", True),
        ("1", 1, True),
        ("0.5", "500m", True),
        ("1Gi", "1024Mi", True),
        (1, 1.0, True),
        (True, True, True),
        (True, 1, False),
        (1, True, False),
        (False, 0, False),
        ("a", "b", False),
        ("x1", "y1", False),
        (2, "3", False),
        (None, None, True),
        ([1], [1], True),
        ({"a": 1}, "x", False),
        (True, "True", False),
        ("True", True, False),
        (None, "None", False),
        ("x", "None", False),
        ("None", "y", False),
    ],
)
def test_same_scalar(want, have, same):
    assert _same_scalar(want, have) is same


@pytest.mark.parametrize(
    "desired,live,paths",
    [
        ({"spec": {"a": {"b": 1}}}, {"spec": {"a": "flat"}}, ["spec.a"]),
        ({"spec": {"a": {}}}, {"spec": {}}, []),  # an empty map the server omits
        ({"spec": {"a": {}}}, {"spec": {"a": 3}}, ["spec.a"]),
        ({"spec": {"l": [1, 2]}}, {"spec": {"l": [1]}}, ["spec.l"]),
        ({"spec": {"l": [1, 2]}}, {"spec": {"l": [1, 3]}}, ["spec.l[1]"]),
        ({"spec": {"l": [1]}}, {"spec": {"l": "x"}}, ["spec.l"]),
        ({"spec": {"l": []}}, {"spec": {}}, []),
        ({"spec": {"l": [1]}}, {"spec": {}}, ["spec.l"]),
        ({"spec": {"flag": False, "n": 0, "s": ""}}, {"spec": {}}, []),  # omitempty zero values
        ({"spec": {"flag": True}}, {"spec": {}}, ["spec.flag"]),
        ({"spec": {"flag": False}}, {"spec": {"flag": True}}, ["spec.flag"]),  # a boolean drifted on the live object
        ({"spec": {"x": None}}, {"spec": {"x": 5}}, []),
        (
            {"spec": {"ports": [{"port": 80, "name": "a"}, {"port": 81, "name": "b"}]}},
            {"spec": {"ports": [{"port": 81, "name": "b"}, {"port": 80, "name": "a"}, {"port": 9, "name": "mesh"}]}},
            [],
        ),
        (
            {"spec": {"ports": [{"port": 80, "name": "a"}]}},
            {"spec": {"ports": [{"port": 80, "name": "z"}]}},
            ["spec.ports[name=a]"],
        ),
        (
            {"spec": {"env": [{"name": "A", "value": "1"}]}},
            {"spec": {"env": [{"name": "A", "value": "2"}]}},
            ["spec.env[name=A].value"],
        ),
        # no key unique to every item: compared by position
        (
            {"spec": {"m": [{"name": "a", "v": 1}, {"name": "a", "v": 2}]}},
            {"spec": {"m": [{"name": "a", "v": 1}, {"name": "a", "v": 3}]}},
            ["spec.m[1].v"],
        ),
        ({"spec": {"m": [{"mountPath": "/a"}]}}, {"spec": {"m": [{"mountPath": "/b"}]}}, ["spec.m[mountPath=/a]"]),
        ({"spec": {"m": [{"containerPort": 1}]}}, {"spec": {"m": [{"containerPort": 2}]}}, ["spec.m[containerPort=1]"]),
        ({"spec": {"m": [{"name": "a"}]}}, {"spec": {"m": ["not-a-map", {"name": "a"}]}}, []),
    ],
)
def test_drift_paths(desired, live, paths):
    base = {"apiVersion": "v1", "kind": "X", "metadata": {}}
    assert drift({**base, **desired}, {**base, **live}) == paths


def test_drift_in_labels_annotations_and_owner_and_a_whole_missing_spec():
    desired = {
        "kind": "X",
        "metadata": {"labels": {"a": "1"}, "annotations": {"b": "2"}, "ownerReferences": [OWNER]},
        "spec": {"k": {"x": 1}},
        "status": {"ignored": True},
    }
    live = {"kind": "Y", "apiVersion": "other", "metadata": {"labels": {"a": "2"}}}
    assert drift(desired, live) == ["metadata.labels.a", "metadata.annotations.b", "metadata.ownerReferences", "spec"]


def test_manages_replicas_only_for_our_apply_entry_owning_replicas():
    ours = {"manager": "epd-operator", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    assert manages_replicas({"metadata": {}}) is True
    assert manages_replicas({"metadata": {"managedFields": [ours]}}) is True
    assert manages_replicas({"metadata": {"managedFields": [ours]}}, manager="someone") is False
    assert manages_replicas({"metadata": {"managedFields": [{**ours, "operation": "Update"}]}}) is False
    assert (
        manages_replicas({"metadata": {"managedFields": [{**ours, "fieldsV1": {"f:spec": {"f:template": {}}}}]}})
        is False
    )
    assert manages_replicas({"metadata": {"managedFields": [{**ours, "fieldsV1": None}]}}) is False
    assert manages_replicas({"metadata": {"managedFields": []}}) is False


def test_handover_only_for_a_deployment_that_stops_applying_replicas():
    live = {**dep(replicas=3), "metadata": {"name": "vl-encoder", "namespace": "ns"}}
    assert needs_replicas_handover(dep(replicas=None), live) is True
    assert needs_replicas_handover(dep(replicas=None), None) is False
    assert needs_replicas_handover(dep(replicas=2), live) is False
    assert needs_replicas_handover(dep(replicas=None), {**live, "spec": {}}) is False
    assert needs_replicas_handover({**obj("StatefulSet"), "spec": {}}, {**live, "kind": "StatefulSet"}) is False
    assert replicas_handover(live) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vl-encoder", "namespace": "ns"},
        "spec": {"replicas": 3},
    }


def test_plan_reasons_and_descriptions():
    svc, cm, gone = (
        adopt(obj("Service", "a"), OWNER),
        adopt(obj("ConfigMap", "b"), OWNER),
        adopt(obj("Secret", "c"), OWNER),
    )
    changed = adopt(obj("Service", "a", type="NodePort"), OWNER)
    live_cm = copy.deepcopy(cm)
    live_cm["metadata"]["labels"] = {"x": "y"}
    live_cm["spec"] = {"edited": True}
    cm["spec"] = {"edited": False, "a": 1, "b": 2, "c": 3}
    live_cm["spec"].update(a=9, b=9, c=9)
    todo = plan(
        [changed, cm, adopt(obj("Service", "new"), OWNER)], [svc, live_cm, gone, obj("Secret", "foreign")], "uid-1"
    )
    assert [(a.why, key_of(a.desired)) for a in todo.applies] == [
        ("update", ("Service", "a")),
        ("drift", ("ConfigMap", "b")),
        ("create", ("Service", "new")),
    ]
    assert todo.applies[1].drifted == ("spec.edited", "spec.a", "spec.b", "spec.c")
    assert [a.describe() for a in todo.applies] == [
        "Service a updated",
        "ConfigMap b restored (spec.edited, spec.a, spec.b had been changed)",
        "Service new created",
    ]
    assert todo.prunes == [gone]
    assert bool(todo) is True
    assert bool(Plan([], [])) is False and bool(Plan([], [gone])) is True


def test_plan_at_rest_is_empty():
    svc = adopt(obj("Service", "a"), OWNER)
    assert plan([svc], [copy.deepcopy(svc)], "uid-1") == Plan([], [])


def test_plan_hands_replicas_over_on_update_and_drift_not_on_create():
    live = adopt(dep(replicas=3), OWNER)
    autoscaled = adopt(dep(replicas=None), OWNER)
    (step,) = plan([autoscaled], [live], "uid-1").applies
    assert step.why == "update"
    assert step.handover == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vl-encoder", "namespace": "ns"},
        "spec": {"replicas": 3},
    }
    drifted_live = copy.deepcopy(autoscaled)
    drifted_live["spec"] = {"replicas": 3}
    drifted_live["metadata"]["labels"] = {"edited": "yes"}
    autoscaled["metadata"]["labels"] = {"edited": "no"}
    autoscaled["metadata"]["annotations"][APPLIED_HASH] = drifted_live["metadata"]["annotations"][APPLIED_HASH]
    (step,) = plan([autoscaled], [drifted_live], "uid-1").applies
    assert step.handover is not None
    assert (step.why, step.handover["spec"]) == ("drift", {"replicas": 3})
    (step,) = plan([autoscaled], [], "uid-1").applies
    assert (step.why, step.handover) == ("create", None)


async def test_execute_hands_over_then_applies_then_prunes_and_reports_what_it_touched():
    kube = RecordingKube()
    handover = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vl-encoder", "namespace": "ns"},
        "spec": {"replicas": 3},
    }
    pruned = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old", "namespace": "ns", "uid": "u-old"}}
    todo = Plan(
        [Apply(dep(replicas=None), "update", handover=handover), Apply(obj("Service", "svc"), "create")], [pruned]
    )
    touched = await execute(as_kube(kube), todo)
    assert kube.calls == [
        ("apply", ("Deployment", "vl-encoder"), HANDOVER_MANAGER, False, False),
        ("apply", ("Deployment", "vl-encoder"), "epd-operator", True, False),
        ("apply", ("Service", "svc"), "epd-operator", True, False),
        ("delete", "ConfigMap", "ns", "old", "u-old"),
    ]
    assert (touched[("Deployment", "vl-encoder")] or {})["metadata"]["resourceVersion"] == "2"
    assert (touched[("Service", "svc")] or {})["metadata"]["resourceVersion"] == "3"
    assert touched[("ConfigMap", "old")] is None
    assert list(touched) == [("Deployment", "vl-encoder"), ("Service", "svc"), ("ConfigMap", "old")]


async def test_execute_of_an_empty_plan_writes_nothing():
    kube = RecordingKube()
    assert await execute(as_kube(kube), Plan([], [])) == {}
    assert kube.calls == []


def test_refusal_is_only_the_objects_own_fault():
    assert [s for s in (400, 401, 403, 404, 409, 422, 429, 500) if refusal(ApiError(s, {}, "x"))] == [400, 422]


async def test_dry_run_collects_every_refusal_with_the_servers_words_and_skips_unshaped_kinds():
    invalid = ApiError(
        422, {"message": 'Deployment.apps "vl-encoder" is invalid: spec.replicas: must be >= 0'}, "apply"
    )
    not_json = ApiError(400, "bad body", "apply")
    kube = RecordingKube({("Deployment", "vl-encoder"): invalid, ("Service", "vl-router"): not_json})
    todo = Plan(
        [
            Apply(dep(), "create"),
            Apply(obj("ServiceAccount", "sa"), "create"),
            Apply(obj("Role", "r"), "create"),
            Apply(obj("RoleBinding", "rb"), "create"),
            Apply(obj("Service", "vl-router"), "create"),
        ],
        [],
    )
    problems = await refused_by_server(as_kube(kube), todo)
    assert problems == [
        'Deployment vl-encoder: Deployment.apps "vl-encoder" is invalid: spec.replicas: must be >= 0',
        "Service vl-router: apply: HTTP 400: bad body",
    ]
    assert [c[1] for c in kube.calls] == [("Deployment", "vl-encoder"), ("Service", "vl-router")]
    assert all(c[4] is True for c in kube.calls)  # dry runs only


async def test_dry_run_names_an_api_the_cluster_does_not_serve():
    route = obj("HTTPRoute", "vl", "gateway.networking.k8s.io/v1")
    kube = RecordingKube({("HTTPRoute", "vl"): ApiError(404, {"message": "not found"}, "apply")})
    assert await refused_by_server(as_kube(kube), Plan([Apply(route, "create")], [])) == [
        "HTTPRoute vl: this cluster does not serve gateway.networking.k8s.io/v1 HTTPRoute "
        "(install its CRDs, or remove the field that asks for it)"
    ]


async def test_dry_run_raises_what_is_not_a_refusal():
    for status in (404, 409, 500):  # a 404 for a core kind is not "API missing"
        kube = RecordingKube({("Service", "vl-router"): ApiError(status, {"message": "m"}, "apply")})
        with pytest.raises(ApiError) as caught:
            await refused_by_server(as_kube(kube), Plan([Apply(obj(), "create")], []))
        assert caught.value.status == status


def test_drift_from_the_root_and_of_an_empty_list_against_a_scalar():
    out: list[str] = []
    _drift({"a": 1}, "scalar", "", out)
    _drift({"a": {"b": 1}}, {"a": {"b": 2}}, "", out)
    assert out == ["<root>", "a.b"]
    base = {"apiVersion": "v1", "kind": "X", "metadata": {}}
    assert drift({**base, "spec": {"l": []}}, {**base, "spec": {"l": "x"}}) == ["spec.l"]


def test_objects_without_metadata_spec_or_annotations():
    assert drift({"kind": "X", "spec": {"a": 1}}, {"kind": "X", "spec": {"a": 1}}) == []
    assert drift({"kind": "X", "spec": {"a": 1}}, {"kind": "X"}) == ["spec"]
    assert manages_replicas({}) is True
    assert needs_replicas_handover({"kind": "Deployment"}, {"spec": {"replicas": 2}, "metadata": {}}) is True
    assert needs_replicas_handover({"kind": "Deployment"}, {"metadata": {}}) is False
    adopted = adopt({"kind": "X"}, OWNER)
    assert adopted["metadata"]["ownerReferences"] == [OWNER]
    live = {"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}}  # never annotated by us
    (step,) = plan([adopt(live, OWNER)], [live], "uid-1").applies
    assert step.why == "update"


def test_api_version_kind_and_status_are_not_compared():
    desired = {"apiVersion": "v1", "kind": "X", "metadata": {}, "status": {"a": 1}, "spec": {}}
    live = {"apiVersion": "apps/v1", "kind": "Y", "metadata": {}, "status": {"a": 2}, "spec": {}}
    assert drift(desired, live) == []


def test_a_leader_worker_set_hands_its_replicas_over_too():
    live = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "vl-decode", "namespace": "ns"},
        "spec": {"replicas": 3},
    }
    assert needs_replicas_handover({**live, "spec": {}}, live) is True


def test_applied_hash_of_values_json_cannot_spell_uses_their_text():
    # `printf '%s' '{"a":"1.5"}' | sha256sum | cut -c1-20`
    assert applied_hash({"a": Decimal("1.5")}) == "87d1686a3b72d474dd6a"


async def test_dry_run_goes_on_after_an_api_the_cluster_does_not_serve():
    route = obj("HTTPRoute", "vl", "gateway.networking.k8s.io/v1")
    kube = RecordingKube(
        {
            ("HTTPRoute", "vl"): ApiError(404, {"message": "not found"}, "apply"),
            ("Service", "vl-router"): ApiError(422, {"message": "bad port"}, "apply"),
        }
    )
    problems = await refused_by_server(as_kube(kube), Plan([Apply(route, "create"), Apply(obj(), "create")], []))
    assert [p.split(":")[0] for p in problems] == ["HTTPRoute vl", "Service vl-router"]


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


async def test_dry_run_says_keda_is_not_installed():
    so = obj("ScaledObject", "vl-encoder", "keda.sh/v1alpha1")
    kube = RecordingKube({("ScaledObject", "vl-encoder"): ApiError(404, {"message": "not found"}, "apply")})
    assert await refused_by_server(as_kube(kube), Plan([Apply(so, "create")], [])) == [
        "ScaledObject vl-encoder: this cluster does not serve keda.sh/v1alpha1 ScaledObject "
        "(KEDA is not installed; install it (docs/autoscaling.md), or set autoscaling.engine: HPA)"
    ]


def test_the_hpa_keda_creates_is_never_pruned_nor_applied():
    """KEDA's HPA (keda-hpa-<scaled object>) is owned by the ScaledObject, not by the EPDDeployment: even
    were it to carry our labels, the plan leaves it alone, and ours stays the ScaledObject."""
    scaled = adopt(
        {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "vl-encoder", "namespace": "ns", "labels": {"app.kubernetes.io/instance": "vl"}},
            "spec": {"scaleTargetRef": {"name": "vl-encoder"}, "triggers": [{"type": "cpu", "metadata": {}}]},
        },
        OWNER,
    )
    keda_hpa = live_copy(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {
                "name": "keda-hpa-vl-encoder",
                "namespace": "ns",
                "labels": {"app.kubernetes.io/instance": "vl", "app.kubernetes.io/managed-by": "keda-operator"},
                "ownerReferences": [{"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "uid": "so-uid"}],
            },
        }
    )
    desired = [adopt(deployment(replicas=None), OWNER), scaled]
    live = [live_copy(desired[0]), keda_hpa]
    live[0]["spec"]["replicas"] = 0  # KEDA scaled the tier to zero: no drift, no handover
    live[0]["metadata"]["managedFields"] = applied_by(("epd-operator", {"f:spec": {"f:template": {}}}))
    todo = plan(desired, live, "uid-1")
    assert todo.prunes == []
    assert [step.desired["kind"] for step in todo.applies] == ["ScaledObject"]
    assert all(step.handover is None for step in todo.applies)


def test_every_kind_of_a_keda_scaled_deployment_is_one_the_operator_can_apply_and_prune():
    for name in ("keda-encoder-scale-to-zero", "keda-every-tier-multi-node-decode"):
        for rendered in render(VARIANTS[name]):
            assert child_resource(rendered) is CHILD_RESOURCES[rendered["kind"]]


# ----------------------------------------------------------------------------- engine switch and admission denials

KEDA_DENIAL = ApiError(
    403,
    {
        "kind": "Status",
        "status": "Failure",
        "code": 403,
        "message": "admission webhook \"vscaledobject.kb.io\" denied the request: the workload 'vl-encoder' of "
        "type 'apps/v1.Deployment' is already managed by the hpa 'vl-encoder'",
    },
    "apply",
)


def test_an_admission_webhooks_denial_is_a_refusal_whatever_its_code_and_a_failed_call_is_not():
    assert refusal(KEDA_DENIAL)
    for code in (400, 403, 422):
        denied = {"message": 'admission webhook "v.example.io" denied the request: no'}
        assert refusal(ApiError(code, denied, "apply")), code
    policy = {
        "message": "deployments.apps \"x\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' "
        "denied request: replicas too high"
    }
    assert refusal(ApiError(403, policy, "apply"))
    # RBAC's 403, and a webhook the server could not call (failurePolicy Fail), are retried
    rbac = {"message": 'scaledobjects.keda.sh "x" is forbidden: User "u" cannot create resource "scaledobjects"'}
    assert not refusal(ApiError(403, rbac, "apply"))
    unreachable = {
        "message": 'Internal error occurred: failed calling webhook "vscaledobject.kb.io": connection refused'
    }
    assert not refusal(ApiError(500, unreachable, "apply"))


def hpa(name: str = "vl-encoder", min_replicas: int = 2, target: str = "vl-encoder") -> dict[str, Any]:
    return obj(
        "HorizontalPodAutoscaler",
        name,
        "autoscaling/v2",
        scaleTargetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        minReplicas=min_replicas,
        maxReplicas=4,
    )


def scaled_object(name: str = "vl-encoder") -> dict[str, Any]:
    return obj(
        "ScaledObject",
        name,
        "keda.sh/v1alpha1",
        scaleTargetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": "vl-encoder"},
        minReplicaCount=0,
        maxReplicaCount=4,
    )


def live_deployment(replicas: int) -> dict[str, Any]:
    live = live_copy(adopt(deployment(replicas=None), OWNER))
    live["spec"]["replicas"] = replicas
    live["metadata"]["managedFields"] = applied_by(("epd-operator", {"f:spec": {"f:template": {}}}))
    return live


def test_hpa_to_keda_replaces_the_hpa_first_and_wakes_nothing():
    desired = [adopt(deployment(replicas=None), OWNER), adopt(scaled_object(), OWNER)]
    old = live_copy(adopt(hpa(), OWNER))
    todo = plan(desired, [live_deployment(3), old], "uid-1")
    (step,) = todo.applies
    assert (step.desired["kind"], step.why, step.replaces, step.handover) == ("ScaledObject", "create", old, None)
    assert todo.prunes == [old]


def test_keda_to_hpa_replaces_the_scaled_object():
    desired = [adopt(deployment(replicas=None), OWNER), adopt(hpa(min_replicas=2), OWNER)]
    old = live_copy(adopt(scaled_object(), OWNER))
    (step,) = plan(desired, [live_deployment(0), old], "uid-1").applies
    assert (step.desired["kind"], step.replaces, step.handover) == ("HorizontalPodAutoscaler", old, None)


@pytest.mark.parametrize("replicas, woken", [(0, 2), (3, None)])
def test_a_tier_at_zero_is_woken_to_the_hpas_min_replicas_and_one_above_zero_is_left_alone(replicas, woken):
    wake = wake_for_hpa(hpa(min_replicas=2), live_deployment(replicas))
    if woken is None:
        assert wake is None
    else:
        assert wake == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "vl-encoder", "namespace": "ns"},
            "spec": {"replicas": woken},
        }
    assert wake_for_hpa(hpa(), None) is None


def test_an_autoscaler_that_is_not_ours_is_not_replaced():
    desired = [adopt(deployment(replicas=None), OWNER), adopt(scaled_object(), OWNER)]
    someone_elses = live_copy(hpa("their-hpa"))
    (step,) = plan(desired, [live_deployment(3), someone_elses], "uid-1").applies
    assert step.replaces is None


async def test_dry_run_lets_a_replacement_past_the_webhook_that_sees_the_old_autoscaler_but_not_past_its_schema():
    step = Apply(scaled_object(), "create", replaces=hpa())
    kube = RecordingKube({("ScaledObject", "vl-encoder"): KEDA_DENIAL})
    assert await refused_by_server(as_kube(kube), Plan([step], [hpa()])) == []
    invalid = ApiError(422, {"message": 'ScaledObject.keda.sh "vl-encoder" is invalid: spec.triggers: Required'}, "x")
    kube = RecordingKube({("ScaledObject", "vl-encoder"): invalid})
    assert await refused_by_server(as_kube(kube), Plan([step], [hpa()])) == [
        'ScaledObject vl-encoder: ScaledObject.keda.sh "vl-encoder" is invalid: spec.triggers: Required'
    ]
    # no engine switch: the webhook's words are the refusal, shown as they are
    kube = RecordingKube({("ScaledObject", "vl-encoder"): KEDA_DENIAL})
    assert await refused_by_server(as_kube(kube), Plan([Apply(scaled_object(), "create")], [])) == [
        f"ScaledObject vl-encoder: {KEDA_DENIAL.body['message']}"
    ]


async def test_execute_deletes_the_old_autoscaler_wakes_the_tier_then_creates_the_new_one_and_prunes_it_once(
    monkeypatch,
):
    old = live_copy(adopt(scaled_object(), OWNER))
    kube = RecordingKube()
    kube.stored[("Deployment", "ns", "vl-encoder")] = live_deployment(0)  # KEDA took the idle tier to zero
    kube.lingering[("ScaledObject", "vl-encoder")] = 2  # KEDA's finalizer: its scale loop still runs meanwhile
    monkeypatch.setattr("epd_operator.controller.apply.REPLACED_POLL_S", 0)
    touched = await execute(as_kube(kube), Plan([Apply(hpa(), "create", replaces=old)], [old]))
    assert kube.calls == [
        ("delete", "ScaledObject", "ns", "vl-encoder", "child-uid"),
        *[("get", "ScaledObject", "ns", "vl-encoder")] * 3,  # the target is read once the ScaledObject is gone
        ("get", "Deployment", "ns", "vl-encoder"),
        ("apply", ("Deployment", "vl-encoder"), HANDOVER_MANAGER, True, False),  # forced: KEDA wrote the 0
        ("apply", ("HorizontalPodAutoscaler", "vl-encoder"), "epd-operator", True, False),
    ]
    assert touched[("ScaledObject", "vl-encoder")] is None
    assert touched[("HorizontalPodAutoscaler", "vl-encoder")] is not None
    kube = RecordingKube()
    kube.stored[("Deployment", "ns", "vl-encoder")] = live_deployment(3)
    await execute(as_kube(kube), Plan([Apply(hpa(), "create", replaces=old)], [old]))
    assert [c[0] for c in kube.calls] == ["delete", "get", "get", "apply"]  # at 3: no wake-up


class StaleWebhookKube(RecordingKube):
    """KEDA's webhook reads HPAs from its cache: it denies the replacement a few times after the delete."""

    def __init__(self, denials: int) -> None:
        super().__init__()
        self.denials = denials

    async def apply(self, obj, *, field_manager="epd-operator", force=True, dry_run=False):
        result = await super().apply(obj, field_manager=field_manager, force=force, dry_run=dry_run)
        if obj["kind"] == "ScaledObject" and self.denials:
            self.denials -= 1
            raise KEDA_DENIAL
        return result


async def test_a_replacement_denied_while_the_webhook_still_sees_the_old_hpa_is_tried_again(monkeypatch):
    monkeypatch.setattr("epd_operator.controller.apply.REPLACEMENT_RETRY_S", 0)
    old = live_copy(adopt(hpa(), OWNER))
    kube = StaleWebhookKube(denials=2)
    touched = await execute(as_kube(kube), Plan([Apply(scaled_object(), "create", replaces=old)], [old]))
    assert [c[0] for c in kube.calls] == ["delete", "apply", "apply", "apply"]
    assert touched[("ScaledObject", "vl-encoder")] is not None
    kube = StaleWebhookKube(denials=100)  # a denial that stands is a refusal, with what was written before it
    with pytest.raises(ApplyRefused) as stopped:
        await execute(as_kube(kube), Plan([Apply(scaled_object(), "create", replaces=old)], [old]))
    assert stopped.value.touched == {("HorizontalPodAutoscaler", "vl-encoder"): None}
    assert stopped.value.done == Plan([], [old])  # the old HPA is gone: a prune done; its replacement is not
    assert stopped.value.problem == f"ScaledObject vl-encoder: {KEDA_DENIAL.body['message']} ({REFUSED_WHEN_WRITTEN})"


class DeniesWhenWritten(RecordingKube):
    """A webhook that judges real writes only (KEDA's skips its resource-request checks on a dry run)."""

    def __init__(self, error: ApiError) -> None:
        super().__init__()
        self.error = error

    async def apply(self, obj, *, field_manager="epd-operator", force=True, dry_run=False):
        result = await super().apply(obj, field_manager=field_manager, force=force, dry_run=dry_run)
        if obj["kind"] == "ScaledObject" and not dry_run:
            raise self.error
        return result


async def test_an_object_denied_when_written_stops_the_plan_as_a_refusal_and_a_failure_stays_a_failure():
    denied = ApiError(
        403, {"message": 'admission webhook "vscaledobject.kb.io" denied the request: no cpu request'}, "x"
    )
    todo = Plan([Apply(dep(), "create"), Apply(scaled_object(), "create"), Apply(obj(), "create")], [])
    kube = DeniesWhenWritten(denied)
    with pytest.raises(ApplyRefused) as stopped:
        await execute(as_kube(kube), todo)
    assert list(stopped.value.touched) == [("Deployment", "vl-encoder")]  # the Service after it was not written
    assert stopped.value.done == Plan([todo.applies[0]], [])
    assert stopped.value.problem.startswith('ScaledObject vl-encoder: admission webhook "vscaledobject.kb.io" denied')
    kube = DeniesWhenWritten(ApiError(500, {"message": "etcdserver: timeout"}, "x"))
    with pytest.raises(ApiError):
        await execute(as_kube(kube), todo)


def webhook_denial(status: int) -> ApiError:
    return ApiError(status, {"message": 'admission webhook "v.example.io" denied the request: no'}, "apply")


@pytest.mark.parametrize("status, denial", [(399, False), (400, True), (403, True), (499, True), (500, False)])
def test_a_webhooks_denial_is_one_only_with_a_client_errors_code(status, denial):
    # a 5xx with the webhook's words is the server failing around the webhook, not the webhook's verdict
    assert admission_denial(webhook_denial(status)) is denial


@pytest.mark.parametrize(
    "body",
    [
        {"message": 'the request was denied: admission webhook "v" denied the request: no'},  # not the prefix
        {"message": 'admission webhook "v.example.io" refused: no'},  # the prefix without the verdict
        {"message": "ValidatingAdmissionPolicy 'p' with binding 'b' allowed the request"},
        {"message": 'deployments.apps "x" is forbidden: someone denied request'},  # the verdict, no policy
        {"reason": "Forbidden"},  # no message
        'admission webhook "v" denied the request: no',  # an answer that is not a Status at all
    ],
)
def test_only_the_api_servers_wording_of_a_denial_is_one(body):
    assert not admission_denial(ApiError(403, body, "apply"))


def test_each_autoscaler_scales_the_target_its_reference_names():
    assert scale_target(hpa(target="vl-prefill")) == ("Deployment", "vl-prefill")
    assert scale_target(scaled_object()) == ("Deployment", "vl-encoder")
    assert scale_target({"kind": "ScaledObject", "spec": {"scaleTargetRef": {"name": "vl-encoder"}}}) is None
    assert scale_target({"kind": "ScaledObject", "spec": {}}) is None
    assert scale_target({"kind": "ScaledObject"}) is None


def test_an_engine_switch_replaces_the_autoscaler_of_its_own_tier_not_another_tiers():
    prefill = live_copy(adopt(hpa("vl-prefill", target="vl-prefill"), OWNER))
    encoder = live_copy(adopt(hpa(), OWNER))
    assert replaced_autoscaler(adopt(scaled_object(), OWNER), [prefill, encoder], "uid-1") is encoder
    desired = [adopt(deployment(replicas=None), OWNER), adopt(scaled_object(), OWNER)]
    (step,) = plan(desired, [prefill, live_deployment(3), encoder], "uid-1").applies
    assert step.replaces is encoder
    # a ScaledObject that has lost its target (no tier of its own) replaces nothing
    lost = live_copy(adopt(scaled_object("vl-old"), OWNER))
    del lost["spec"]["scaleTargetRef"]
    assert replaced_autoscaler(adopt(hpa(), OWNER), [lost], "uid-1") is None


def test_a_switch_interrupted_after_the_new_autoscaler_was_created_finishes_by_pruning_the_old_one():
    """The pass created the ScaledObject and stopped before deleting the HPA: the next plan has the new one
    in place (nothing to replace) and prunes the old."""
    new = adopt(scaled_object(), OWNER)
    old = live_copy(adopt(hpa(), OWNER))
    todo = plan([adopt(deployment(replicas=None), OWNER), new], [live_deployment(3), live_copy(new), old], "uid-1")
    assert todo.applies == []
    assert todo.prunes == [old]


@pytest.mark.parametrize("min_replicas", [1, 3])
def test_a_tier_at_zero_wakes_to_exactly_the_hpas_min_replicas(min_replicas):
    wake = wake_for_hpa(hpa(min_replicas=min_replicas), live_deployment(0))
    assert wake is not None and wake["spec"] == {"replicas": min_replicas}


async def test_a_replacement_is_tried_the_set_number_of_times_and_the_last_denial_is_the_refusal(monkeypatch):
    monkeypatch.setattr("epd_operator.controller.apply.REPLACEMENT_RETRY_S", 0)
    monkeypatch.setattr("epd_operator.controller.apply.REPLACEMENT_TRIES", 3)
    old = live_copy(adopt(hpa(), OWNER))
    todo = Plan([Apply(scaled_object(), "create", replaces=old)], [old])
    kube = StaleWebhookKube(denials=2)  # the third and last try is accepted
    touched = await execute(as_kube(kube), todo)
    assert touched[("ScaledObject", "vl-encoder")] is not None
    kube = StaleWebhookKube(denials=3)
    with pytest.raises(ApplyRefused):
        await execute(as_kube(kube), todo)
    assert [c[0] for c in kube.calls] == ["delete", "apply", "apply", "apply"]


class FailsToApply(RecordingKube):
    """A write that fails on the server's side (not a denial): not tried again."""

    async def apply(self, obj, *, field_manager="epd-operator", force=True, dry_run=False):
        await super().apply(obj, field_manager=field_manager, force=force, dry_run=dry_run)
        raise ApiError(500, {"message": "etcdserver: timeout"}, "apply")


async def test_a_replacement_that_fails_for_another_reason_is_not_tried_again(monkeypatch):
    monkeypatch.setattr("epd_operator.controller.apply.REPLACEMENT_RETRY_S", 0)
    old = live_copy(adopt(hpa(), OWNER))
    kube = FailsToApply()
    with pytest.raises(ApiError):
        await execute(as_kube(kube), Plan([Apply(scaled_object(), "create", replaces=old)], [old]))
    assert [c[0] for c in kube.calls] == ["delete", "apply"]


async def test_an_engine_switch_does_not_end_the_plan_and_each_prune_is_done_once():
    old = live_copy(adopt(hpa(), OWNER))
    stale_service = live_copy(adopt(obj(name="vl-old"), OWNER))
    stale_config = live_copy(adopt(obj("ConfigMap", "vl-old-config"), OWNER))
    todo = Plan(
        [Apply(scaled_object(), "create", replaces=old), Apply(obj(), "update")],
        [old, stale_service, stale_config],  # the replaced HPA first: deleted by the switch already
    )
    kube = RecordingKube()
    touched = await execute(as_kube(kube), todo)
    assert [(c[0], c[1]) for c in kube.calls] == [
        ("delete", "HorizontalPodAutoscaler"),
        ("apply", ("ScaledObject", "vl-encoder")),
        ("apply", ("Service", "vl-router")),
        ("delete", "Service"),
        ("delete", "ConfigMap"),
    ]
    assert list(touched) == [
        ("HorizontalPodAutoscaler", "vl-encoder"),
        ("ScaledObject", "vl-encoder"),
        ("Service", "vl-router"),
        ("Service", "vl-old"),
        ("ConfigMap", "vl-old-config"),
    ]


async def test_the_dry_run_judges_every_step_after_a_replacement_the_webhook_let_pass():
    steps = [Apply(scaled_object(), "create", replaces=hpa()), Apply(obj(), "update")]
    invalid = ApiError(422, {"message": 'Service "vl-router" is invalid: spec.ports: Required'}, "x")
    kube = RecordingKube({("ScaledObject", "vl-encoder"): KEDA_DENIAL, ("Service", "vl-router"): invalid})
    assert await refused_by_server(as_kube(kube), Plan(steps, [hpa()])) == [
        'Service vl-router: Service "vl-router" is invalid: spec.ports: Required'
    ]


async def test_a_refusal_without_a_status_body_is_told_in_the_errors_own_words():
    kube = RecordingKube(refuse_writes={("Service", "vl-router"): ApiError(422, "invalid: spec.ports", "apply")})
    with pytest.raises(ApplyRefused) as stopped:
        await execute(as_kube(kube), Plan([Apply(obj(), "create")], []))
    error = ApiError(422, "invalid: spec.ports", "apply")
    assert stopped.value.problem == f"Service vl-router: {error} ({REFUSED_WHEN_WRITTEN})"
    assert str(stopped.value) == stopped.value.problem  # what a log line or a traceback shows
    assert "invalid: spec.ports" in stopped.value.problem


async def test_a_replaced_scaled_object_is_waited_for_until_gone_and_no_longer(monkeypatch):
    monkeypatch.setattr("epd_operator.controller.apply.REPLACED_POLL_S", 0)
    monkeypatch.setattr("epd_operator.controller.apply.REPLACED_GONE_S", 0.05)
    kube = RecordingKube()
    kube.lingering[("ScaledObject", "vl-encoder")] = 10**9  # a finalizer that never ends
    started = asyncio.get_running_loop().time()
    await _gone(as_kube(kube), scaled_object())
    assert 0.05 <= asyncio.get_running_loop().time() - started < 5
