"""The reconciler's runtime (controller/reconciler.py) around its passes: which events queue what, the
workers (a failed pass is retried and reported once per distinct failure), the resync timer, the cache
audit, and passes for an EPDDeployment that is gone or being deleted. On a recording stand-in for the API
server (tests/support/recording_kube.py); the passes themselves: test_reconciler.py and test_status*.py."""

from __future__ import annotations

import asyncio
import copy
import logging
import types
from typing import Any

import pytest

from epd_operator.controller import reconciler as reconciler_module
from epd_operator.controller.metrics import Metrics
from epd_operator.controller.reconciler import Reconciler, failure, router_endpoint
from epd_operator.controller.workqueue import FULL, STATUS
from epd_operator.kube import ApiError
from tests.support.recording_kube import RecordingKube, as_kube
from tests.unit.controller.test_reconciler import KEY, NAME, NS, UID, epd_body, queued


def child(kind: str = "Deployment", owner: str = NAME, instance: str = NAME) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {
            "name": f"{NAME}-decode",
            "namespace": NS,
            "uid": "uid-child",
            "resourceVersion": "3",
            "labels": {"app.kubernetes.io/instance": instance, "app.kubernetes.io/managed-by": "epd-operator"},
            "ownerReferences": [{"kind": "EPDDeployment", "name": owner, "uid": UID}],
        },
    }


def known(kube: RecordingKube | None = None) -> tuple[Reconciler, RecordingKube]:
    kube = kube or RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="test")
    body = epd_body(1, 10)
    kube.stored[("EPDDeployment", NS, NAME)] = body
    r.epd_event(None, body)
    return r, kube


def sample(r: Reconciler, name: str, **labels: str) -> float | None:
    return r.metrics.registry.get_sample_value(name, labels)


def test_what_went_wrong_in_words():
    assert failure(ValueError("bad spec")) == "bad spec"
    assert failure(TimeoutError()) == "no answer from the API server in time"
    assert failure(ConnectionResetError()) == "ConnectionResetError"


def test_the_router_endpoint_is_its_service_and_port():
    def service(name: str, port: int) -> dict[str, Any]:
        return {"kind": "Service", "metadata": {"name": name, "namespace": "ns"}, "spec": {"ports": [{"port": port}]}}

    deployment = {"kind": "Deployment", "metadata": {"name": "vl", "namespace": "ns"}}
    assert router_endpoint([deployment, service("vl-decode", 8000), service("vl", 80)], "vl") == "http://vl.ns.svc"
    assert router_endpoint([service("vl", 8000)], "vl") == "http://vl.ns.svc:8000"
    assert router_endpoint([deployment, service("other", 80)], "vl") is None


# ----------------------------------------------------------------------------- triggers


async def test_a_new_generation_queues_a_full_pass_and_one_already_reconciled_nothing():
    r, _ = known()
    assert await queued(r) == FULL
    assert r.known == {KEY: UID}
    assert sample(r, "epd_operator_epddeployments") == 1
    assert await r.full_pass(KEY) == "success"
    r.epd_event("MODIFIED", epd_body(1, 11))  # same generation (a status or metadata change)
    assert await queued(r) is None
    r.epd_event("MODIFIED", epd_body(2, 12))
    assert await queued(r) == FULL


async def test_a_deleted_epddeployment_is_forgotten():
    r, _ = known()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    assert sample(r, "epd_operator_deployment_phase", epd_namespace=NS, epd_name=NAME, phase="Progressing") == 1
    r._last_error[KEY] = "x"
    r.epd_event("DELETED", epd_body(1, 13))
    assert (r.known, r._reconciled, r._last_error, r._held) == ({}, {}, {}, {})
    assert sample(r, "epd_operator_epddeployments") == 0
    assert sample(r, "epd_operator_deployment_phase", epd_namespace=NS, epd_name=NAME, phase="Progressing") is None
    assert await queued(r) is None
    r.pod_event(
        "MODIFIED",
        {"kind": "Pod", "metadata": {"namespace": NS, "name": "p", "labels": {"app.kubernetes.io/instance": NAME}}},
    )
    assert await queued(r) is None


async def test_a_child_of_a_known_epddeployment_queues_a_status_pass_and_its_deletion_a_full_one():
    r, _ = known()
    await queued(r)
    r.child_event("MODIFIED", child())
    assert await queued(r) == STATUS
    r.child_event("DELETED", child())
    assert await queued(r) == FULL
    r.child_event("MODIFIED", child(owner="someone-else"))  # labelled ours, owned by another
    r.child_event("MODIFIED", child(instance="unknown", owner="unknown"))
    no_owner = child()
    del no_owner["metadata"]["ownerReferences"]
    r.child_event("MODIFIED", no_owner)
    assert await queued(r) is None


