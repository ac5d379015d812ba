"""Failures a real API server does not produce on demand (5xx on chosen writes), injected by a proxy
in front of the real one (tests/support/faults.py): the operator retries and reports them."""

from __future__ import annotations

from tests.support.cluster import KubeView, volumes
from tests.support.faults import FaultProxy
from tests.support.operator_run import create, deployed, epd_doc, metric_value, observed, operator_in_process, posted


async def test_failed_writes_are_retried_and_reported(kube: KubeView):
    volumes(kube, "ec-cache")
    with FaultProxy(kube.cluster) as proxy:
        proxy.fail("PATCH", r"/deployments/vl-decode$", code=500, times=2)
        async with operator_in_process(
            lambda: proxy.credentials(kube.ns),
            "--namespace",
            kube.ns,
            "--no-leader-election",
            "--resync-seconds",
            "0.3",
        ) as metrics:
            await create(kube, epd_doc())
            await deployed(kube, "vl-encoder", "vl-decode", "vl-router")
            await observed(kube, 1)
            assert metric_value(metrics.exposition().decode(), "epd_operator_reconcile_errors_total") >= 1
            await posted(kube, "Warning", "ReconcileFailed", "injected failure (500)")
        decode_patches = [p for m, p in proxy.requests if m == "PATCH" and p.endswith("/deployments/vl-decode")]
        assert len(decode_patches) >= 3  # two refused, then the one that went through


async def test_children_are_watched_through_a_server_side_label_selector(kube: KubeView):
    """The operator never receives (nor caches) the cluster's other Deployments and HPAs."""
    from urllib.parse import parse_qs, urlsplit

    from tests.support.operator_run import wait_until

    with FaultProxy(kube.cluster) as proxy:
        async with operator_in_process(
            lambda: proxy.credentials(kube.ns), "--namespace", kube.ns, "--no-leader-election"
        ):

            def watches(plural: str) -> list[dict[str, list[str]]]:
                return [
                    parse_qs(urlsplit(q).query)
                    for m, q in proxy.queries
                    if m == "GET" and urlsplit(q).path.endswith(f"/{plural}") and "watch=true" in q
                ]

            await wait_until(
                lambda: watches("deployments") and watches("horizontalpodautoscalers"), 20, lambda: proxy.queries
            )
            for plural in ("deployments", "horizontalpodautoscalers"):
                for query in watches(plural):
                    assert query["labelSelector"] == ["app.kubernetes.io/managed-by=epd-operator"], (plural, query)
