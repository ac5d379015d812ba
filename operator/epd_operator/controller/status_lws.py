"""A multi-node tier's rollout as its LeaderWorkerSet says it: replicas are groups (a leader and its workers).

Ready groups are groups whose every pod is ready; the LeaderWorkerSet reports no availability of its
own. Its UpdateInProgress condition says whether groups roll (its updated count is no guide, since it
also drops while a group restarts: a group whose pods are being recreated counts as neither updated nor
current), and the tier is ready only while the controller itself says Available. A group that is not
ready is named (`GroupsNotReady`, from the pods' group index), so a group the LWS controller restarts
after losing a pod shows as that group, not as an anonymous count.
"""

from __future__ import annotations

from typing import Any

from ..api.status import GROUPS_NOT_READY
from .pods import condition, pod_ready
from .status_deployment import Rollout, observed

LWS_KIND = "LeaderWorkerSet"
# Set by LWS on every pod of a group (api/leaderworkerset/v1): the group's index, and the pod's in it.
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


def _true(obj: dict[str, Any], type_: str) -> bool:
    """The object's own condition `type_` is True for its current generation."""
    said = condition(obj, type_)
    generation = (obj.get("metadata") or {}).get("generation")
    current = generation is None or said.get("observedGeneration", generation) >= generation
    return said.get("status") == "True" and current


def lws_rollout(lws: dict[str, Any], unready: tuple[int, ...]) -> Rollout:
    """`unready`: the groups `unready_groups` found missing a pod or with one not ready."""
    st = lws.get("status") or {}
    desired = (lws.get("spec") or {}).get("replicas", 1)
    ready = st.get("readyReplicas", 0)
    settled = observed(lws) and not _true(lws, "UpdateInProgress")
    is_ready = settled and ready >= desired and _true(lws, "Available")
    return Rollout(
        desired=desired,
        replicas=st.get("replicas", 0),
        ready=ready,
        updated=st.get("updatedReplicas", 0),
        available=st.get("availableReplicas", ready),
        settled=settled,
        is_ready=is_ready,
        stuck=condition(lws, "Progressing").get("reason") == "ProgressDeadlineExceeded",
        reason=None if is_ready else GROUPS_NOT_READY,
        message=None if is_ready else _groups_message(lws, unready, ready, desired),
    )


def unready_groups(lws: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[int, ...]:
    """The groups of a LeaderWorkerSet (indices below its replicas) that miss a pod (one of `size`)
    or have one not ready; a pod on its way out counts as missing."""
    spec = lws.get("spec") or {}
    size = (spec.get("leaderWorkerTemplate") or {}).get("size", 1)
    members: dict[int, list[dict[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        index = (meta.get("labels") or {}).get(GROUP_INDEX_LABEL)
        if index is not None and index.isdigit() and not meta.get("deletionTimestamp"):
            members.setdefault(int(index), []).append(pod)
    return tuple(
        group
        for group in range(spec.get("replicas", 1))
        if len(members.get(group, [])) < size or not all(pod_ready(p) for p in members[group])
    )


def _groups_message(lws: dict[str, Any], groups: tuple[int, ...], ready: int, desired: int) -> str:
    """`group 1 of 2 not ready (LeaderWorkerSet decode: Replicas are progressing)`."""
    named = f"group {groups[0]}" if len(groups) == 1 else "groups " + ", ".join(map(str, groups))
    words = f"{named} of {desired} not ready" if groups else f"{ready} of {desired} groups ready"
    name = (lws.get("metadata") or {}).get("name", "")
    said = next(
        (
            str(condition(lws, t).get("message") or "")
            for t in ("UpdateInProgress", "Progressing", "Available")
            if _true(lws, t)
        ),
        "",
    )
    return f"{words} (LeaderWorkerSet {name}: {said})" if said else f"{words} (LeaderWorkerSet {name})"
