"""The reconciler reads what kopf's watches fed into its cache (controller/cache.py), not the API: on the
real control plane, every request the operator sends counted by the recording proxy (tests/support/faults.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from epd_operator.controller.metrics import Metrics
from epd_operator.kube import CHILD_RESOURCES
from tests.support.cluster import KubeView, volumes
from tests.support.faults import WRITE_VERBS, FaultProxy, api_verb
from tests.support.operator_run import (
    create,
    deployed,
    deployment,
    epd_doc,
    observed,
    operator_in_process,
    patch_spec,
    posted,
    resyncs,
    wait_until,
    writes,
)
from tests.support.render_examples import NIXL_AUTOSCALED

RESYNC = "0.3"
NAMES = ("vl-a", "vl-b", "vl-c")
# What a pass would read per EPDDeployment without the cache: the object itself, each child kind, the tiers' pods.
READ_BY_PASSES = {"epddeployments", "pods", *(r.plural for r in CHILD_RESOURCES.values())}


def requests_since(proxy: FaultProxy, mark: int) -> Counter[tuple[str, str]]:
    return Counter(api_verb(method, query) for method, query in proxy.queries[mark:])


def reads_of_children(requests: Counter[tuple[str, str]]) -> dict[tuple[str, str], int]:
    return {k: n for k, n in requests.items() if k[0] in ("get", "list") and k[1].split("/")[0] in READ_BY_PASSES}


# What the cluster's own controllers keep changing while the tiers roll out (the operator reports it).
WATCHED_BY_STATUS = (("apps/v1", "Deployment"), ("apps/v1", "ReplicaSet"), ("v1", "Pod"))


def world(kube: KubeView) -> set[tuple[str, str, str]]:
    """Every object the status reads from, by resourceVersion: unchanged means no controller wrote."""
    return {
        (kind, obj["metadata"]["name"], obj["metadata"]["resourceVersion"])
        for api_version, kind in WATCHED_BY_STATUS
        for obj in kube.list(api_version, kind)
    }


async def at_rest(metrics: Metrics, kube: KubeView, passes: int) -> None:
    """Until a few resyncs in a row write nothing while no Deployment, ReplicaSet or Pod changed:
    the Deployment and ReplicaSet controllers and the scheduler are done, and the status says so."""

    async def quiet() -> bool:
        mark, before = writes(metrics), world(kube)
        await resyncs(metrics, passes)
        return writes(metrics) == mark and world(kube) == before

    await wait_until(quiet, 120, "the operator kept writing", interval=0)


def operator(proxy: FaultProxy, kube: KubeView) -> Callable[[], object]:
    return lambda: operator_in_process(
        lambda: proxy.credentials(kube.ns), "--namespace", kube.ns, "--no-leader-election", "--resync-seconds", RESYNC
    )


async def test_a_resync_at_rest_reads_and_writes_nothing_and_a_restart_lists_each_kind_once(kube: KubeView):
    volumes(kube, "ec-cache", "models")
    passes = 2 * len(NAMES)  # every EPDDeployment twice: two resyncs
    with FaultProxy(kube.cluster) as proxy:
        async with operator(proxy, kube)() as metrics:  # type: ignore[attr-defined]
            for name in NAMES:
                await create(kube, epd_doc(name=name))
            for name in NAMES:
                await observed(kube, 1, name)
            await at_rest(metrics, kube, passes)

            mark = len(proxy.queries)
            await resyncs(metrics, passes)
            idle = requests_since(proxy, mark)
            assert {verb for verb, _ in idle} <= {"watch"}, f"requests in two resyncs at rest: {dict(idle)}"

        # A restart: kopf lists each watched kind once (per namespace), whatever the number of
        # EPDDeployments; its index gate holds the first passes until those lists are in the cache,
        # so nothing that exists is planned as missing, and nothing is written.
        mark = len(proxy.queries)
        async with operator(proxy, kube)() as metrics:  # type: ignore[attr-defined]
            await resyncs(metrics, passes)
            assert writes(metrics) == 0, f"writes after a restart: {dict(requests_since(proxy, mark))}"
        lists = {res: n for (verb, res), n in requests_since(proxy, mark).items() if verb == "list"}
        assert lists and max(lists.values()) == 1, lists
        reads = reads_of_children(requests_since(proxy, mark))
        assert all(verb == "list" for verb, _ in reads), reads  # no GET of an EPDDeployment or a child


async def test_a_pass_from_the_cache_repairs_drift_and_prunes_without_reading_the_api(kube: KubeView):
    volumes(kube, "ec-cache", "models")
    with FaultProxy(kube.cluster) as proxy:
        async with operator(proxy, kube)() as metrics:  # type: ignore[attr-defined]
            doc = epd_doc(NIXL_AUTOSCALED)  # an HPA on the encoder, to prune
            await create(kube, doc)
            await deployed(kube, "vl-encoder", "vl-prefill", "vl-decode", "vl-router")
            await observed(kube, 1)
            assert kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is not None
            await resyncs(metrics, 2)
            mark = len(proxy.queries)

            def image() -> str:
                return str(deployment(kube, "vl-decode")["spec"]["template"]["spec"]["containers"][0]["image"])

            original = image()
            kube.kubectl("set", "image", "deployment/vl-decode", "vllm=someone/else:latest")
            await wait_until(lambda: image() == original, 20, "the edited image was not restored")
            await posted(kube, "Normal", "Applied", "Deployment vl-decode restored")

            await patch_spec(kube, {"encoder": {**doc["spec"]["encoder"], "autoscaling": None, "replicas": 2}})
            await wait_until(
                lambda: kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is None,
                20,
                "the encoder's HPA was not pruned",
            )
            await posted(kube, "Normal", "Pruned", "HorizontalPodAutoscaler vl-encoder")
            await observed(kube, 2)

            done = requests_since(proxy, mark)
            assert done[("patch", "deployments")] >= 1 and done[("delete", "horizontalpodautoscalers")] == 1, dict(done)
            assert reads_of_children(done) == {}, f"reads of the API instead of the cache: {dict(done)}"
            assert all(verb in ("watch", *WRITE_VERBS.values()) for verb, _ in done), dict(done)


async def test_the_audit_drops_what_a_watch_gap_deleted_and_gives_its_epddeployment_a_full_pass(kube: KubeView):
    """A watch that lists again after a 410 Gone replays what exists, never what was deleted in the gap:
    the periodic audit lists each kind once (real server) and drops the cached objects it lacks."""
    import asyncio

    from epd_operator.controller.reconciler import Reconciler
    from epd_operator.controller.workqueue import FULL
    from epd_operator.kube import Kube

    labels = {"app.kubernetes.io/instance": "vl", "app.kubernetes.io/managed-by": "epd-operator"}
    kept = kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "vl-kept", "labels": labels}})
    deleted = kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "vl-gone", "labels": labels}})
    async with Kube(kube.credentials) as client:
        reconciler = Reconciler(client, Metrics(), identity="audit-test")
        reconciler.known[(kube.ns, "vl")] = "uid"
        for obj in (kept, deleted):
            reconciler.cache.observe(None, {**obj, "kind": "ConfigMap", "apiVersion": "v1"})
        kube.delete("v1", "ConfigMap", "vl-gone")  # its DELETED event never reaches the cache

        await reconciler.audit()
        held = [o["metadata"]["name"] for o in reconciler.cache.owned(kube.ns, "vl", ["ConfigMap"])]
        assert held == ["vl-kept"], held
        assert await asyncio.wait_for(reconciler.queue.get(), 1) == ((kube.ns, "vl"), FULL)
