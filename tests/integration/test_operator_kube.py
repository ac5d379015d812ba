"""The operator's API client and Lease elector against the real API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from epd_operator.controller.leader import LeaseElector
from epd_operator.kube import CHILD_RESOURCES, LEASE, ApiError, Credentials, Kube
from tests.support.cluster import KubeView

CONFIGMAP = CHILD_RESOURCES["ConfigMap"]


@pytest.fixture
def ns(kube: KubeView) -> KubeView:
    return kube


@pytest.fixture
async def client(ns: KubeView) -> AsyncIterator[Kube]:
    writes: list[tuple[str, str]] = []
    async with Kube(ns.credentials, on_write=lambda verb, kind: writes.append((verb, kind))) as c:
        c.writes = writes  # type: ignore[attr-defined]
        yield c


def configmap(ns: KubeView, name: str, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns.ns, "labels": {"app": "x"}},
        "data": data,
    }


async def test_apply_list_and_delete(client: Kube, ns: KubeView):
    kube, NS = client, ns.ns
    created = await kube.apply(configmap(ns, "a", k="1"))
    assert created["data"] == {"k": "1"}
    assert [e["manager"] for e in created["metadata"]["managedFields"]] == ["epd-operator"]
    await kube.apply(configmap(ns, "b"))
    listed = await kube.list(CONFIGMAP, NS, labels={"app": "x"})
    assert sorted(o["metadata"]["name"] for o in listed) == ["a", "b"]
    assert all(o["kind"] == "ConfigMap" and o["apiVersion"] == "v1" for o in listed)  # complete objects
    assert await kube.delete(CONFIGMAP, NS, "a", uid="not-its-uid") is False  # a same-named successor is safe
    assert await kube.delete(CONFIGMAP, NS, "a", uid=created["metadata"]["uid"]) is True
    assert await kube.get(CONFIGMAP, NS, "a") is None
    assert await kube.delete(CONFIGMAP, NS, "a") is False
    assert kube.writes == [  # type: ignore[attr-defined]
        ("PATCH", "ConfigMap"),
        ("PATCH", "ConfigMap"),
        ("DELETE", "ConfigMap"),
        ("DELETE", "ConfigMap"),
        ("DELETE", "ConfigMap"),
    ]


async def test_discovery_names_what_a_group_version_serves_and_404s_one_it_does_not(client: Kube):
    core = await client.served_resources("v1")
    assert {"configmaps", "pods", "pods/status"} <= core
    assert {"deployments", "deployments/scale"} <= await client.served_resources("apps/v1")
    with pytest.raises(ApiError) as missing:
        await client.served_resources("no-such-group.example.com/v1")
    assert missing.value.status == 404
    assert client.writes == []  # type: ignore[attr-defined]


async def test_errors_carry_the_servers_message(client: Kube, ns: KubeView):
    with pytest.raises(ApiError) as caught:
        await client.apply(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Bad_Name", "namespace": ns.ns}}
        )
    assert caught.value.status == 422 and "Bad_Name" in str(caught.value)
    with pytest.raises(ApiError) as unknown:  # strict field validation: a typo is an error, not silently dropped
        await client.apply({**configmap(ns, "c"), "dataa": {"k": "v"}})
    # (kube-apiserver 1.37 answers an unknown field in a server-side apply with a 500)
    assert ".dataa: field not declared in schema" in str(unknown.value), unknown.value


async def test_a_dry_run_apply_persists_nothing_and_is_not_counted_as_a_write(client: Kube, ns: KubeView):
    answer = await client.apply(configmap(ns, "d", k="1"), dry_run=True)
    assert answer["data"] == {"k": "1"}
    assert await client.get(CONFIGMAP, ns.ns, "d") is None
    assert client.writes == []  # type: ignore[attr-defined]


async def test_a_refused_token_is_renewed_once(ns: KubeView):
    # Service-account tokens rotate: on a 401 the client logs in again, once.
    logins = []

    ca = str(ns.cluster.pki / "ca.crt")

    tokens = iter(["expired-token", ns.cluster.admin_token, "expired-again"])

    async def credentials() -> Credentials:
        token = next(tokens)
        logins.append(token)
        return Credentials.from_token(ns.url, token, ca_path=ca)

    async with Kube(credentials) as client:
        assert await client.get(CONFIGMAP, ns.ns, "c") is None  # 401 with the stale token, then 404 with the new
        assert logins == ["expired-token", ns.cluster.admin_token]
        assert client._retired == []  # only the token changed: the connection pool was kept

    async def wrong() -> Credentials:
        return Credentials.from_token(ns.url, "wrong", ca_path=ca)

    async with Kube(wrong) as client:
        with pytest.raises(ApiError, match="401") as refused:
            await client.get(CONFIGMAP, ns.ns, "c")
        assert refused.value.status == 401 and refused.value.reason == "Unauthorized", refused.value.body


async def test_only_one_of_racing_candidates_wins_and_the_other_waits_for_expiry(client: Kube, ns: KubeView):
    kube, NS = client, ns.ns
    a = LeaseElector(kube, NS, "race", "a", lease_duration=1.0)
    b = LeaseElector(kube, NS, "race", "b", lease_duration=1.0)
    results = await asyncio.gather(a._try_acquire_or_renew(), b._try_acquire_or_renew())
    assert sorted(results) == [False, True]
    winner, loser = (a, b) if results[0] else (b, a)
    assert (ns.get(LEASE.api_version, "Lease", "race") or {})["spec"]["holderIdentity"] == winner.identity
    assert await loser._try_acquire_or_renew() is False  # freshly renewed: not expired
    assert await winner._try_acquire_or_renew() is True  # renewals keep it
    # The winner stops renewing (a crash). Expiry is measured on the candidate's own clock, from
    # when it first saw the record that then stayed unchanged for a whole lease duration.
    assert await loser._try_acquire_or_renew() is False
    await asyncio.sleep(1.1)
    assert await loser._try_acquire_or_renew() is True
    lease = (ns.get(LEASE.api_version, "Lease", "race") or {})["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == (loser.identity, 1)


async def test_a_released_lease_is_taken_at_once(client: Kube, ns: KubeView):
    kube, NS = client, ns.ns
    a = LeaseElector(kube, NS, "handover", "a", lease_duration=30.0)
    b = LeaseElector(kube, NS, "handover", "b", lease_duration=30.0)
    await asyncio.wait_for(a.acquire(), 5)
    assert await b._try_acquire_or_renew() is False
    await a.release()
    await asyncio.wait_for(b.acquire(), 5)
    assert b.is_leader and not a.is_leader
