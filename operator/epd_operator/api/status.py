"""The `EPDDeployment` status: what the operator reports back, per tier.

Only the operator writes it; the CRD's status schema is generated from these models so that
`kubectl get epd` columns and `kubectl explain epd.status` stay in step with the code.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .spec import Topology

Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"]
# AutoscalingActive is present only while some tier has an HPA: False when one cannot act.
ConditionType = Literal["Ready", "Progressing", "Degraded", "SpecValid", "AutoscalingActive"]
# SpecValid reasons: the spec broke our rules, or the API server refused an object rendered from it.
INVALID_SPEC = "InvalidSpec"
REFUSED_BY_API_SERVER = "RefusedByAPIServer"
# AutoscalingActive False and Degraded's reason: an autoscaler cannot act.
AUTOSCALING_INACTIVE = "AutoscalingInactive"
# A tier's reasons for not being ready when its pods do not say: the kubelet cannot run its pods, or a
# multi-node tier's groups are not ready.
PODS_FAILING = "PodsFailing"
GROUPS_NOT_READY = "GroupsNotReady"


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Condition(_Status):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason, as in Kubernetes conditions.")
    message: str = ""
    lastTransitionTime: str | None = None
    observedGeneration: int | None = None


class HPACondition(_Status):
    type: str = Field(
        description="The autoscaler's condition type. An HPA's: AbleToScale, ScalingActive, ScalingLimited (and "
        "ScaledToZero from Kubernetes 1.37); a KEDA ScaledObject's: Ready, Active (a trigger is above its "
        "activation threshold), Fallback (KEDA holds the fallback replicas: its triggers fail), Paused, HPAActive."
    )
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""


class TierAutoscaling(_Status):
    engine: Literal["KEDA"] | None = Field(
        None, description="`KEDA` when a KEDA ScaledObject scales the tier; absent for an HPA."
    )
    minReplicas: int | None = None
    maxReplicas: int | None = None
    desiredReplicas: int | None = Field(None, description="What the HPA currently asks for.")
    currentReplicas: int | None = None
    conditions: list[HPACondition] | None = Field(
        None,
        description="The autoscaler's own verdict, as its controller last wrote it. HPA: ScalingActive=False means "
        "it cannot compute a replica count (e.g. its metric is not served) and never scales. KEDA: Ready=False means "
        "KEDA cannot scale the tier (e.g. Prometheus unreachable, a bad query), Fallback=True that it holds the "
        "fallback replicas.",
    )


class TierStatus(_Status):
    replicas: int = 0
    readyReplicas: int = 0
    updatedReplicas: int = 0
    availableReplicas: int = 0
    ready: str = Field("0/0", description="ready/desired, for printer columns.")
    autoscaling: TierAutoscaling | None = None
    reason: str | None = Field(
        None,
        description="Why pods of this tier are not ready, when known, in Kubernetes' own reason: Unschedulable "
        "(the scheduler cannot place a pod), or the kubelet's reason for one of its containers (ErrImagePull, "
        "CrashLoopBackOff, CreateContainerConfigError, ...); for a multi-node tier with no such pod, "
        "GroupsNotReady (its LeaderWorkerSet is short of ready groups). Absent while the tier is ready, except "
        "ScaledToZero: its autoscaler scaled it to zero pods (an encoder tier with KEDA; the routers send media "
        "raw to the consumers meanwhile), which is a ready state.",
    )
    message: str | None = Field(
        None,
        description="The words that go with `reason`: the scheduler's message, or the pod, the container and the "
        "kubelet's message (for CrashLoopBackOff: how the container last exited); for GroupsNotReady, the groups "
        "not ready by index and the LeaderWorkerSet controller's own condition message.",
    )
    lost: bool | None = Field(
        None,
        description="True while the tier is short of pods it had ready (the deployment is Degraded for it); "
        "absent once they are back, and for a tier still loading or scaling up.",
    )


class Tiers(_Status):
    encoder: TierStatus | None = None
    prefill: TierStatus | None = None
    decode: TierStatus | None = None
    router: TierStatus | None = None


class GenerationStatus(_Status):
    name: str = Field(
        description="The compatibility generation: a digest of the images, model and connectors "
        "(the `serving.epd.dev/compat-generation` label of its pods)."
    )
    current: bool = Field(description="The generation the spec asks for; others are draining.")
    pods: dict[str, int] = Field(default_factory=dict, description="Pods of this generation by tier.")
    readyPods: dict[str, int] = Field(
        default_factory=dict,
        description="Ready pods of this generation by tier: "
        "the router pairs tiers within one generation, so this is its capacity.",
    )


class EPDDeploymentStatus(_Status):
    observedGeneration: int | None = None
    phase: Phase = "Pending"
    topology: Topology | None = None
    endpoint: str | None = Field(None, description="The router Service URL clients talk to.")
    conditions: list[Condition] = Field(default_factory=list)
    tiers: Tiers = Field(default_factory=Tiers)
    generations: list[GenerationStatus] | None = Field(
        None,
        description="vLLM pods by compatibility generation, the current one first: two "
        "while a change of image, model or connector rolls the tiers.",
    )
