"""The leader elector (controller/leader.py) on a simulated clock: the Lease's timestamps, how long a
renewal may take, when a holder gives up, and what it records of the Lease it watches."""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import time
import types
from typing import Any

import pytest

from epd_operator.controller import leader
from tests.unit.controller.test_leader import Leases, elector

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


@pytest.fixture
def utc_plus_five_thirty():
    """The process runs in a zone ahead of UTC (by a non-whole hour), as a node's may be."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "IST-5:30"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_lease_timestamps_are_utc_micro_times(utc_plus_five_thirty):
    before = datetime.datetime.now(datetime.UTC)
    stamp = leader._micro_time()
    after = datetime.datetime.now(datetime.UTC)
    parsed = datetime.datetime.strptime(stamp, MICRO_TIME).replace(tzinfo=datetime.UTC)
    assert before - datetime.timedelta(microseconds=1) <= parsed <= after, stamp


class Sim:
    """The elector's clock and its asyncio sleeps and timeouts, simulated: a sleep moves the clock at once,
    and a renewal that does not answer takes the whole timeout it was given, then times out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        self.timeouts: list[float] = []
        self.stamps = 0
        monkeypatch.setattr(leader, "time", types.SimpleNamespace(monotonic=lambda: self.now))
        monkeypatch.setattr(leader, "asyncio", types.SimpleNamespace(sleep=self.sleep, wait_for=self.wait_for))
        monkeypatch.setattr(leader, "_micro_time", self.micro_time)

    def micro_time(self) -> str:
        self.stamps += 1
        return f"T{self.stamps}"

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)

    async def wait_for(self, coro: Any, timeout: float | None) -> Any:
        self.timeouts.append(timeout if timeout is not None else float("inf"))
        task = asyncio.ensure_future(coro)
        for _ in range(3):
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        task.cancel()
        assert timeout is not None and timeout < 60, f"a renewal was given {timeout}s"
        self.now += timeout
        raise TimeoutError


class Hanging(Leases):
    """A Lease store whose reads stop answering once `hang` is set."""

    hang = False

    async def get(self, resource, namespace, name):
        if self.hang:
            await asyncio.Event().wait()
        return await super().get(resource, namespace, name)


async def test_a_renewal_that_does_not_answer_is_cut_at_the_renew_deadline(monkeypatch, caplog):
    sim = Sim(monkeypatch)
    leases = Hanging()
    e = elector(leases, duration=15.0)  # renew every 5 s, deadline 10 s after the last renewal
    await e.acquire()
    assert e.is_leader is True
    leases.hang = True
    with caplog.at_level(logging.WARNING, logger="epd_operator.controller.leader"):
        await e.hold()
    assert sim.timeouts == [5.0]  # slept 5 s, so 5 s were left of the deadline
    assert sim.now == 1010.0  # gave up at the deadline itself, with no further try
    assert e.is_leader is False
    assert caplog.messages == [
        "could not renew the Lease: TimeoutError",
        "leadership lost: the Lease was not renewed within 10.0s",
    ]


async def test_renewals_that_fail_are_retried_with_what_is_left_of_the_deadline(monkeypatch):
    sim = Sim(monkeypatch)
    leases = Leases()
    e = elector(leases, duration=15.0)  # retry every 1.5 s
    await e.acquire()
    leases.fail = {"get": [OSError("network down")] * 100}
    await e.hold()
    # tries at 1005, 1006.5, 1008, 1009.5, and once at 1011 with the least timeout, as the deadline passed
    assert sim.timeouts == [5.0, 3.5, 2.0, 0.5, 0.01]
    assert e.is_leader is False


async def test_a_leader_that_finds_the_lease_recreated_by_another_stops(monkeypatch, caplog):
    Sim(monkeypatch)
    leases = Leases()
    e = elector(leases)
    await e.acquire()  # it created the Lease: it has not watched anyone else's record
    leases.lease = None  # deleted, and created by another candidate between our read and our create
    leases.fail = {"create": [leader.ApiError(409, {"reason": "AlreadyExists"}, "POST leases")]}
    with caplog.at_level(logging.ERROR, logger="epd_operator.controller.leader"):
        await e.hold()
    assert e.is_leader is False
    assert caplog.messages == ["leadership lost: Lease ops/epd-operator now held by ?"]


async def test_renewals_and_the_release_stamp_the_time_of_the_write(monkeypatch):
    Sim(monkeypatch)
    leases = Leases()
    e = elector(leases)
    await e.acquire()
    assert leases.lease is not None and leases.lease["spec"]["renewTime"] == "T1"
    assert await e._try_acquire_or_renew()
    assert leases.lease["spec"]["renewTime"] == "T2"
    await e.release()
    assert leases.lease["spec"]["renewTime"] == "T3" and leases.lease["spec"]["holderIdentity"] == ""
    assert e.is_leader is False


async def test_any_write_to_anothers_lease_restarts_the_wait(monkeypatch):
    """The holder is alive as long as its Lease changes: a write that leaves renewTime as it was (another
    field, or the same timestamp again) still resets the candidate's wait."""
    sim = Sim(monkeypatch)
    leases = Leases()
    leases.held_by("other", renew="t0", duration=10)
    e = elector(leases)
    assert not await e._try_acquire_or_renew()
    sim.now += 9.0
    leases.held_by("other", renew="t0", duration=10)  # a new resourceVersion, the same record otherwise
    assert not await e._try_acquire_or_renew()
    sim.now += 9.0
    assert not await e._try_acquire_or_renew()  # 9 s since the record changed, not 18
    sim.now += 1.0
    assert await e._try_acquire_or_renew()


async def test_a_lease_without_a_duration_expires_after_ours(monkeypatch):
    sim = Sim(monkeypatch)
    leases = Leases()
    leases.held_by("other")
    assert leases.lease is not None
    del leases.lease["spec"]["leaseDurationSeconds"]
    e = elector(leases, duration=4.2)  # written as 5 s
    assert not await e._try_acquire_or_renew()
    sim.now += 4.9
    assert not await e._try_acquire_or_renew()
    sim.now += 0.1
    assert await e._try_acquire_or_renew()
    assert leases.lease["spec"]["holderIdentity"] == "me"


async def test_standing_by_is_announced_once(monkeypatch, caplog):
    sim = Sim(monkeypatch)
    leases = Leases()
    leases.held_by("other", duration=10)
    e = elector(leases, duration=3.0)  # tries every second
    with caplog.at_level(logging.INFO, logger="epd_operator.controller.leader"):
        await e.acquire()  # takes the Lease once it stood unchanged for its 10 s
    assert sim.now == 1010.0
    assert caplog.messages == [
        "standing by: Lease ops/epd-operator is held by other",
        "leading: holding Lease ops/epd-operator as me",
    ]
    assert e.is_leader is True
