"""The EPDDeployment status from its children: pure, so every phase rule is a unit test.

Rollout state per tier follows `kubectl rollout status`: a tier is *settled* when its Deployment
controller has seen the latest template and no pod of an older template is left; it is *ready*
when enough of its pods are ready and available. A settled tier that is not ready is only called
Degraded when it lost pods it had ready (fewer ready than the last status showed, or marked
`lost` by the last status and not back), or when the Deployment controller gave up (ProgressDeadlineExceeded): a fresh
deployment still loading its model, and a Ready tier scaling up, are Progressing. (New pods count
as "updated" at once on a scale-up, so the Deployment's status alone cannot tell the two apart.)

A tier that is not ready says why when Kubernetes says it (`reason` and `message` of its status,
the Ready condition, and one Warning Event per change): the scheduler's reason for a pod it cannot
place, or the kubelet's reason for a container that does not run (controller/pods.py). Both sides
of the kubelet's retry loops read the same there, so a pod failing the same way writes the status
and posts an Event once, not once per retry.

Consumers kept on their generation until an encoder of the new one is Ready (controller/rollout.py)
make the deployment Progressing (the condition's reason WaitingForEncoders names the tiers and both
generations): their pods serve, but not from the template the spec asks for.

Each tier's workload and autoscaler are read by a module named for what it reads: `status_deployment`
(a Deployment's rollout), `status_lws` (a LeaderWorkerSet's groups), `status_hpa` (an HPA's bounds and
verdict) and `status_keda` (a KEDA ScaledObject's). This module combines them into the phase, the
conditions and the Events. An autoscaler that cannot act makes the AutoscalingActive condition False,
and a deployment whose tiers are otherwise all ready Degraded, so a broken autoscaler is never hidden
behind Ready.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError

from ..api.labels import GENERATION_LABEL, ROLE_LABEL
from ..api.spec import Topology
from ..api.status import (
    AUTOSCALING_INACTIVE,
    GROUPS_NOT_READY,
    INVALID_SPEC,
    PODS_FAILING,
    REFUSED_BY_API_SERVER,
    Condition,
    EPDDeploymentStatus,
    GenerationStatus,
    TierAutoscaling,
    Tiers,
    TierStatus,
)
from ..api.validation import FieldError
from .apply import REFUSED_WHEN_WRITTEN
from .pods import UNSCHEDULABLE, PodTrouble, pod_ready
from .rollout import Held
from .status_deployment import deployment_rollout
from .status_hpa import hpa_autoscaling, hpa_inactive, hpa_waiting
from .status_keda import keda_autoscaling, keda_inactive, keda_waiting
from .status_lws import LWS_KIND, lws_rollout, unready_groups

TIERS = ("encoder", "prefill", "decode", "router")
VLLM_TIERS = ("encoder", "prefill", "decode")
# A tier its autoscaler scaled to zero pods (KEDA, minReplicas 0): ready, with nothing to run.
SCALED_TO_ZERO = "ScaledToZero"
SCALED_TO_ZERO_MESSAGE = "scaled to zero by its autoscaler until its load activates it"


@dataclasses.dataclass(frozen=True)
class TierInput:
    deployment: dict[str, Any] | None  # the live Deployment, None while it does not exist
    hpa: dict[str, Any] | None = None
    planned_replicas: int = 1  # what we asked for, shown while the Deployment does not exist yet
    unschedulable: str | None = None  # the scheduler's reason for a pod of this tier it cannot place
    trouble: PodTrouble | None = None  # the kubelet's reason for a pod of this tier that does not run
    unready_groups: tuple[int, ...] = ()  # a LeaderWorkerSet's groups with a pod missing or not ready
    scaled_object: dict[str, Any] | None = None  # KEDA's ScaledObject of the tier (engine KEDA)


@dataclasses.dataclass(frozen=True)
class TierState:
    status: TierStatus
    settled: bool
    ready: bool
    stuck: bool


def _why(tier: TierInput) -> tuple[str | None, str | None]:
    """(reason, message) of a tier that is not ready: a pod the scheduler cannot place first, then a
    pod the kubelet cannot run."""
    if tier.unschedulable:
        return UNSCHEDULABLE, tier.unschedulable
    if tier.trouble is not None:
        return tier.trouble.reason, tier.trouble.message
    return None, None


def tier_state(tier: TierInput) -> TierState:
    dep = tier.deployment
    reason, message = _why(tier)
    if dep is None:
        desired = tier.planned_replicas
        status = TierStatus(ready=f"0/{desired}", autoscaling=_autoscaling(tier), reason=reason, message=message)
        return TierState(status, settled=False, ready=False, stuck=False)
    rollout = lws_rollout(dep, tier.unready_groups) if dep.get("kind") == LWS_KIND else deployment_rollout(dep)
    if not rollout.is_ready and reason is None:
        reason, message = rollout.reason, rollout.message
    if rollout.is_ready:  # a ready tier has nothing to explain, whatever a pod on its way out says
        reason = message = None
        if rollout.desired == 0 and (tier.hpa is not None or tier.scaled_object is not None):
            reason, message = SCALED_TO_ZERO, SCALED_TO_ZERO_MESSAGE
    status = TierStatus(
        replicas=rollout.replicas,
        readyReplicas=rollout.ready,
        updatedReplicas=rollout.updated,
        availableReplicas=rollout.available,
        ready=f"{rollout.ready}/{rollout.desired}",
        autoscaling=_autoscaling(tier),
        reason=reason,
        message=message,
    )
    return TierState(status, rollout.settled, rollout.is_ready, rollout.stuck)


def unready_groups_of(workload: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[int, ...]:
    """A multi-node tier's groups that miss a pod or have one not ready (none for a Deployment)."""
    return unready_groups(workload, pods) if workload.get("kind") == LWS_KIND else ()