async def test_pods_refresh_the_status_only_after_a_first_full_pass():
    r, _ = known()
    await queued(r)
    pod = {"kind": "Pod", "metadata": {"namespace": NS, "name": "p", "labels": {"app.kubernetes.io/instance": NAME}}}
    r.pod_event("ADDED", pod)
    assert await queued(r) is None
    assert await r.full_pass(KEY) == "success"
    r.pod_event("MODIFIED", pod)
    assert await queued(r) == STATUS
    r.pod_event("MODIFIED", {"kind": "Pod", "metadata": {"namespace": NS, "name": "q"}})  # no instance label
    assert await queued(r) is None


async def test_resuming_leadership_queues_a_full_pass_for_every_known_epddeployment():
    r, _ = known()
    other = copy.deepcopy(epd_body(1, 10))
    other["metadata"].update(name="other", uid="uid-other")
    r.epd_event(None, other)
    for key in (KEY, (NS, "other")):
        r._reconciled[key] = r._reconciled.get(key, ("x", 0))
    await r.queue.get()
    await r.queue.get()
    r.queue.done(KEY)
    r.queue.done((NS, "other"))
    r.resume()
    assert sorted([await r.queue.get(), await r.queue.get()]) == [((NS, "other"), FULL), (KEY, FULL)]


# ----------------------------------------------------------------------------- passes with nothing to do


async def test_a_pass_for_an_epddeployment_gone_from_the_cache_forgets_it():
    r, _ = known()
    await queued(r)
    r.cache.forget(epd_body(1, 10))
    assert await r.full_pass(KEY) == "gone"
    assert r.known == {}
    r.known[KEY] = UID
    assert await r.status_pass(KEY) == "gone"
    assert r.known == {}


async def test_a_pass_for_an_epddeployment_being_deleted_writes_nothing():
    r, kube = known()
    await queued(r)
    deleting = epd_body(1, 11)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    r.epd_event("MODIFIED", deleting)
    assert await r.full_pass(KEY) == "gone"
    assert await r.status_pass(KEY) == "gone"
    assert kube.calls == [] and r.known == {KEY: UID}


async def test_an_unchanged_status_is_not_written_again():
    r, kube = known()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    writes = len(kube.statuses())
    r.epd_event("MODIFIED", kube.stored[("EPDDeployment", NS, NAME)])
    assert await r.status_pass(KEY) == "success"
    assert len(kube.statuses()) == writes


async def test_a_first_pass_applies_the_children_and_says_so_in_one_event():
    r, kube = known()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    events = [call[3] for call in kube.calls if call[0] == "create" and call[1] == "Event"]
    applied = [e for e in events if e["reason"] == "Applied"]
    assert len(applied) == 1 and applied[0]["type"] == "Normal"
    assert "Deployment vl-decode" in applied[0]["message"] and applied[0]["reportingInstance"] == "test"
    assert r.cache.get("Deployment", NS, f"{NAME}-decode") is not None  # recorded before its watch event


# ----------------------------------------------------------------------------- workers


