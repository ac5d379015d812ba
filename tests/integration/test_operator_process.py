"""The real `epd-operator` console script against the real API server: CLI, probes, metrics, and
leader election between two replicas over a real Lease (only one ever acts; a standby takes over)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest

from tests.support.cluster import KubeView
from tests.support.operator_run import (
    EPD_API,
    OperatorProcess,
    create,
    deployed,
    epd,
    epd_doc,
    observed,
    operator_command,
    wait_until,
)
from tests.support.prom import sample_values

LEASE = ("coordination.k8s.io/v1", "Lease", "epd-operator")


@pytest.fixture
def cluster(kube: KubeView) -> KubeView:
    return kube


def lease_holder(kube: KubeView) -> str | None:
    lease = kube.get(*LEASE)
    return None if lease is None else lease["spec"].get("holderIdentity")


@contextlib.asynccontextmanager
async def operator(kube: KubeView, *extra: str, identity: str, role: str = "leader") -> AsyncIterator[OperatorProcess]:
    """A replica, yielded once /healthz reports `role` (leader, or standby beside a leader)."""
    async with OperatorProcess(
        kube.kubeconfig, "--namespace", kube.ns, "--identity", identity, "--resync-seconds", "0.5", *extra
    ) as process:
        await process.wait_for_role(role)
        yield process


async def test_the_console_script_reconciles_and_serves_probes_and_metrics(cluster):
    async with operator(cluster, identity="solo") as op:
        assert lease_holder(cluster) == "solo"
        await create(cluster, epd_doc())
        await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
        await observed(cluster, 1)
        health = await op.healthz()
        assert health == {"http_status": 200, "status": "ok", "role": "leader", "identity": "solo", "problems": []}
        await wait_until(lambda: op.metric("epd_operator_reconciles_total", kind="full", result="success"), 10)
        assert await op.metric("epd_operator_api_writes_total", verb="PATCH", kind="Deployment") == 3
        assert await op.metric("epd_operator_leader") == 1
        assert await op.metric("epd_operator_epddeployments") == 1
        assert sample_values(await op.metrics_text(), "epd_operator_reconcile_duration_seconds_bucket")
        assert await op.stop() == 0, op.output
    assert lease_holder(cluster) == ""  # released on SIGTERM: a standby need not wait for expiry


async def test_two_replicas_never_both_act_and_the_standby_takes_over(cluster):
    async with (
        operator(cluster, identity="first") as first,
        operator(cluster, identity="second", role="standby") as second,
    ):
        await create(cluster, epd_doc())
        await observed(cluster, 1)
        # (the metric counts a pass once it returns, just after the status it wrote)
        await wait_until(lambda: first.metric("epd_operator_reconciles_total"), 10, "the leader made no pass")
        assert await second.metric("epd_operator_reconciles_total") == 0
        assert await second.metric("epd_operator_api_writes_total") == 0  # not even its Lease: it only reads it

        assert await first.stop() == 0, first.output  # a rolling update stops the leader
        await second.wait_for_role("leader")
        assert lease_holder(cluster) == "second"
        await create(cluster, epd_doc(name="vl2"))
        await observed(cluster, 1, name="vl2")
        assert await second.metric("epd_operator_reconciles_total", kind="full") > 0


async def test_a_crashed_leader_is_replaced_after_its_lease_expires(cluster):
    async with (
        operator(cluster, identity="first") as first,
        operator(cluster, identity="second", role="standby") as second,
    ):
        await first.stop(signal.SIGKILL)  # no release: the Lease must expire
        assert lease_holder(cluster) == "first"
        await second.wait_for_role("leader")
        assert lease_holder(cluster) == "second"
        transitions = cluster.get(*LEASE)["spec"]["leaseTransitions"]
        assert transitions == 1


async def test_a_leader_that_loses_its_lease_stops_acting_stands_by_and_leads_again(cluster):
    async with operator(cluster, "--lease-duration", "6", identity="first") as op:
        lease = cluster.get(*LEASE)
        # Someone else takes the Lease over (as a partitioned leader would find on its return), and
        # then never renews it.
        lease["spec"]["holderIdentity"] = "usurper"
        path = f"/apis/coordination.k8s.io/v1/namespaces/{cluster.ns}/leases/epd-operator"
        status, body = cluster.request("PUT", path, lease, content_type="application/json")
        assert status == 200, body
        await op.wait_for_role("standby")
        assert "leadership lost" in op.output
        health = await op.healthz()  # what the liveness probe reads: a standby is healthy, not restarted
        assert health is not None
        assert (health["http_status"], health["status"], health["problems"]) == (200, "ok", []), health
        assert await op.metric("epd_operator_leader") == 0
        passes = await op.metric("epd_operator_reconciles_total")
        await create(cluster, epd_doc())
        await asyncio.sleep(0.5)
        assert cluster.get("apps/v1", "Deployment", "vl-encoder") is None  # a standby writes nothing
        assert await op.metric("epd_operator_reconciles_total") == passes

        # The usurper's Lease expires: the same process leads again, its watches kept, and acts.
        await op.wait_for_role("leader")
        assert lease_holder(cluster) == "first"
        await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
        await observed(cluster, 1)
        assert op.returncode is None and await op.metric("epd_operator_leader") == 1


def test_the_scope_must_be_chosen():
    result = subprocess.run(operator_command(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "one of the arguments -n/--namespace -A/--all-namespaces is required" in result.stderr


async def test_without_credentials_it_says_so(tmp_path):
    process = await asyncio.create_subprocess_exec(
        *operator_command(),
        "-A",
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "no Kubernetes credentials" in out.decode()


async def test_epds_outside_the_watched_namespaces_are_left_alone(cluster, tmp_path):
    from tests.support.cluster import new_namespace

    elsewhere = new_namespace(cluster.cluster, tmp_path, "elsewhere")
    async with operator(cluster, identity="scoped"):
        await create(elsewhere, epd_doc(name="far"))
        await create(cluster, epd_doc())
        await observed(cluster, 1)
        assert elsewhere.list("apps/v1", "Deployment") == []
        assert "status" not in (elsewhere.get(EPD_API, "EPDDeployment", "far") or {})
        assert epd(cluster)["status"]["phase"] in ("Progressing", "Ready")
