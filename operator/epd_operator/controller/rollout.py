"""Encoder first: a new compatibility generation reaches the consumers once an encoder serves it.

A change of the compatibility generation (render/generation.py: an image, the model, a connector) rolls
every vLLM tier, and the router pairs pods only within one generation. Rolled together, the consumers
(prefill, decode) of the new generation find no encoder of it until a new encoder pod is Ready, and
encode every image themselves meanwhile; with an encoder that never starts (an image that cannot be
pulled, a crash loop) they would do so for good. So while no encoder pod of the new generation is
Ready, a consumer workload that runs another generation is left as it is: nothing of it is applied
(any other change of it waits too), and it keeps serving with the encoders of its own generation.

The hold ends with a pass that sees such an encoder: while consumers are held, only a pod event of an
encoder of the awaited generation that is Ready (`releases`) asks for a full pass; every other event of
a child or a pod refreshes the status only (a full pass judges its whole plan on a server-side dry
run, and an encoder that never becomes Ready would otherwise cost one per event for as long as its
pods keep failing). A spec that turns invalid drops the hold: nothing of it is applied any more.

Not held: a consumer that does not exist yet (a new EPDDeployment starts every tier at once), one
already on the new generation, and every consumer when no encoder pod is asked for at all (the spec's
replicas are 0, or its autoscaler scaled the encoder tier to zero: KEDA).
The plan is pure: the reconciler gives it the rendered objects, the live ones and the encoder pods.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..api.labels import GENERATION_LABEL, ROLE_LABEL
from ..render.naming import ENCODER
from .pods import pod_ready


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    """The labels of a workload's pods (a LeaderWorkerSet's from its worker template); {} for other kinds."""
    spec = workload.get("spec") or {}
    if workload.get("kind") == "LeaderWorkerSet":
        template = (spec.get("leaderWorkerTemplate") or {}).get("workerTemplate") or {}
    elif workload.get("kind") == "Deployment":
        template = spec.get("template") or {}
    else:
        return {}
    return dict((template.get("metadata") or {}).get("labels") or {})


def _asks_for_encoders(workload: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Whether the encoder workload is to have pods: its rendered replicas, or for an autoscaled one (no
    replicas rendered) what its autoscaler last set, which is 0 for an encoder tier KEDA scaled to zero."""
    replicas = (workload.get("spec") or {}).get("replicas")
    if replicas is None and live is not None:
        replicas = (live.get("spec") or {}).get("replicas")
    return replicas is None or replicas > 0


@dataclasses.dataclass(frozen=True)
class Held:
    """A consumer workload kept on the generation it runs until an encoder pod of `waits_for` is Ready."""

    kind: str
    name: str
    role: str
    runs: str
    waits_for: str


def held_consumers(
    desired: list[dict[str, Any]], live: list[dict[str, Any]], encoder_pods: list[dict[str, Any]]
) -> list[Held]:
    """The consumer workloads whose move to the new generation waits for an encoder of it."""
    encoders = [w for w in desired if pod_labels(w).get(ROLE_LABEL) == ENCODER]
    new = pod_labels(encoders[0]).get(GENERATION_LABEL) if encoders else None
    live_by_key = {(w["kind"], w["metadata"]["name"]): w for w in live}
    if new is None or not any(
        _asks_for_encoders(w, live_by_key.get((w["kind"], w["metadata"]["name"]))) for w in encoders
    ):
        return []
    if any(pod_ready(p) and p["metadata"].get("labels", {}).get(GENERATION_LABEL) == new for p in encoder_pods):
        return []
    running = {key: pod_labels(w) for key, w in live_by_key.items()}
    held = []
    for workload in desired:
        role = pod_labels(workload).get(ROLE_LABEL)
        current = running.get((workload["kind"], workload["metadata"]["name"]))
        if role in (None, ENCODER) or current is None:
            continue
        runs = current.get(GENERATION_LABEL)
        if runs is not None and runs != new:
            held.append(Held(workload["kind"], workload["metadata"]["name"], role, runs, new))
    return held


def releases(held: list[Held], pod: dict[str, Any]) -> bool:
    """Whether this pod ends the hold on `held`: an encoder pod of the generation they wait for, Ready."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (
        bool(held)
        and labels.get(ROLE_LABEL) == ENCODER
        and labels.get(GENERATION_LABEL) == held[0].waits_for
        and pod_ready(pod)
    )
