"""The operator's API client and Lease elector against the API emulator."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import kopf
import pytest

from epd_operator.controller.kube import CHILD_RESOURCES, LEASE, ApiError, Kube
from epd_operator.controller.leader import LeaseElector
from tests.support.apiserver import StrictKubernetesEmulator

NS = "default"
CONFIGMAP = CHILD_RESOURCES["ConfigMap"]


@pytest.fixture
async def kube(apiserver_url: str) -> AsyncIterator[Kube]:
    writes: list[tuple[str, str]] = []
    async with Kube(lambda: kopf.ConnectionInfo(server=apiserver_url, insecure=True),
                    on_write=lambda verb, kind: writes.append((verb, kind))) as client:
        client.writes = writes  # type: ignore[attr-defined]
        yield client


def configmap(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS,
                                                                  "labels": {"app": "x"}}, "data": data}


async def test_apply_list_and_delete(kube: Kube, apiserver: StrictKubernetesEmulator):
    created = await kube.apply(configmap("a", k="1"))
    assert created["data"] == {"k": "1"}
    assert [e["manager"] for e in created["metadata"]["managedFields"]] == ["epd-operator"]
    await kube.apply(configmap("b"))
    listed = await kube.list(CONFIGMAP, NS, labels={"app": "x"})
    assert sorted(o["metadata"]["name"] for o in listed) == ["a", "b"]
    assert all(o["kind"] == "ConfigMap" and o["apiVersion"] == "v1" for o in listed)  # complete objects
    assert await kube.delete(CONFIGMAP, NS, "a", uid="not-its-uid") is False  # a same-named successor is safe
    assert await kube.delete(CONFIGMAP, NS, "a", uid=created["metadata"]["uid"]) is True
    assert await kube.get(CONFIGMAP, NS, "a") is None
    assert await kube.delete(CONFIGMAP, NS, "a") is False
    assert kube.writes == [("PATCH", "ConfigMap"), ("PATCH", "ConfigMap"), ("DELETE", "ConfigMap"),  # type: ignore[attr-defined]
                           ("DELETE", "ConfigMap"), ("DELETE", "ConfigMap")]


async def test_errors_carry_the_servers_message(kube: Kube):
    with pytest.raises(ApiError) as caught:
        await kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name", "namespace": NS}})
    assert caught.value.status == 422 and "Bad_Name" in str(caught.value)


async def test_an_expired_token_is_renewed_once(kube: Kube, apiserver: StrictKubernetesEmulator):
    apiserver.inject_failure("GET", r"/configmaps/c$", code=401, times=1)
    assert await kube.get(CONFIGMAP, NS, "c") is None
    apiserver.inject_failure("GET", r"/configmaps/c$", code=401, times=2)
    with pytest.raises(ApiError, match="401"):
        await kube.get(CONFIGMAP, NS, "c")


async def test_only_one_of_racing_candidates_wins_and_the_other_waits_for_expiry(kube: Kube,
                                                                               apiserver: StrictKubernetesEmulator):
    a = LeaseElector(kube, NS, "race", "a", lease_duration=1.0)
    b = LeaseElector(kube, NS, "race", "b", lease_duration=1.0)
    results = await asyncio.gather(a._try_acquire_or_renew(), b._try_acquire_or_renew())
    assert sorted(results) == [False, True]
    winner, loser = (a, b) if results[0] else (b, a)
    assert apiserver.get_object(LEASE.api_version, "Lease", "race", NS)["spec"]["holderIdentity"] == winner.identity
    assert await loser._try_acquire_or_renew() is False  # freshly renewed: not expired
    assert await winner._try_acquire_or_renew() is True  # renewals keep it
    # The winner stops renewing (a crash). Expiry is measured on the candidate's own clock, from
    # when it first saw the record that then stayed unchanged for a whole lease duration.
    assert await loser._try_acquire_or_renew() is False
    await asyncio.sleep(1.1)
    assert await loser._try_acquire_or_renew() is True
    lease = apiserver.get_object(LEASE.api_version, "Lease", "race", NS)["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == (loser.identity, 1)


async def test_a_released_lease_is_taken_at_once(kube: Kube):
    a = LeaseElector(kube, NS, "handover", "a", lease_duration=30.0)
    b = LeaseElector(kube, NS, "handover", "b", lease_duration=30.0)
    await asyncio.wait_for(a.acquire(), 5)
    assert await b._try_acquire_or_renew() is False
    await a.release()
    await asyncio.wait_for(b.acquire(), 5)
    assert b.is_leader and not a.is_leader
