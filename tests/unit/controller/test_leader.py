"""Leader election on a Lease (controller/leader.py), against a stand-in Lease store with the API server's
optimistic concurrency (a write with a stale resourceVersion is a 409) and a clock of the test's own.
Two operators electing against the real API server: tests/integration."""

from __future__ import annotations

import asyncio
import copy
import logging
import types
from typing import Any, cast

import pytest

from epd_operator.controller import leader
from epd_operator.controller.leader import LeaseElector
from epd_operator.kube import LEASE, ApiError, Kube


class Leases:
    """One Lease as the API server keeps it: create (409 if it exists), get, replace (409 if stale)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.fail: dict[str, list[BaseException]] = {}  # verb -> raised by its next calls, in order

    def _maybe_fail(self, verb: str) -> None:
        if self.fail.get(verb):
            raise self.fail[verb].pop(0)

    async def get(self, resource, namespace, name):
        assert (resource, namespace, name) == (LEASE, "ops", "epd-operator")
        self._maybe_fail("get")
        return copy.deepcopy(self.lease)

    async def create(self, resource, namespace, obj):
        assert (resource, namespace) == (LEASE, "ops")
        self._maybe_fail("create")
        if self.lease is not None:
            raise ApiError(409, {"reason": "AlreadyExists"}, "POST leases")
        self.writes.append(("create", copy.deepcopy(obj)))
        self.version += 1
        self.lease = {**copy.deepcopy(obj), "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        return self.lease

    async def replace(self, resource, namespace, obj):
        assert (resource, namespace) == (LEASE, "ops")
        self._maybe_fail("replace")
        assert self.lease is not None
        if obj["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, {"reason": "Conflict"}, "PUT leases")
        self.writes.append(("replace", copy.deepcopy(obj)))
        self.version += 1
        self.lease = {**copy.deepcopy(obj), "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        return self.lease

    def held_by(self, holder: str, renew: str = "t0", transitions: int = 0, duration: int = 15) -> None:
        self.version += 1
        self.lease = {
            "metadata": {"name": "epd-operator", "namespace": "ops", "resourceVersion": str(self.version)},
            "spec": {
                "holderIdentity": holder,
                "renewTime": renew,
                "acquireTime": "t-acquired",
                "leaseTransitions": transitions,
                "leaseDurationSeconds": duration,
            },
        }


@pytest.fixture
def clock(monkeypatch):
    """The elector's monotonic clock, moved by the test; its wall clock reads NOW."""
    now = [1000.0]
    monkeypatch.setattr(leader, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(leader, "_micro_time", lambda: "NOW")
    return now


def elector(leases: Leases, identity: str = "me", duration: float = 15.0) -> LeaseElector:
    return LeaseElector(cast(Kube, leases), "ops", "epd-operator", identity, lease_duration=duration)


def test_the_timings_follow_the_lease_duration():
    e = elector(Leases(), duration=15.0)
    assert (e.renew_interval, e.renew_deadline, e.retry_interval) == (5.0, 10.0, 1.5)
    assert elector(Leases(), duration=0.3).retry_interval == 0.05
    assert e.is_leader is False


async def test_no_lease_yet_is_created_held_by_us(clock):
    leases = Leases()
    e = elector(leases, duration=2.5)
    assert await e._try_acquire_or_renew()
    assert leases.writes == [
        (
            "create",
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "epd-operator", "namespace": "ops"},
                "spec": {
                    "holderIdentity": "me",
                    "leaseDurationSeconds": 3,
                    "acquireTime": "NOW",
                    "renewTime": "NOW",
                    "leaseTransitions": 0,
                },
            },
        )
    ]
    assert e._last_renewal == 1000.0
    assert elector(Leases(), duration=0.2).lease_duration == 0.2
    tiny = Leases()
    assert await elector(tiny, duration=0.2)._try_acquire_or_renew()
    assert tiny.writes[0][1]["spec"]["leaseDurationSeconds"] == 1


async def test_a_lease_created_by_another_candidate_first_is_not_ours(clock):
    leases = Leases()
    e = elector(leases)
    leases.fail = {"create": [ApiError(409, {}, "POST")]}
    assert not await e._try_acquire_or_renew()
    leases.fail = {"create": [ApiError(403, {}, "POST")]}
    with pytest.raises(ApiError):
        await e._try_acquire_or_renew()


async def test_anothers_lease_is_taken_only_after_it_stood_unchanged_for_its_duration(clock):
    leases = Leases()
    leases.held_by("other", transitions=2, duration=10)
    e = elector(leases, duration=15.0)
    assert not await e._try_acquire_or_renew()
    clock[0] += 9.5
    assert not await e._try_acquire_or_renew()
    leases.held_by("other", renew="t1", transitions=2, duration=10)  # it renewed: the wait starts again
    clock[0] += 0.5
    assert not await e._try_acquire_or_renew()  # seen changed: 10 s from now
    clock[0] += 9.5
    assert not await e._try_acquire_or_renew()
    assert leases.writes == []
    clock[0] += 0.5  # the Lease's own duration (10 s), not ours, on our clock since the last change
    assert await e._try_acquire_or_renew()
    ((_, written),) = leases.writes
    assert written["spec"] == {
        "holderIdentity": "me",
        "renewTime": "NOW",
        "acquireTime": "NOW",
        "leaseTransitions": 3,
        "leaseDurationSeconds": 15,
    }
    assert e._last_renewal == clock[0]


async def test_our_own_lease_is_renewed_keeping_its_acquire_time(clock):
    leases = Leases()
    leases.held_by("me", transitions=4)
    assert await elector(leases)._try_acquire_or_renew()
    ((_, written),) = leases.writes
    assert (written["spec"]["acquireTime"], written["spec"]["renewTime"]) == ("t-acquired", "NOW")
    assert written["spec"]["leaseTransitions"] == 4


