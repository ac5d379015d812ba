"""The real `epd-operator` console script against the API emulator: CLI, probes, metrics, and
leader election between two replicas (only one ever acts; a standby takes over)."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest

from tests.support.apiserver import StrictKubernetesEmulator
from tests.support.operator_run import (EPD_API, NS, OperatorProcess, api_request, create, deployed, epd, epd_crd, epd_doc,
                                        observed, operator_command, wait_until)

LEASE = ("coordination.k8s.io/v1", "Lease", "epd-operator", NS)


@pytest.fixture
def cluster(apiserver: StrictKubernetesEmulator) -> StrictKubernetesEmulator:
    apiserver.create_object(epd_crd())
    return apiserver


def lease_holder(apiserver: StrictKubernetesEmulator) -> str | None:
    lease = apiserver.get_object(*LEASE)
    return None if lease is None else lease["spec"].get("holderIdentity")


@contextlib.asynccontextmanager
async def operator(kubeconfig, *extra: str, identity: str, role: str = "leader") -> AsyncIterator[OperatorProcess]:
    """A replica, yielded once /healthz reports `role` (leader, or standby beside a leader)."""
    async with OperatorProcess(kubeconfig, "--namespace", NS, "--identity", identity, "--resync-seconds", "0.5",
                               *extra) as process:
        await process.wait_for_role(role)
        yield process


async def test_the_console_script_reconciles_and_serves_probes_and_metrics(cluster, apiserver_url, kubeconfig):
    async with operator(kubeconfig, identity="solo") as op:
        assert lease_holder(cluster) == "solo"
        await create(apiserver_url, epd_doc())
        await deployed(cluster, "vl-encoder", "vl-decode", "vl-router")
        await observed(cluster, 1)
        health = await op.healthz()
        assert health == {"http_status": 200, "status": "ok", "role": "leader", "identity": "solo", "problems": []}
        await wait_until(lambda: op.metric("epd_operator_reconciles_total", kind="full", result="success"), 10)
        assert await op.metric("epd_operator_api_writes_total", verb="PATCH", kind="Deployment") == 3
        assert await op.metric("epd_operator_leader") == 1
        assert await op.metric("epd_operator_epddeployments") == 1
        assert "epd_operator_reconcile_duration_seconds_bucket" in await op.metrics_text()
        assert await op.stop() == 0, op.output
    assert lease_holder(cluster) == ""  # released on SIGTERM: a standby need not wait for expiry


async def test_two_replicas_never_both_act_and_the_standby_takes_over(cluster, apiserver_url, kubeconfig):
    async with (operator(kubeconfig, identity="first") as first,
                operator(kubeconfig, identity="second", role="standby") as second):
        await create(apiserver_url, epd_doc())
        await observed(cluster, 1)
        assert await first.metric("epd_operator_reconciles_total") > 0
        assert await second.metric("epd_operator_reconciles_total") == 0
        assert await second.metric("epd_operator_api_writes_total") == 0  # not even its Lease: it only reads it

        assert await first.stop() == 0, first.output  # a rolling update stops the leader
        await second.wait_for_role("leader")
        assert lease_holder(cluster) == "second"
        await create(apiserver_url, epd_doc(name="vl2"))
        await observed(cluster, 1, name="vl2")
        assert await second.metric("epd_operator_reconciles_total", kind="full") > 0


async def test_a_crashed_leader_is_replaced_after_its_lease_expires(cluster, apiserver_url, kubeconfig):
    async with (operator(kubeconfig, identity="first") as first,
                operator(kubeconfig, identity="second", role="standby") as second):
        await first.stop(signal.SIGKILL)  # no release: the Lease must expire
        assert lease_holder(cluster) == "first"
        await second.wait_for_role("leader")
        assert lease_holder(cluster) == "second"
        transitions = cluster.get_object(*LEASE)["spec"]["leaseTransitions"]
        assert transitions == 1


async def test_a_leader_that_loses_its_lease_stops_and_exits(cluster, apiserver_url, kubeconfig):
    async with operator(kubeconfig, identity="first") as op:
        lease = cluster.get_object(*LEASE)
        # Someone else takes the Lease over (as a partitioned leader would find on its return).
        lease["spec"]["holderIdentity"] = "usurper"
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/epd-operator"
        status, body = await api_request(apiserver_url, "PUT", path, lease, content_type="application/json")
        assert status == 200, body
        await wait_until(lambda: op.returncode is not None, 15, lambda: f"still running:\n{op.output}")
        assert op.returncode == 1
        assert "leadership lost" in op.output
    assert lease_holder(cluster) == "usurper"


def test_the_scope_must_be_chosen():
    result = subprocess.run(operator_command(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "one of the arguments -n/--namespace -A/--all-namespaces is required" in result.stderr


async def test_without_credentials_it_says_so(tmp_path):
    process = await asyncio.create_subprocess_exec(
        *operator_command(), "-A", env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 2
    assert "no Kubernetes credentials" in out.decode()


async def test_epds_outside_the_watched_namespaces_are_left_alone(cluster, apiserver_url, kubeconfig):
    cluster.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "elsewhere"}})
    async with operator(kubeconfig, identity="scoped"):
        doc = epd_doc(name="far")
        doc["metadata"]["namespace"] = "elsewhere"
        cluster.create_object(doc)
        await create(apiserver_url, epd_doc())
        await observed(cluster, 1)
        assert cluster.list_objects("apps/v1", "Deployment", "elsewhere") == []
        assert "status" not in cluster.get_object(EPD_API, "EPDDeployment", "far", "elsewhere")
        assert epd(cluster)["status"]["phase"] == "Progressing"
