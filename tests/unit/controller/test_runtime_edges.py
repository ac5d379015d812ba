"""Edges of the controller's runtime pieces that the first controller-runtime mutation run showed untested:
the cache's tombstones, list audits and indexes at their boundaries, the work queue's timers, a status
pass keeping the API server's refusal, the reconciler's task names and failure Events."""

from __future__ import annotations

import asyncio

from epd_operator.controller import cache as cache_module
from epd_operator.controller.cache import Cache, _container_state
from epd_operator.controller.metrics import Metrics
from epd_operator.controller.reconciler import Reconciler
from epd_operator.controller.workqueue import FULL, WorkQueue
from epd_operator.kube import ApiError
from tests.support.recording_kube import RecordingKube, as_kube
from tests.unit.controller.test_reconciler import KEY, NAME, NS, epd_body, queued


def obj(name: str, revision: int, uid: str = "", instance: str | None = "vl") -> dict:
    labels = {"app.kubernetes.io/instance": instance} if instance else {}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(revision),
            "labels": labels,
        },
    }


def test_a_message_of_exactly_the_limit_is_kept_whole():
    whole = "x" * cache_module.MAX_POD_MESSAGE
    assert _container_state({"waiting": {"message": whole}})["waiting"]["message"] == whole
    cut = _container_state({"waiting": {"message": whole + "y"}})["waiting"]["message"]
    assert cut == whole[:-1] + "…"


def test_tombstones_are_bounded_and_the_oldest_goes_first(monkeypatch):
    monkeypatch.setattr(cache_module, "MAX_TOMBSTONES", 3)
    cache = Cache()
    for i in range(4):
        cache.forget(obj(f"c{i}", 10))
    assert len(cache._deleted) == 3
    cache.record(obj("c0", 11))  # its tombstone was the oldest: dropped, so a late event brings it back
    cache.record(obj("c1", 11))  # still a tombstone: stays deleted
    assert cache.get("ConfigMap", "ns", "c0") is not None and cache.get("ConfigMap", "ns", "c1") is None


def test_a_list_without_a_version_drops_whatever_it_lacks():
    cache = Cache()
    cache.record(obj("a", 5))
    assert cache.replace_kind("ConfigMap", "ns", [], "") == {("ns", "vl")}
    assert len(cache) == 0


def test_a_list_drops_what_it_lacks_up_to_its_own_version_and_keeps_what_came_later():
    cache = Cache()
    cache.record(obj("created-after", 200))
    cache.record(obj("same", 100))
    cache.record(obj("older", 50))
    cache.replace_kind("ConfigMap", "ns", [], "100")
    assert [c["metadata"]["name"] for c in cache.owned("ns", "vl", ["ConfigMap"])] == ["created-after"]


def test_a_deletion_at_the_version_held_drops_it():
    cache = Cache()
    cache.record(obj("a", 5))
    cache.observe("DELETED", obj("a", 5))
    assert cache.get("ConfigMap", "ns", "a") is None


def test_an_object_relabelled_away_and_back_is_found_again():
    cache = Cache()
    cache.record(obj("a", 1))
    cache.record(obj("a", 2, instance=None))
    assert cache.owned("ns", "vl", ["ConfigMap"]) == []
    cache.record(obj("a", 3))
    assert [c["metadata"]["name"] for c in cache.owned("ns", "vl", ["ConfigMap"])] == ["a"]


async def test_a_fired_timer_is_not_kept():
    queue: WorkQueue[str] = WorkQueue()
    queue.add_after("a", FULL, 0.01)
    assert len(queue._timers) == 1
    assert await asyncio.wait_for(queue.get(), 5) == ("a", FULL)
    assert queue._timers == set()


async def test_a_status_pass_keeps_the_refusal_the_server_gave_this_generation():
    kube = RecordingKube(refuse={("Deployment", f"{NAME}-decode"): ApiError(422, {"message": "quota"}, "dry run")})
    r = Reconciler(as_kube(kube), Metrics(), identity="test")
    body = epd_body(1, 10)
    kube.stored[("EPDDeployment", NS, NAME)] = body
    r.epd_event(None, body)
    await queued(r)
    await r.full_pass(KEY)
    refused = kube.statuses()[-1]
    r.epd_event("MODIFIED", kube.stored[("EPDDeployment", NS, NAME)])
    assert await r.status_pass(KEY) == "success"
    assert "quota" in str(kube.statuses()[-1]["conditions"]) and kube.statuses()[-1] == refused


async def test_the_reconcilers_tasks_are_named():
    r = Reconciler(as_kube(RecordingKube()), Metrics(), identity="test", workers=2)
    task = asyncio.create_task(r.run())
    await asyncio.sleep(0.05)
    names = {t.get_name() for t in asyncio.all_tasks()}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert {"epd-worker-0", "epd-worker-1", "epd-resync", "epd-cache-audit"} <= names


async def test_a_failure_event_names_the_reporting_replica():
    kube = RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="operator-7")
    body = epd_body(1, 10)
    r.epd_event(None, body)
    await r._report_failure(KEY, OSError("boom"))
    ((_, kind, _, event),) = [c for c in kube.calls if c[0] == "create"]
    assert (kind, event["reason"], event["reportingInstance"]) == ("Event", "ReconcileFailed", "operator-7")
