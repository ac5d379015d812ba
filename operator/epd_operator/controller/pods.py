"""What a tier's pods say about themselves: Ready or not, and why one does not run. Pure, read
from pods as the watch cached them; the status (controller/status.py) and the encoder-first
rollout (controller/rollout.py) decide from these answers.

Why a pod does not run is Kubernetes' own word for it: the scheduler's message for a pod it
cannot place (`unschedulable_reason`), or the kubelet's reason for a container that does not run
(`pod_trouble`). The kubelet alternates between a failure and its back-off (ErrImagePull and
ImagePullBackOff, RunContainerError and CrashLoopBackOff, whose messages carry a changing delay);
both sides of each pair give one stable reason and message, so a pod failing the same way reads
the same on every retry.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

UNSCHEDULABLE = "Unschedulable"  # the scheduler's reason on PodScheduled=False
# The reason a container in the kubelet's restart loop is reported under, whichever side of the loop
# (RunContainerError, CrashLoopBackOff, running again but not ready) the pod shows at the moment.
CRASH_LOOP = "CrashLoopBackOff"
# Waiting reasons of a container on its way up: no trouble.
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
# The kubelet's back-off after a failed pull carries the pull's own reason and message
# (`Back-off pulling image "<image>": ErrImagePull: <message>`).
_PULL_BACK_OFF = re.compile(r'Back-off pulling image "[^"]*": (?P<reason>[A-Za-z]+): (?P<message>.*)', re.S)


@dataclasses.dataclass(frozen=True)
class PodTrouble:
    """Why a pod of a tier does not run: the kubelet's reason for one of its containers, and a
    message naming the pod and the container with the kubelet's words."""

    reason: str
    message: str


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    """An object's status condition of this type ({} when it has none): pods and workloads alike."""
    return next((c for c in obj.get("status", {}).get("conditions") or [] if c.get("type") == type_), {})


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def unschedulable_reason(pods: list[dict[str, Any]]) -> str | None:
    """The scheduler's message on the first pod it could not place (PodScheduled=False, Unschedulable)."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        scheduled = condition(pod, "PodScheduled")
        if scheduled.get("status") == "False" and scheduled.get("reason") == UNSCHEDULABLE:
            return str(scheduled.get("message") or UNSCHEDULABLE)
    return None


def _exit(terminated: dict[str, Any]) -> str:
    """How a container ended: `StartError (exit code 128): <the runtime's message>`."""
    words = f"{terminated.get('reason') or 'exited'} (exit code {terminated.get('exitCode', '?')})"
    message = str(terminated.get("message") or "").strip()
    return f"{words}: {message}" if message else words


def container_trouble(container: dict[str, Any], *, init: bool = False) -> tuple[str, str] | None:
    """(reason, message) for one container status that says it does not run, else None. Each side of
    the kubelet's retry loops gives the same answer: ImagePullBackOff the pull error it carries;
    RunContainerError, CrashLoopBackOff and a restarted container not yet ready its last exit."""
    state = container.get("state") or {}
    last = (container.get("lastState") or {}).get("terminated")
    waiting = state.get("waiting")
    if waiting is not None:
        reason, message = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
        if not reason or reason in _STARTING:
            return None
        pull = _PULL_BACK_OFF.fullmatch(message) if reason == "ImagePullBackOff" else None
        if pull is not None:
            return pull["reason"], pull["message"]
        if reason in ("RunContainerError", CRASH_LOOP) and last:
            return CRASH_LOOP, _exit(last)
        return reason, message
    terminated = state.get("terminated")
    if terminated is not None:
        if init and terminated.get("exitCode") == 0:
            return None  # an init container that did its work
        return CRASH_LOOP, _exit(terminated)
    if last and not container.get("ready"):
        return CRASH_LOOP, _exit(last)  # running again after an exit, not ready yet
    return None


def pod_trouble(pods: list[dict[str, Any]]) -> PodTrouble | None:
    """The kubelet's reason for the first pod by name (not ready, not on its way out) with a container
    that does not run: its init containers first, then its containers."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta, st = pod["metadata"], pod.get("status") or {}
        if meta.get("deletionTimestamp") or st.get("phase") in ("Succeeded", "Failed") or pod_ready(pod):
            continue
        for kind, field in (("init container", "initContainerStatuses"), ("container", "containerStatuses")):
            for container in st.get(field) or []:
                found = container_trouble(container, init=field == "initContainerStatuses")
                if found is not None:
                    reason, message = found
                    return PodTrouble(reason, f"pod {meta['name']} {kind} {container.get('name')}: {message}")
    return None
