"""A tier's rollout as its Deployment says it, the way `kubectl rollout status` reads it.

A Deployment is *settled* when its controller has seen the latest template and no pod of an older
template is left, and *ready* when enough of its pods are ready and available; it is *stuck* when
the controller gave up (ProgressDeadlineExceeded). New pods count as "updated" at once on a
scale-up, so these counts alone cannot tell a scale-up from a rollout: `status.py` uses the last
status for that.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .pods import condition


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What a tier's workload (Deployment or LeaderWorkerSet) says of its pods or groups."""

    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    settled: bool
    is_ready: bool
    stuck: bool
    reason: str | None = None  # why it is not ready, when the workload itself says (a LeaderWorkerSet's groups)
    message: str | None = None


def observed(obj: dict[str, Any]) -> bool:
    """The workload's controller has seen its latest spec."""
    generation = (obj.get("metadata") or {}).get("generation")
    return generation is None or (obj.get("status") or {}).get("observedGeneration", 0) >= generation


def deployment_rollout(dep: dict[str, Any]) -> Rollout:
    st = dep.get("status") or {}
    desired = (dep.get("spec") or {}).get("replicas", 1)
    replicas, ready, updated = st.get("replicas", 0), st.get("readyReplicas", 0), st.get("updatedReplicas", 0)
    available = st.get("availableReplicas", 0)
    settled = observed(dep) and updated >= desired and replicas <= updated
    return Rollout(
        desired=desired,
        replicas=replicas,
        ready=ready,
        updated=updated,
        available=available,
        settled=settled,
        is_ready=settled and ready >= desired and available >= desired,
        stuck=condition(dep, "Progressing").get("reason") == "ProgressDeadlineExceeded",
    )
