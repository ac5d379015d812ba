"""The reconciler's watch-fed cache (controller/cache.py): ordering, deletions, bounds.

Its use by the operator (no reads at rest, drift repaired, pruning) is proven on the real control plane
in tests/integration/test_operator_reads_from_cache.py."""

from __future__ import annotations

from typing import Any

from epd_operator.api.labels import INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, ROLE_LABEL
from epd_operator.controller.apply import manages_replicas
from epd_operator.controller.cache import LAST_APPLIED, Cache


def held(cache: Cache, kind: str, namespace: str, name: str) -> dict[str, Any]:
    """What the cache holds for an object the test put there."""
    found = cache.get(kind, namespace, name)
    assert found is not None, f"the cache lost {kind} {namespace}/{name}"
    return found


def obj(kind: str, name: str, rv: int, *, instance: str = "vl", uid: str = "u1", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {INSTANCE_LABEL: instance, MANAGED_BY_LABEL: MANAGED_BY},
        },
        **extra,
    }


def test_children_are_found_by_their_instance_label_and_kind():
    cache = Cache()
    cache.observe(None, obj("Service", "vl", 1))
    cache.observe("ADDED", obj("ConfigMap", "vl-transfer", 2))
    cache.observe("ADDED", obj("Service", "other", 3, instance="other"))
    assert [o["metadata"]["name"] for o in cache.owned("ns", "vl", ["Service", "ConfigMap"])] == ["vl-transfer", "vl"]
    assert [o["metadata"]["name"] for o in cache.owned("ns", "vl", ["Service"])] == ["vl"]
    assert cache.owned("elsewhere", "vl", ["Service"]) == []


def test_an_event_older_than_what_is_held_is_ignored():
    cache = Cache()
    cache.record(obj("Service", "vl", 10, spec={"v": "ours"}))  # our write's answer
    cache.observe("MODIFIED", obj("Service", "vl", 9, spec={"v": "before"}))  # its predecessor, late
    assert held(cache, "Service", "ns", "vl")["spec"] == {"v": "ours"}, "a late event undid a write"
    cache.observe("MODIFIED", obj("Service", "vl", 11, spec={"v": "theirs"}))
    assert held(cache, "Service", "ns", "vl")["spec"] == {"v": "theirs"}


def test_a_deletion_removes_and_a_late_event_does_not_bring_back_what_we_deleted():
    cache = Cache()
    cache.observe("ADDED", obj("Deployment", "vl-decode", 5, uid="old"))
    cache.forget(obj("Deployment", "vl-decode", 5, uid="old"))  # pruned by this process
    assert cache.get("Deployment", "ns", "vl-decode") is None
    cache.observe("MODIFIED", obj("Deployment", "vl-decode", 6, uid="old"))  # sent before the delete
    assert cache.get("Deployment", "ns", "vl-decode") is None
    cache.observe("DELETED", obj("Deployment", "vl-decode", 7, uid="old"))
    cache.record(obj("Deployment", "vl-decode", 8, uid="new"))  # created again, same name
    assert held(cache, "Deployment", "ns", "vl-decode")["metadata"]["uid"] == "new"
    assert [o["metadata"]["uid"] for o in cache.owned("ns", "vl", ["Deployment"])] == ["new"]


def test_a_late_deletion_of_a_predecessor_keeps_its_successor():
    cache = Cache()
    cache.record(obj("Deployment", "vl-decode", 20, uid="new"))
    cache.observe("DELETED", obj("Deployment", "vl-decode", 15, uid="old"))
    assert held(cache, "Deployment", "ns", "vl-decode")["metadata"]["uid"] == "new"
    cache.observe("DELETED", obj("Deployment", "vl-decode", 21, uid="new"))
    assert cache.get("Deployment", "ns", "vl-decode") is None
    assert cache.owned("ns", "vl", ["Deployment"]) == [] and len(cache) == 0 and cache.bytes == 0


def test_relabelled_objects_move_between_owners():
    cache = Cache()
    cache.observe("ADDED", obj("Service", "x", 1, instance="a"))
    cache.observe("MODIFIED", obj("Service", "x", 2, instance="b"))
    assert cache.owned("ns", "a", ["Service"]) == []
    assert [o["metadata"]["name"] for o in cache.owned("ns", "b", ["Service"])] == ["x"]


def test_reads_are_private_copies():
    cache = Cache()
    cache.record(obj("Service", "vl", 1, spec={"ports": [{"port": 80}]}))
    held(cache, "Service", "ns", "vl")["spec"]["ports"].clear()
    cache.owned("ns", "vl", ["Service"])[0]["spec"]["ports"].append({"port": 1})
    assert held(cache, "Service", "ns", "vl")["spec"] == {"ports": [{"port": 80}]}


