"""Every part of the local cluster, in one list: one line a part (its module says what it is and how it runs,
``dev/parts/part.py`` what every part has). Everything that names a part reads it here: ``make cluster PARTS=...``
and ``python -m dev.cluster.cli up --part NAME``, ``python -m dev.parts build NAME``, ``LocalCluster(parts=...)``
and ``cluster.start_part(NAME)``, and the cluster itself for the parts that start with every real node, in this
order (the NetworkPolicy engine before the DNS, whose pod is then already policed).
"""

from __future__ import annotations

from dev.parts import coredns, gateway, keda, kube_router, lws, prometheus_adapter
from dev.parts.part import WHEN_ASKED, WITH_REAL_NODE, Part

PARTS: dict[str, type[Part]] = {
    part.name: part
    for part in (
        kube_router.KubeRouter,
        coredns.CoreDNS,
        lws.LeaderWorkerSet,
        keda.Keda,
        gateway.Gateway,
        prometheus_adapter.PrometheusAdapter,
    )
}


def part(name: str) -> type[Part]:
    """The part registered as `name`; KeyError names the registered ones."""
    try:
        return PARTS[name]
    except KeyError:
        raise KeyError(f"no cluster part {name!r}: the registered ones are {', '.join(PARTS)}") from None


def with_real_node() -> list[type[Part]]:
    """The parts every real node starts with, in start order."""
    return [p for p in PARTS.values() if p.starts == WITH_REAL_NODE]


def on_request() -> list[type[Part]]:
    """The parts a cluster runs when asked for."""
    return [p for p in PARTS.values() if p.starts == WHEN_ASKED]
