"""Multi-node tiers with the real LeaderWorkerSet controller (sigs.k8s.io/lws, built from its Go module,
its CRDs and webhooks: dev/parts/lws.py) on the local control plane, pods on kwok's fake GPU nodes.

The operator renders the tier's LeaderWorkerSet; LWS creates each group's leader and worker pods
(its pod webhook labels them and gives them the leader's address); the EPDDeployment's status reads
the LeaderWorkerSet's own conditions. A worker pod deleted makes LWS recreate its whole group, and
the status names that group while it is not ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dev.cluster.local import LocalCluster
from tests.support.cluster import KubeView, api_path, epd_crd, install_crd, new_namespace, volumes
from tests.support.operator_run import condition, create, epd, epd_doc, operator_in_process, posted, wait_until

# The controller's build is one only this file needs: `make test` runs it once `make k8s` has built it.
pytestmark = pytest.mark.late_build

LWS_API = "leaderworkerset.x-k8s.io/v1"
GROUP = "leaderworkerset.sigs.k8s.io/group-index"
WORKER = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(scope="module")
def k8s_lws(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("k8s-lws"), parts=("lws",)) as cluster:
        install_crd(cluster, epd_crd())
        yield cluster


@pytest.fixture
def ns(k8s_lws: LocalCluster, tmp_path: Path) -> Iterator[KubeView]:
    view = new_namespace(k8s_lws, tmp_path)
    volumes(view, "ec-cache", "models")
    yield view
    view.request("DELETE", f"/api/v1/namespaces/{view.ns}")


def decode_pods(kube: KubeView) -> dict[str, dict]:
    return {
        p["metadata"]["name"]: p
        for p in kube.pods(**{"leaderworkerset.sigs.k8s.io/name": "vl-decode"})
        if not p["metadata"].get("deletionTimestamp")
    }


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env") or []}


async def lws_catches_up(kube: KubeView, caught_up: Callable[[], bool]) -> None:
    """Wait for the LeaderWorkerSet itself (read from the API server) to count a group that turned ready.

    LWS recounts its groups when an event of the LeaderWorkerSet or one of its StatefulSets arrives, reading
    the leader pods from its own informer (lws's updateConditions). A StatefulSet's status can reach it
    before the pod change it counted, and then LWS stays at "progressing" until its next event, which on a
    quiet cluster never comes: a loaded CI machine showed it. A touch of the LeaderWorkerSet is such an
    event. The operator's status follows LWS's word, so its own wait starts once LWS has it right.
    """
    try:
        await wait_until(caught_up, 20)
    except AssertionError:
        path = api_path(LWS_API, "LeaderWorkerSet", kube.ns, "vl-decode")
        kube.ok("PATCH", path, {"metadata": {"annotations": {"epd-tests/recount": str(time.time())}}})
        await wait_until(
            caught_up, 40, lambda: f"LWS: {(kube.get(LWS_API, 'LeaderWorkerSet', 'vl-decode') or {}).get('status')}"
        )


def ready_pod(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


async def test_lws_creates_the_groups_and_a_group_restart_shows_in_the_status(ns):
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "0.3"):
        doc = epd_doc()
        doc["spec"]["decode"].update({"nodesPerReplica": 2, "tensorParallelSize": 2, "replicas": 2})
        await create(ns, doc)

        # LWS makes two groups of a leader and a worker each, labelled and wired by its pod webhook.
        names = {"vl-decode-0", "vl-decode-0-1", "vl-decode-1", "vl-decode-1-1"}
        await wait_until(lambda: set(decode_pods(ns)) == names, 60, lambda: f"LWS pods: {sorted(decode_pods(ns))}")
        pods = decode_pods(ns)
        for name, pod in pods.items():
            labels, env = pod["metadata"]["labels"], env_of(pod)
            worker = "1" if name.endswith("-1") and name.count("-") == 3 else "0"
            assert (labels[GROUP], labels[WORKER]) == (name.split("-")[2], worker), labels
            assert labels["app.kubernetes.io/instance"] == "vl"  # the operator's template labels kept
            # One headless Service per group (subdomainPolicy UniquePerReplica), named after its leader.
            leader = f"vl-decode-{labels[GROUP]}"
            assert env["LWS_LEADER_ADDRESS"] == f"{leader}.{leader}.{ns.ns}", env
            args = pod["spec"]["containers"][0]["args"]
            assert ("--headless" in args) == (worker == "1"), args
        # The tier's Service selects leaders only: its EndpointSlices hold the two leaders.
        await wait_until(
            lambda: (
                sorted(
                    e["targetRef"]["name"]
                    for s in ns.list(
                        "discovery.k8s.io/v1", "EndpointSlice", labels={"kubernetes.io/service-name": "vl-decode"}
                    )
                    for e in s.get("endpoints") or []
                )
                == ["vl-decode-0", "vl-decode-1"]
            ),
            60,
            "the decode Service does not select exactly the leaders",
        )

        def lws_says(type_: str) -> bool:
            got = ns.get(LWS_API, "LeaderWorkerSet", "vl-decode") or {}
            return condition(got, type_).get("status") == "True"

        await wait_until(lambda: lws_says("Available"), 60, "LWS never said Available")
        await wait_until(
            lambda: epd(ns).get("status", {}).get("phase") == "Ready", 60, lambda: f"not Ready: {epd(ns)['status']}"
        )
        assert epd(ns)["status"]["tiers"]["decode"]["ready"] == "2/2"

        # A worker of group 1 is deleted: LWS recreates the whole group, its leader too.
        leader_uid = pods["vl-decode-1"]["metadata"]["uid"]
        ns.delete("v1", "Pod", "vl-decode-1-1")
        await wait_until(
            lambda: decode_pods(ns).get("vl-decode-1", {}).get("metadata", {}).get("uid") not in (None, leader_uid),
            60,
            "LWS did not recreate group 1's leader",
        )
        # Keep the new leader from turning ready (kwok lets go of a pod annotated so), to read the status meanwhile.
        ns.set_pod_ready("vl-decode-1", False)
        message = "group 1 of 2 not ready (LeaderWorkerSet vl-decode: Replicas are progressing)"
        await wait_until(
            lambda: epd(ns)["status"]["tiers"]["decode"].get("message") == message,
            60,
            lambda: f"group 1 not named: {epd(ns)['status']}",
        )
        status = epd(ns)["status"]
        assert (status["tiers"]["decode"]["reason"], status["tiers"]["decode"]["ready"]) == ("GroupsNotReady", "1/2")
        assert status["phase"] == "Degraded" and condition(epd(ns), "Ready")["status"] == "False"
        await posted(ns, "Warning", "GroupsNotReady", "group 1 of 2 not ready")
        assert lws_says("Progressing") and not lws_says("Available")  # what the status was read from

        ns.set_pod_ready("vl-decode-1", True)
        await lws_catches_up(ns, lambda: lws_says("Available"))
        await wait_until(
            lambda: epd(ns).get("status", {}).get("phase") == "Ready",
            60,
            lambda: f"not Ready again: {epd(ns)['status']}",
        )
        assert "reason" not in epd(ns)["status"]["tiers"]["decode"]