def _autoscaling(tier: TierInput) -> TierAutoscaling | None:
    if tier.scaled_object is not None:
        return keda_autoscaling(tier.scaled_object)
    return hpa_autoscaling(tier.hpa) if tier.hpa is not None else None


@dataclasses.dataclass(frozen=True)
class AutoscalingVerdict:
    """Whether every autoscaler of the deployment can act: True, False (`message` says which cannot and
    why, `reason` is the first such one's own), or None while one has not reported yet. `degrades`: a
    False verdict makes the deployment Degraded (not for a ScaledObject someone paused on purpose)."""

    active: bool | None
    reason: str
    message: str
    degrades: bool = True


def autoscaling_verdict(tiers: dict[str, TierInput]) -> AutoscalingVerdict | None:
    """What the tiers' autoscalers (HPAs, KEDA ScaledObjects) say about themselves (None: no tier autoscales)."""
    hpas = [(name, tiers[name].hpa) for name in TIERS if name in tiers and tiers[name].hpa is not None]
    scaled = [(n, tiers[n].scaled_object) for n in TIERS if n in tiers and tiers[n].scaled_object is not None]
    if not hpas and not scaled:
        return None
    inactive: list[tuple[str, str]] = []
    waiting: list[str] = []
    waiting_keda: list[str] = []
    paused: list[tuple[str, str]] = []
    for name, so in scaled:
        assert so is not None
        found = keda_inactive(name, so)
        if found is not None:
            (inactive if found[2] else paused).append(found[:2])
        elif keda_waiting(so):
            waiting_keda.append(name)
    for name, hpa in hpas:
        assert hpa is not None
        failed = hpa_inactive(name, hpa)
        if failed is not None:
            inactive.append(failed)
        elif hpa_waiting(hpa):
            waiting.append(name)
    if inactive:
        return AutoscalingVerdict(False, inactive[0][0], "; ".join(m for _, m in inactive + paused))
    if paused:
        return AutoscalingVerdict(False, paused[0][0], "; ".join(m for _, m in paused), degrades=False)
    if waiting:
        return AutoscalingVerdict(
            None, "HPAPending", "waiting for the first replica count of the HPA of " + ", ".join(waiting)
        )
    if waiting_keda:
        return AutoscalingVerdict(
            None, "ScaledObjectPending", "waiting for KEDA to take up the ScaledObject of " + ", ".join(waiting_keda)
        )
    return AutoscalingVerdict(True, "ScalingActive", "every autoscaler computes its replica count from its metrics")


