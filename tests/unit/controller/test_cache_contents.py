"""What the reconciler's cache (controller/cache.py) keeps of a pod, how it counts its bytes, and how long
it remembers the objects this process deleted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epd_operator.api.labels import INSTANCE_LABEL, ROLE_LABEL
from epd_operator.controller import cache as cache_module
from epd_operator.controller.cache import Cache


def obj(kind: str, name: str, rv: int, *, uid: str = "u1", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {INSTANCE_LABEL: "vl"},
        },
        **extra,
    }


def compact(o: dict[str, Any]) -> int:
    """The size of `o` as compact JSON (no spaces after separators)."""
    return len(json.dumps(o, separators=(",", ":")).encode())


def test_a_pod_is_read_back_with_the_metadata_a_pass_uses():
    pod = obj("Pod", "vl-decode-1", 7, uid="pod-uid", status={"phase": "Running"})
    pod["metadata"] |= {
        "deletionTimestamp": "2026-12-03T10:00:00Z",  # terminating: not counted as serving
        "generateName": "vl-decode-",
        "ownerReferences": [{"kind": "ReplicaSet", "name": "vl-decode-5d9"}],
        "creationTimestamp": "2026-12-03T09:00:00Z",
    }
    cache = Cache()
    cache.observe("ADDED", pod)
    assert cache.get("Pod", "ns", "vl-decode-1") == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "vl-decode-1",
            "namespace": "ns",
            "uid": "pod-uid",
            "resourceVersion": "7",
            "labels": {INSTANCE_LABEL: "vl"},
            "deletionTimestamp": "2026-12-03T10:00:00Z",
        },
        "status": {"conditions": [], "phase": "Running"},
    }


def test_a_pod_without_an_api_version_reads_back_as_core_v1():
    pod = obj("Pod", "vl-decode-1", 7)
    del pod["apiVersion"]
    cache = Cache()
    cache.record(pod)
    [read] = cache.pods("ns", "vl", {})
    assert (read["apiVersion"], read["kind"]) == ("v1", "Pod")


def test_bytes_counts_the_compact_json_held_through_adds_updates_and_drops():
    cache = Cache()
    small = obj("Service", "a", 1, spec={"ports": [{"port": 80}]})
    cache.record(small)
    assert cache.bytes == compact(small)
    other = obj("ConfigMap", "b", 2, data={"k": "v"})
    cache.record(other)
    assert cache.bytes == compact(small) + compact(other)
    bigger = obj("Service", "a", 3, spec={"ports": [{"port": 80}, {"port": 8080}, {"port": 9090}]})
    cache.observe("MODIFIED", bigger)  # replaces what was held for that key: counted once
    assert cache.bytes == compact(bigger) + compact(other)
    cache.observe("DELETED", bigger)
    assert cache.bytes == compact(other)


def test_what_was_dropped_no_longer_bounds_the_revision_of_a_new_object_of_that_name():
    """An event is compared with what is held; once an object is gone, nothing is held for its name, so
    a new object of that name is taken whatever its resourceVersion (an etcd restored from a backup
    counts revisions from an earlier point)."""
    cache = Cache()
    cache.record(obj("Service", "vl", 10, uid="old"))
    cache.observe("DELETED", obj("Service", "vl", 10, uid="old"))
    cache.observe("ADDED", obj("Service", "vl", 4, uid="new"))
    found = cache.get("Service", "ns", "vl")
    assert found is not None and found["metadata"]["uid"] == "new"


def test_a_deletion_seen_by_the_watch_frees_its_tombstone_for_the_ones_still_waiting(monkeypatch):
    """The objects this process deleted are remembered (bounded) until their DELETED event comes; one whose
    event came takes no room, so the oldest still waiting is not forgotten early and a late event from
    before its delete cannot bring it back."""
    monkeypatch.setattr(cache_module, "MAX_TOMBSTONES", 2)
    cache = Cache()
    b, a, c = (
        obj("Service", "b", 1, uid="uid-b"),
        obj("Service", "a", 2, uid="uid-a"),
        obj("Service", "c", 3, uid="uid-c"),
    )
    for o in (b, a, c):
        cache.record(o)
    cache.forget(b)
    cache.forget(a)
    cache.observe("DELETED", obj("Service", "a", 5, uid="uid-a"))  # a's delete is seen: its tombstone goes
    cache.forget(c)  # two tombstones: b and c
    cache.observe("MODIFIED", obj("Service", "b", 4, uid="uid-b"))  # b's last change, sent before its delete
    assert cache.get("Service", "ns", "b") is None, "a late event brought back an object this process deleted"
    assert len(cache) == 0


@pytest.mark.parametrize("kept", [1, 2])
def test_tombstones_beyond_the_bound_forget_the_oldest(monkeypatch, kept):
    monkeypatch.setattr(cache_module, "MAX_TOMBSTONES", kept)
    cache = Cache()
    deleted = [obj("Service", f"s{i}", i, uid=f"uid-{i}") for i in range(3)]
    for o in deleted:
        cache.forget(o)
    for o in deleted:  # late events from before each delete
        cache.observe("MODIFIED", {**o, "metadata": {**o["metadata"], "resourceVersion": "100"}})
    assert [o["metadata"]["name"] for o in cache.owned("ns", "vl", ["Service"])] == [f"s{i}" for i in range(3 - kept)]


def test_pods_are_matched_by_every_label_of_the_selector():
    def pod(name: str, role: str) -> dict[str, Any]:
        p = obj("Pod", name, 1)
        p["metadata"]["labels"][ROLE_LABEL] = role
        return p

    cache = Cache()
    cache.record(pod("vl-encoder-1", "encoder"))
    cache.record(pod("vl-decode-1", "decode"))
    assert [p["metadata"]["name"] for p in cache.pods("ns", "vl", {ROLE_LABEL: "encoder"})] == ["vl-encoder-1"]
    assert cache.pods("ns", "vl", {ROLE_LABEL: "encoder", "other": "x"}) == []