class Failing(RecordingKube):
    """Refuses every status write with `error`."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error = error

    async def patch_status(self, resource, namespace, name, status):
        raise self.error


async def run_workers(r: Reconciler, until, timeout: float = 10.0) -> None:
    task = asyncio.create_task(r.run())
    try:
        async with asyncio.timeout(timeout):
            while not until():
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_worker_runs_queued_passes_and_counts_them():
    r, kube = known()
    r.workers = 2
    await run_workers(r, lambda: sample(r, "epd_operator_reconciles_total", kind="full", result="success") == 1)
    assert kube.statuses()
    applies = [c for c in kube.calls if c[0] == "apply"]
    assert applies  # a full pass: dry run, then apply
    assert sample(r, "epd_operator_reconcile_duration_seconds_count", kind="full") == 1
    decode = r.cache.get("Deployment", NS, f"{NAME}-decode")
    assert decode is not None
    decode["metadata"]["resourceVersion"] = "50"
    decode["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    r.child_event("MODIFIED", decode)  # drift: a status pass reports it, only a full pass would repair it
    await run_workers(r, lambda: sample(r, "epd_operator_reconciles_total", kind="status", result="success") == 1)
    assert [c for c in kube.calls if c[0] == "apply"] == applies
    assert r.queue._failures == {}


async def test_a_failed_pass_is_retried_counted_logged_and_reported_once(caplog):
    kube = Failing(ApiError(500, {"message": "etcd timeout"}, "PATCH status"))
    r, _ = known(kube)
    r.queue._base_delay = 0.01
    events = lambda: [c[3] for c in kube.calls if c[0] == "create" and c[1] == "Event"]  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="epd_operator.controller.reconciler"):
        await run_workers(r, lambda: (sample(r, "epd_operator_reconcile_errors_total", kind="full") or 0) >= 3)
    assert (sample(r, "epd_operator_reconciles_total", kind="full", result="error") or 0) >= 3
    (event,) = [e for e in events() if e["reason"] == "ReconcileFailed"]  # one Event for the same failure
    assert event["type"] == "Warning" and event["message"] == "PATCH status: HTTP 500: etcd timeout"
    assert r._last_error == {KEY: "PATCH status: HTTP 500: etcd timeout"}
    record = caplog.records[0]
    assert record.message.startswith("reconcile of ns/vl failed (retry in 0.0s): PATCH status: HTTP 500")
    assert not record.exc_info  # an API failure needs no traceback
    kube.error = ApiError(500, {"message": "other"}, "PATCH status")
    r.queue.add(KEY, FULL)  # a stopped run dropped its pending retries
    await run_workers(r, lambda: len([e for e in events() if e["reason"] == "ReconcileFailed"]) == 2)


async def test_a_bug_in_a_pass_is_logged_with_its_traceback_and_does_not_stop_the_worker(caplog):
    r, _ = known(Failing(KeyError("spec")))
    r.queue._base_delay = 5.0
    with caplog.at_level(logging.WARNING, logger="epd_operator.controller.reconciler"):
        await run_workers(r, lambda: bool(caplog.records))
    assert caplog.records[0].exc_info is not None
    assert "(retry in 5.0s): 'spec'" in caplog.records[0].message


async def test_a_success_after_failures_resets_the_backoff_and_the_reported_failure():
    kube = Failing(OSError("connection refused"))
    r, _ = known(kube)
    r.queue._base_delay = 0.01
    await run_workers(r, lambda: KEY in r._last_error)
    assert r.queue._failures[KEY] >= 1
    r.kube = as_kube(RecordingKube())
    r.kube.stored = kube.stored  # type: ignore[attr-defined]
    r.queue.add(KEY, FULL)
    await run_workers(r, lambda: KEY not in r._last_error)
    assert KEY not in r.queue._failures


async def test_a_failure_of_a_gone_epddeployment_posts_no_event():
    kube = RecordingKube()
    r = Reconciler(as_kube(kube), Metrics(), identity="test")
    await r._report_failure(KEY, OSError("x"))
    assert kube.calls == [] and r._last_error == {KEY: "x"}


# ----------------------------------------------------------------------------- timers


async def test_the_resync_timer_queues_a_full_pass_for_each_known_epddeployment(monkeypatch):
    r, _ = known()
    await queued(r)
    r._reconciled[KEY] = (UID, 1)
    spreads: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        spreads.append((a, b))
        return 1.0

    monkeypatch.setattr(reconciler_module, "random", types.SimpleNamespace(uniform=uniform))
    r.resync_seconds = 0.01
    task = asyncio.create_task(r._resync())
    assert await asyncio.wait_for(r.queue.get(), 5) == (KEY, FULL)
    task.cancel()
    assert spreads[0] == (0.9, 1.1)


class Listing(RecordingKube):
    """Answers LISTs from `lists` (plural -> items), or fails for the plurals in `broken`."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]], broken: set[str] = frozenset()):  # type: ignore[assignment]
        super().__init__()
        self.lists, self.broken = lists, broken
        self.listed: list[tuple[str, str | None, str | None]] = []

    async def list_with_version(self, resource, namespace, *, label_selector=None):
        self.listed.append((resource.plural, namespace, label_selector))
        if resource.plural in self.broken:
            raise OSError("connection reset")
        return self.lists.get(resource.plural, []), "100"


async def test_the_audit_lists_each_kind_per_namespace_and_repairs_what_the_watch_missed(caplog):
    r, _ = known()
    await queued(r)
    r.child_event("MODIFIED", child())
    await queued(r)
    kube = Listing({"epddeployments": [epd_body(1, 10)]}, broken={"services"})
    r.kube = as_kube(kube)
    with caplog.at_level(logging.INFO, logger="epd_operator.controller.reconciler"):
        await r.audit()
    assert kube.listed[0] == ("epddeployments", NS, None)
    assert {selector for plural, _, selector in kube.listed[1:]} == {"app.kubernetes.io/managed-by=epd-operator"}
    assert kube.listed[-1][0] == "pods" and {ns for _, ns, _ in kube.listed} == {NS}
    assert r.cache.get("Deployment", NS, f"{NAME}-decode") is None  # deleted unseen: dropped
    assert await queued(r) == FULL
    assert "ns/vl: Deployment deleted unseen by the watch; full pass" in caplog.messages
    assert "cache audit of services in ns failed: connection reset" in caplog.messages