def _set_condition(
    previous: list[Condition], type_: str, status: bool, reason: str, message: str, generation: int | None, now: str
) -> Condition:
    value = "True" if status else "False"
    before = next((c for c in previous if c.type == type_), None)
    since = before.lastTransitionTime if before is not None and before.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        lastTransitionTime=since,
        observedGeneration=generation,
    )


def parse_status(raw: dict[str, Any] | None) -> EPDDeploymentStatus | None:
    if not raw:
        return None
    try:
        return EPDDeploymentStatus.model_validate(raw)
    except ValidationError:
        return None  # written by something else; ours replaces it


def _lost_pods(name: str, state: TierState, previous: EPDDeploymentStatus | None) -> bool:
    """A settled, unready tier lost pods it had: fewer ready than last reported, or reported lost
    before (its `lost` mark) and not recovered. A scale-up keeps its ready pods, so it is not a loss."""
    if previous is None or previous.phase not in ("Ready", "Degraded"):
        return False
    before = getattr(previous.tiers, name)
    if before is None:
        return False
    return state.status.readyReplicas < before.readyReplicas or (previous.phase == "Degraded" and bool(before.lost))


def derive_status(
    *,
    tiers: dict[str, TierInput],
    topology: Topology | None,
    endpoint: str | None,
    observed_generation: int | None,
    spec_errors: list[FieldError] | None,
    previous: EPDDeploymentStatus | None,
    now: str,
    refused: list[str] | None = None,
    generations: list[GenerationStatus] | None = None,
    held: list[Held] | None = None,
) -> EPDDeploymentStatus:
    """`spec_errors`: our rules refused the spec; `refused`: the API server refused objects rendered
    from it (its messages). Either way nothing was applied, and the spec is reported invalid.
    `held`: consumer workloads kept on their generation until an encoder of the new one is Ready."""
    states = {name: tier_state(tiers[name]) for name in TIERS if name in tiers}
    rolling = [n for n, s in states.items() if not s.settled]
    unready = [n for n, s in states.items() if s.settled and not s.ready]
    lost = [n for n in unready if _lost_pods(n, states[n], previous)]
    stuck = [n for n, s in states.items() if s.stuck]
    all_ready = bool(states) and all(s.ready for s in states.values())
    explained = [n for n in TIERS if n in states and states[n].status.reason not in (None, SCALED_TO_ZERO)]
    at_zero = [n for n in TIERS if n in states and states[n].status.reason == SCALED_TO_ZERO]
    scaling = autoscaling_verdict(tiers)
    scaling_inactive = scaling is not None and scaling.active is False and scaling.degrades

    if spec_errors or refused:
        phase = "Failed"
    elif not any(tier.deployment is not None for tier in tiers.values()):
        phase = "Pending"
    elif stuck or lost:
        phase = "Degraded"
    elif rolling or unready or held:
        phase = "Progressing"
    elif scaling_inactive:
        phase = "Degraded"
    else:
        phase = "Ready"

    def summary(names: list[str]) -> str:
        return ", ".join(f"{n} {states[n].status.ready}" for n in names)

    old = previous.conditions if previous is not None else []
    gen = observed_generation
    if spec_errors:
        spec_valid = _set_condition(
            old, "SpecValid", False, INVALID_SPEC, "; ".join(str(e) for e in spec_errors), gen, now
        )
    elif refused:
        spec_valid = _set_condition(old, "SpecValid", False, REFUSED_BY_API_SERVER, "; ".join(refused), gen, now)
    else:
        spec_valid = _set_condition(old, "SpecValid", True, "Valid", "the spec was accepted and applied", gen, now)
    not_ready = [n for n, s in states.items() if not s.ready]
    if all_ready:
        ready_reason, ready_message = (
            "AllTiersReady",
            "every tier has its pods ready" + (f" ({', '.join(at_zero)} scaled to zero)" if at_zero else ""),
        )
    elif explained:
        reasons = {states[n].status.reason for n in explained}
        if UNSCHEDULABLE in reasons:
            ready_reason = UNSCHEDULABLE
        else:
            ready_reason = "TiersNotReady" if reasons == {GROUPS_NOT_READY} else PODS_FAILING
        ready_message = f"not ready: {summary(not_ready)}; " + "; ".join(
            tier_explanation(n, states[n].status) for n in explained
        )
    else:
        ready_reason, ready_message = "TiersNotReady", f"not ready: {summary(not_ready)}"
    if held:
        waiting = ", ".join(f"{h.role} (generation {h.runs})" for h in held)
        progress = (
            "WaitingForEncoders",
            f"{waiting} keep serving until an encoder pod of generation {held[0].waits_for} is Ready"
            + (f"; rolling out: {summary(rolling)}" if rolling else ""),
        )
    elif rolling:
        progress = ("RollingOut", f"rolling out: {summary(rolling)}")
    else:
        progress = ("RolloutComplete", "every tier runs its latest template")
    conditions = [
        _set_condition(old, "Ready", all_ready, ready_reason, ready_message, gen, now),
        _set_condition(old, "Progressing", bool(rolling or held), *progress, gen, now),
        _set_condition(
            old,
            "Degraded",
            phase == "Degraded",
            *(_degraded(stuck, lost, scaling, summary) if phase == "Degraded" else ("AsExpected", "")),
            gen,
            now,
        ),
        spec_valid,
    ]
    if scaling is not None:
        value = {True: "True", False: "False", None: "Unknown"}[scaling.active]
        before = next((c for c in old if c.type == "AutoscalingActive"), None)
        since = before.lastTransitionTime if before is not None and before.status == value else now
        conditions.append(
            Condition(
                type="AutoscalingActive",
                status=value,
                reason=scaling.reason,
                message=scaling.message,
                lastTransitionTime=since,
                observedGeneration=gen,
            )
        )
    return EPDDeploymentStatus(
        observedGeneration=observed_generation,
        phase=phase,
        topology=topology,
        endpoint=endpoint,
        conditions=conditions,
        tiers=Tiers(
            **{n: s.status.model_copy(update={"lost": True}) if n in lost else s.status for n, s in states.items()}
        ),
        generations=generations or None,
    )


