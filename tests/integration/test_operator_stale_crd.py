"""A cluster whose CRD is older than the operator: the one way a spec our rules refuse can reach the
operator. A second, apiserver-only control plane (the CRD is cluster-scoped) with the CRD's spec
schema switched off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.local import LocalCluster
from tests.support.cluster import KubeView, epd_crd, install_crd, new_namespace
from tests.support.operator_run import (
    children,
    condition,
    create,
    deployed,
    epd,
    epd_doc,
    events,
    metric_value,
    observed,
    operator_in_process,
    patch_spec,
    phase,
    posted,
    writes,
)

RESYNC = "0.3"


def relaxed_epd_crd() -> dict:
    crd = epd_crd()
    version = crd["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema["properties"]["metadata"] = {"type": "object"}  # nor the rules on the name
    return crd


@pytest.fixture(scope="module")
def stale_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("stale-k8s"), apiserver_only=True) as cluster:
        install_crd(cluster, relaxed_epd_crd())
        yield cluster


@pytest.fixture
def ns(stale_cluster: LocalCluster, tmp_path: Path) -> KubeView:
    return new_namespace(stale_cluster, tmp_path, "stale")


async def test_a_refused_spec_is_reported_and_nothing_is_created(ns):
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC
    ) as metrics:
        doc = epd_doc()
        doc["spec"]["kvTransfer"] = {"connector": "Nixl"}  # KV transfer needs a prefill tier
        await create(ns, doc)
        await phase(ns, "Failed")
        spec_valid = condition(epd(ns), "SpecValid")
        assert spec_valid["status"] == "False" and spec_valid["reason"] == "InvalidSpec"
        assert spec_valid["message"].startswith("spec.kvTransfer: kvTransfer moves KV from prefill to decode")
        await posted(ns, "Warning", "InvalidSpec")
        warnings = [m for t, r, m in events(ns) if (t, r) == ("Warning", "InvalidSpec")]
        assert len(warnings) == 1 and "spec.kvTransfer" in warnings[0]
        assert children(ns) == {}
        # Its only writes: the status and the Event.
        assert writes(metrics) == 2

        await patch_spec(ns, {"kvTransfer": None})
        await deployed(ns, "vl-encoder", "vl-decode", "vl-router")
        if condition(epd(ns), "SpecValid").get("status") != "True":
            await observed(ns, 2)


async def test_a_refused_update_changes_nothing(ns):
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC):
        await create(ns, epd_doc())
        await deployed(ns, "vl-encoder", "vl-decode", "vl-router")
        await observed(ns, 1)
        before = {k: o["metadata"]["resourceVersion"] for k, o in children(ns).items()}
        await patch_spec(ns, {"router": {"encoderPolicy": "random"}})
        await phase(ns, "Failed")
        assert "spec.router.encoderPolicy" in condition(epd(ns), "SpecValid")["message"]
        assert epd(ns)["status"]["observedGeneration"] == 2
        assert {k: o["metadata"]["resourceVersion"] for k, o in children(ns).items()} == before


async def test_a_gateway_on_a_cluster_without_the_gateway_api_is_refused_clearly(ns):
    """No Gateway API CRDs here: the spec is reported refused, with what is missing, and nothing is applied."""
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC
    ) as metrics:
        doc = epd_doc()
        doc["spec"]["router"]["gateway"] = {"parentRefs": [{"name": "inference"}]}
        await create(ns, doc)
        await phase(ns, "Failed")
        spec_valid = condition(epd(ns), "SpecValid")
        assert (spec_valid["status"], spec_valid["reason"]) == ("False", "RefusedByAPIServer")
        assert spec_valid["message"] == (
            "HTTPRoute vl: this cluster does not serve gateway.networking.k8s.io/v1 "
            "HTTPRoute (install its CRDs, or remove the field that asks for it)"
        )
        await posted(ns, "Warning", "RefusedByAPIServer", "does not serve gateway.networking.k8s.io/v1 HTTPRoute")
        assert children(ns) == {}
        errors = metric_value(metrics.exposition().decode(), "epd_operator_reconcile_errors_total")
        assert errors == 0  # reported once, not a retry loop

        await patch_spec(ns, {"router": {**doc["spec"]["router"], "gateway": None}})
        await deployed(ns, "vl-encoder", "vl-decode", "vl-router")


async def test_a_multi_node_tier_on_a_cluster_without_leader_worker_set_is_refused_clearly(ns):
    """No LeaderWorkerSet CRD here: a multi-node spec is reported refused with what is missing, nothing is
    applied, and the same spec on one node deploys."""
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC
    ) as metrics:
        doc = epd_doc()
        doc["spec"]["decode"].update({"nodesPerReplica": 2, "tensorParallelSize": 2})
        await create(ns, doc)
        await phase(ns, "Failed")
        spec_valid = condition(epd(ns), "SpecValid")
        assert (spec_valid["status"], spec_valid["reason"]) == ("False", "RefusedByAPIServer")
        assert spec_valid["message"] == (
            "LeaderWorkerSet vl-decode: this cluster does not serve leaderworkerset.x-k8s.io/v1 "
            "LeaderWorkerSet (install its CRDs, or remove the field that asks for it)"
        )
        await posted(ns, "Warning", "RefusedByAPIServer", "does not serve leaderworkerset.x-k8s.io/v1 LeaderWorkerSet")
        assert children(ns) == {}
        assert metric_value(metrics.exposition().decode(), "epd_operator_reconcile_errors_total") == 0

        await patch_spec(ns, {"decode": {**doc["spec"]["decode"], "nodesPerReplica": 1}})
        await deployed(ns, "vl-encoder", "vl-decode", "vl-router")


async def test_keda_on_a_cluster_without_keda_is_reported_in_status_and_events(ns):
    """No KEDA here: a tier asking for engine KEDA is reported refused with what is missing (KEDA), once,
    not as a retry loop; nothing is applied, and the same spec with the HPA engine deploys."""
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC
    ) as metrics:
        doc = epd_doc()
        autoscaling = {"minReplicas": 0, "maxReplicas": 4, "keda": {"prometheusAddress": "http://prometheus:9090"}}
        doc["spec"]["encoder"]["autoscaling"] = {**autoscaling, "engine": "KEDA"}
        await create(ns, doc)
        await phase(ns, "Failed")
        spec_valid = condition(epd(ns), "SpecValid")
        assert (spec_valid["status"], spec_valid["reason"]) == ("False", "RefusedByAPIServer")
        assert spec_valid["message"] == (
            "ScaledObject vl-encoder: this cluster does not serve keda.sh/v1alpha1 ScaledObject "
            "(KEDA is not installed; install it (docs/autoscaling.md), or set autoscaling.engine: HPA)"
        )
        await posted(ns, "Warning", "RefusedByAPIServer", "KEDA is not installed")
        assert children(ns) == {}
        assert metric_value(metrics.exposition().decode(), "epd_operator_reconcile_errors_total") == 0

        # merge patch: the engine back to HPA, at least one encoder, KEDA's settings removed
        await patch_spec(ns, {"encoder": {"autoscaling": {"engine": "HPA", "minReplicas": 1, "keda": None}}})
        await deployed(ns, "vl-encoder", "vl-decode", "vl-router")