async def test_a_released_lease_is_taken_at_once_without_a_transition(clock):
    leases = Leases()
    leases.held_by("", transitions=4)
    assert await elector(leases)._try_acquire_or_renew()
    assert leases.writes[0][1]["spec"]["leaseTransitions"] == 4
    assert leases.writes[0][1]["spec"]["acquireTime"] == "NOW"
    leases.lease = {"metadata": {"name": "epd-operator", "resourceVersion": "50"}}  # no spec at all
    assert await elector(leases, identity="third")._try_acquire_or_renew()
    assert leases.writes[1][1]["spec"]["leaseTransitions"] == 0


async def test_a_write_that_lost_the_race_is_not_leadership(clock):
    leases = Leases()
    leases.held_by("me")
    e = elector(leases)
    leases.fail = {"replace": [ApiError(409, {}, "PUT")]}  # another candidate wrote it since we read it
    assert not await e._try_acquire_or_renew()
    leases.fail = {"replace": [ApiError(500, {}, "PUT")]}
    with pytest.raises(ApiError):
        await e._try_acquire_or_renew()
    assert leases.writes == []


# ----------------------------------------------------------------------------- the loops, on real time with short leases


async def test_acquire_stands_by_then_leads_once_the_holder_lets_go(caplog):
    leases = Leases()
    leases.held_by("other")
    leases.fail = {"get": [OSError("connection refused")]}
    e = elector(leases, duration=0.03)
    with caplog.at_level(logging.INFO, logger="epd_operator.controller.leader"):
        task = asyncio.create_task(e.acquire())
        await asyncio.sleep(0.05)
        assert not task.done() and not e.is_leader
        leases.held_by("")  # released
        await asyncio.wait_for(task, 5)
    assert e.is_leader
    assert caplog.messages[0] == "leader election: connection refused"
    assert caplog.messages[1] == "standing by: Lease ops/epd-operator is held by ?"
    assert caplog.messages.count("standing by: Lease ops/epd-operator is held by ?") == 1
    assert caplog.messages[-1] == "leading: holding Lease ops/epd-operator as me"


async def test_standing_by_names_the_holder(caplog):
    leases = Leases()
    leases.held_by("operator-b")
    e = elector(leases, duration=60)
    with caplog.at_level(logging.INFO, logger="epd_operator.controller.leader"):
        task = asyncio.create_task(e.acquire())
        await asyncio.sleep(0.02)
        task.cancel()
    assert caplog.messages == ["standing by: Lease ops/epd-operator is held by operator-b"]


async def test_hold_renews_until_another_holder_took_over(caplog):
    leases = Leases()
    e = elector(leases, duration=0.6)
    await e.acquire()
    task = asyncio.create_task(e.hold())
    await asyncio.sleep(0.5)
    assert not task.done() and len(leases.writes) >= 2  # created, renewed
    with caplog.at_level(logging.ERROR, logger="epd_operator.controller.leader"):
        leases.held_by("usurper")
        await asyncio.wait_for(task, 5)
    assert e.is_leader is False
    assert caplog.messages == ["leadership lost: Lease ops/epd-operator now held by usurper"]


async def test_hold_gives_up_when_renewals_fail_until_the_deadline(caplog):
    leases = Leases()
    e = elector(leases, duration=0.3)
    await e.acquire()
    leases.fail = {"get": [OSError("network down")] * 1000}
    with caplog.at_level(logging.WARNING, logger="epd_operator.controller.leader"):
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(e.hold(), 5)
        elapsed = asyncio.get_running_loop().time() - started
    assert e.is_leader is False
    assert 0.2 <= elapsed < 3.0  # the renew deadline (2/3 of the lease) after the last renewal, not before
    assert "could not renew the Lease: network down" in caplog.messages
    assert caplog.messages[-1] == "leadership lost: the Lease was not renewed within 0.2s"


async def test_hold_survives_one_failed_renewal(caplog):
    leases = Leases()
    e = elector(leases, duration=1.5)
    await e.acquire()
    leases.fail = {"get": [OSError("blip")]}
    task = asyncio.create_task(e.hold())
    await asyncio.sleep(1.0)
    assert not task.done() and e.is_leader
    task.cancel()


async def test_release_hands_the_lease_back_only_if_we_hold_it(caplog, clock):
    leases = Leases()
    e = elector(leases)
    await e.release()  # not leading: nothing to hand back
    assert leases.writes == []
    await e.acquire()
    with caplog.at_level(logging.INFO, logger="epd_operator.controller.leader"):
        await e.release()
    assert e.is_leader is False
    (_, released) = leases.writes[-1]
    assert (released["spec"]["holderIdentity"], released["spec"]["leaseDurationSeconds"]) == ("", 1)
    assert released["spec"]["renewTime"] == "NOW" and e.is_leader is False
    assert caplog.messages == ["released Lease ops/epd-operator"]
    e.is_leader = True
    leases.held_by("other")
    await e.release()
    assert leases.writes[-1] == ("replace", released)
    e.is_leader = True
    leases.lease = None
    await e.release()
    assert e.is_leader is False


async def test_a_failed_release_is_only_a_warning(caplog):
    leases = Leases()
    e = elector(leases)
    await e.acquire()
    leases.fail = {"get": [OSError("gone")]}
    with caplog.at_level(logging.WARNING, logger="epd_operator.controller.leader"):
        await e.release()
    assert caplog.messages == ["could not release the Lease (a standby takes over when it expires): gone"]
    assert e.is_leader is False