def tier_explanation(name: str, tier: TierStatus) -> str:
    """A not-ready tier's reason in words, for the Ready condition and its Event."""
    if tier.reason == UNSCHEDULABLE:
        return f"{name} pods cannot be scheduled: {tier.message}"
    return f"{name} {tier.reason}: {tier.message}"


def _degraded(stuck: list[str], lost: list[str], scaling: AutoscalingVerdict | None, summary: Any) -> tuple[str, str]:
    """A Degraded deployment's reason and message, by precedence: a stuck rollout, lost pods, an HPA
    that cannot act."""
    if stuck:
        return "ProgressDeadlineExceeded", f"rollout stuck: {summary(stuck)}"
    if lost:
        return "ReplicasUnavailable", f"pods lost: {summary(lost)}"
    assert scaling is not None
    return AUTOSCALING_INACTIVE, scaling.message


def generations(pods: list[dict[str, Any]], current: str | None) -> list[GenerationStatus]:
    """vLLM pods counted per compatibility generation (the current one first, then by name);
    pods on their way out (deletionTimestamp set) no longer count: they take no new work."""
    counts: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        generation, role = labels.get(GENERATION_LABEL), labels.get(ROLE_LABEL)
        if not generation or role not in VLLM_TIERS or meta.get("deletionTimestamp"):
            continue
        total, ready = counts.setdefault(generation, ({}, {}))
        total[role] = total.get(role, 0) + 1
        if pod_ready(pod):
            ready[role] = ready.get(role, 0) + 1
    order = sorted(counts, key=lambda g: (g != current, g))
    return [GenerationStatus(name=g, current=g == current, pods=counts[g][0], readyPods=counts[g][1]) for g in order]