def test_stored_objects_lose_what_no_pass_reads_but_keep_who_applies_replicas():
    managed = [
        {
            "manager": "epd-operator",
            "operation": "Apply",
            "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {}}}}},
        },
        {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:status": {"f:replicas": {}}}},
    ]
    dep = obj("Deployment", "vl-decode", 1, spec={"replicas": 2})
    dep["metadata"]["managedFields"] = managed
    dep["metadata"]["annotations"] = {LAST_APPLIED: "x" * 10_000, "serving.epd.dev/applied-hash": "abc"}
    cache = Cache()
    cache.record(dep)
    assert 0 < cache.bytes < 1000
    kept = held(cache, "Deployment", "ns", "vl-decode")
    assert kept["metadata"]["annotations"] == {"serving.epd.dev/applied-hash": "abc"}
    assert kept["metadata"]["managedFields"] == [
        {"manager": "epd-operator", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
    ]
    assert manages_replicas(kept) and manages_replicas(dep)  # the handover decision is unchanged
    assert dep["metadata"]["managedFields"] is managed  # the caller's object is not altered

    svc = obj("Service", "vl", 1)
    svc["metadata"]["managedFields"] = managed
    cache.record(svc)
    assert "managedFields" not in held(cache, "Service", "ns", "vl")["metadata"]


def test_pods_keep_labels_and_conditions_and_are_matched_by_selector():
    def pod(name: str, role: str, rv: int) -> dict[str, Any]:
        p = obj(
            "Pod",
            name,
            rv,
            spec={"containers": [{"name": "vllm", "args": ["x"] * 100}]},
            status={
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
                ],
            },
        )
        p["metadata"]["labels"][ROLE_LABEL] = role
        return p

    cache = Cache()
    cache.observe("ADDED", pod("vl-decode-1", "decode", 1))
    cache.observe("ADDED", pod("vl-encoder-1", "encoder", 2))
    [decode] = cache.pods("ns", "vl", {INSTANCE_LABEL: "vl", ROLE_LABEL: "decode"})
    assert decode["metadata"]["name"] == "vl-decode-1"
    assert "spec" not in decode
    assert decode["status"] == {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}],
    }
    assert len(cache.pods("ns", "vl", {INSTANCE_LABEL: "vl"})) == 2


def test_pods_keep_what_their_container_statuses_say_about_trouble_with_messages_cut():
    crashing = {
        "name": "vllm",
        "ready": False,
        "restartCount": 4,
        "image": "localhost/epd-echo:dev",
        "imageID": "sha256:f549",
        "containerID": "containerd://04bb",
        "started": False,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}},
        "lastState": {
            "terminated": {
                "exitCode": 128,
                "reason": "StartError",
                "message": "x" * 1500,
                "startedAt": "1970-01-01T00:00:00Z",
                "finishedAt": "2026-12-01T18:09:53Z",
                "containerID": "containerd://04bb",
            }
        },
    }
    init = {"name": "wait", "ready": True, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    pod = obj(
        "Pod",
        "vl-decode-1",
        1,
        status={"phase": "Running", "containerStatuses": [crashing], "initContainerStatuses": [init]},
    )
    cache = Cache()
    cache.observe("ADDED", pod)
    [held_pod] = cache.pods("ns", "vl", {})
    assert held_pod["status"] == {
        "phase": "Running",
        "conditions": [],
        "initContainerStatuses": [
            {
                "name": "wait",
                "ready": True,
                "state": {"terminated": {"reason": "Completed", "exitCode": 0}},
                "lastState": {},
            }
        ],
        "containerStatuses": [
            {
                "name": "vllm",
                "ready": False,
                "state": {
                    "waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
                },
                "lastState": {"terminated": {"reason": "StartError", "exitCode": 128, "message": "x" * 999 + "…"}},
            }
        ],
    }


def test_a_fresh_list_drops_what_it_lacks_unless_held_from_after_it():
    cache = Cache()
    cache.observe(None, obj("ConfigMap", "kept", 5))
    cache.observe(None, obj("ConfigMap", "deleted-in-a-watch-gap", 6))
    cache.record(obj("ConfigMap", "created-after-the-list", 12))  # our write, newer than the list
    cache.observe(None, obj("Service", "other-kind", 7))
    cache.observe(
        None,
        obj("ConfigMap", "other-namespace", 7)
        | {"metadata": {**obj("ConfigMap", "x", 7)["metadata"], "name": "other-namespace", "namespace": "elsewhere"}},
    )
    dropped = cache.replace_kind("ConfigMap", "ns", [obj("ConfigMap", "kept", 9, data={"v": "2"})], "10")
    assert dropped == {("ns", "vl")}
    names = [o["metadata"]["name"] for o in cache.owned("ns", "vl", ["ConfigMap", "Service"])]
    assert names == ["created-after-the-list", "kept", "other-kind"]
    assert held(cache, "ConfigMap", "ns", "kept")["data"] == {"v": "2"}  # what the list showed is recorded
    assert cache.get("ConfigMap", "elsewhere", "other-namespace") is not None


def test_a_dropped_epddeployment_is_named_by_its_own_key():
    cache = Cache()
    epd = {
        "apiVersion": "serving.epd.dev/v1alpha1",
        "kind": "EPDDeployment",
        "metadata": {"name": "vl", "namespace": "ns", "uid": "e", "resourceVersion": "3"},
    }
    cache.observe(None, epd)
    assert cache.replace_kind("EPDDeployment", "ns", [], "4") == {("ns", "vl")}
    assert cache.get("EPDDeployment", "ns", "vl") is None