async def test_the_audit_timer_runs_audits(monkeypatch):
    r, _ = known()
    audits = []

    async def audit() -> None:
        audits.append(1)

    monkeypatch.setattr(reconciler_module, "AUDIT_SECONDS", 0.01)
    monkeypatch.setattr(reconciler_module, "random", types.SimpleNamespace(uniform=lambda a, b: 1.0))
    monkeypatch.setattr(r, "audit", audit)
    task = asyncio.create_task(r._audits())
    async with asyncio.timeout(5):
        while len(audits) < 2:
            await asyncio.sleep(0.01)
    task.cancel()


async def test_run_stops_its_timers_when_cancelled():
    r, _ = known()
    r.queue.retry(KEY, FULL)  # a retry waiting on a timer
    task = asyncio.create_task(r.run())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert r.queue._timers == set()


# ----------------------------------------------------------------------------- converging


async def test_a_full_pass_repairs_drift_prunes_leftovers_and_says_so():
    r, kube = known()
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    decode = r.cache.get("Deployment", NS, f"{NAME}-decode")
    assert decode is not None
    drifted = copy.deepcopy(decode)
    drifted["metadata"]["resourceVersion"] = "50"
    drifted["spec"]["template"]["spec"]["containers"][0]["image"] = "someone/else:1"
    r.child_event("MODIFIED", drifted)
    leftover = child("ConfigMap")
    leftover.update(apiVersion="v1")
    leftover["metadata"].update(name=f"{NAME}-stale", uid="uid-stale")
    r.child_event("ADDED", leftover)
    kube.calls.clear()
    assert await r.full_pass(KEY) == "success"
    assert sample(r, "epd_operator_drift_repairs_total", kind="Deployment") == 1
    assert ("delete", "ConfigMap", NS, f"{NAME}-stale", "uid-stale") in kube.calls
    assert r.cache.get("ConfigMap", NS, f"{NAME}-stale") is None
    events = {c[3]["reason"]: c[3] for c in kube.calls if c[0] == "create" and c[1] == "Event"}
    assert events["Pruned"]["message"] == f"ConfigMap {NAME}-stale deleted (no longer in the spec)"
    assert events["Pruned"]["type"] == "Normal"
    assert events["Applied"]["message"] == (
        f"Deployment {NAME}-decode restored (spec.template.spec.containers[name=vllm].image had been changed)"
    )


async def test_a_plan_the_server_refuses_on_a_dry_run_is_not_applied():
    kube = RecordingKube(refuse={("Deployment", f"{NAME}-decode"): ApiError(422, {"message": "quota"}, "dry run")})
    r, _ = known(kube)
    await queued(r)
    assert await r.full_pass(KEY) == "success"
    assert kube.dry_runs() > 0
    assert [c for c in kube.calls if c[0] == "apply" and not c[4]] == []
    assert r._held == {}
    assert "quota" in str(kube.statuses()[-1])


async def test_a_write_the_server_refuses_after_its_dry_run_passed_is_reported_not_retried(caplog):
    """An admission webhook may judge real writes only: the objects written before the refusal are kept and
    cached, the refusal reaches the status like a dry run's, and the pass does not fail into retries."""
    refusal = ApiError(422, {"message": "denied by the webhook"}, "PATCH")
    kube = RecordingKube(refuse_writes={("Deployment", f"{NAME}-decode"): refusal})
    r, _ = known(kube)
    await queued(r)
    with caplog.at_level("WARNING", logger="epd_operator.controller.reconciler"):
        assert await r.full_pass(KEY) == "success"
    written = [c[1] for c in kube.calls if c[0] == "apply" and not c[4]]
    assert ("Deployment", f"{NAME}-decode") in written
    assert written[-1] == ("Deployment", f"{NAME}-decode")  # nothing after the refused one
    assert "denied by the webhook" in str(kube.statuses()[-1])
    (warning,) = [rec.getMessage() for rec in caplog.records if rec.levelname == "WARNING"]
    assert warning.startswith(f"{KEY[0]}/{KEY[1]}: ") and "denied by the webhook" in warning
    # What was written before the refusal is cached (the next pass may run before its watch events).
    assert all(r.cache.get(kind, KEY[0], name) is not None for kind, name in written[:-1])
    assert r.cache.get("Deployment", KEY[0], f"{NAME}-decode") is None
    # The Applied event names what was written, not the refused object nor what came after it.
    events = {c[3]["reason"]: c[3] for c in kube.calls if c[0] == "create" and c[1] == "Event"}
    assert events["Applied"]["message"] == "; ".join(f"{kind} {name} created" for kind, name in written[:-1])
    assert "Pruned" not in events