def standing_refusal(previous: EPDDeploymentStatus | None, generation: int | None) -> list[str]:
    """The API server's refusal reported for this very generation, if any (kept by status passes)."""
    if previous is None:
        return []
    spec_valid = next((c for c in previous.conditions if c.type == "SpecValid"), None)
    if spec_valid is None or spec_valid.reason != REFUSED_BY_API_SERVER or spec_valid.observedGeneration != generation:
        return []
    return [spec_valid.message]


def observed_by_status_pass(previous: EPDDeploymentStatus | None) -> int | None:
    """The generation a status pass reports as observed: the last one a full pass acted on, since a
    status pass reports on the children without acting on a newer spec."""
    return previous.observedGeneration if previous else None


def last_described(previous: EPDDeploymentStatus | None) -> tuple[Topology | None, str | None]:
    """(topology, endpoint) as the last status gave them: what a refused spec's status keeps saying,
    since the children of the last accepted spec keep running."""
    return (previous.topology, previous.endpoint) if previous else (None, None)


def status_document(status: EPDDeploymentStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", exclude_none=True)


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True)
class Transition:
    type: str  # Normal | Warning
    reason: str
    message: str


def transitions(previous: EPDDeploymentStatus | None, current: EPDDeploymentStatus) -> list[Transition]:
    """The Events worth posting between two statuses: phase changes, newly refused specs, a tier's
    new reason for not being ready (one Warning per tier and change, named by that reason), and an
    HPA that stops (or starts again) being able to act."""
    out = []
    before = {c.type: c for c in previous.conditions} if previous is not None else {}
    after = {c.type: c for c in current.conditions}
    spec = after["SpecValid"]
    if spec.status == "False" and (before.get("SpecValid") is None or before["SpecValid"].message != spec.message):
        # A refusal on the dry run changed nothing; one when written (REFUSED_WHEN_WRITTEN) says what it left.
        unchanged = "" if REFUSED_WHEN_WRITTEN in spec.message else ", nothing was changed"
        out.append(Transition("Warning", spec.reason, f"spec refused{unchanged}: {spec.message}"))
    for name in TIERS:
        tier = getattr(current.tiers, name)
        if tier is None or tier.reason is None:
            continue
        was = getattr(previous.tiers, name) if previous is not None else None
        if was is None or (was.reason, was.message) != (tier.reason, tier.message):
            if tier.reason == SCALED_TO_ZERO:
                out.append(Transition("Normal", SCALED_TO_ZERO, f"{name} {tier.message}"))
            else:
                out.append(Transition("Warning", tier.reason, tier_explanation(name, tier)))
    scaling, scaling_before = after.get("AutoscalingActive"), before.get("AutoscalingActive")
    was = (scaling_before.status, scaling_before.message) if scaling_before is not None else None
    if scaling is not None and scaling.status == "False" and was != ("False", scaling.message):
        out.append(Transition("Warning", AUTOSCALING_INACTIVE, scaling.message))
    if scaling is not None and scaling.status == "True" and was is not None and was[0] == "False":
        out.append(Transition("Normal", "AutoscalingActive", scaling.message))
    old_phase = previous.phase if previous is not None else None
    if current.phase != old_phase and current.phase != "Failed":
        if current.phase == "Ready":
            out.append(Transition("Normal", "Ready", after["Ready"].message))
        elif current.phase == "Degraded" and after["Degraded"].reason == AUTOSCALING_INACTIVE:
            pass  # the AutoscalingInactive event above says it
        elif current.phase == "Degraded":
            out.append(Transition("Warning", "Degraded", after["Degraded"].message))
        elif current.phase == "Progressing" and old_phase is not None:
            out.append(
                Transition(
                    "Normal",
                    "Progressing",
                    after["Progressing"].message if after["Progressing"].status == "True" else after["Ready"].message,
                )
            )
    return out
