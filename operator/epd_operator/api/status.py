"""The `EPDDeployment` status: what the operator reports back, per tier.

Only the operator writes it; the CRD's status schema is generated from these models so that
`kubectl get epd` columns and `kubectl explain epd.status` stay in step with the code.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

Phase = Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"]
ConditionType = Literal["Ready", "Progressing", "Degraded", "SpecValid"]
# SpecValid reasons: the spec broke our rules, or the API server refused an object rendered from it.
INVALID_SPEC = "InvalidSpec"
REFUSED_BY_API_SERVER = "RefusedByAPIServer"


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Condition(_Status):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="CamelCase reason, as in Kubernetes conditions.")
    message: str = ""
    lastTransitionTime: Optional[str] = None
    observedGeneration: Optional[int] = None


class TierAutoscaling(_Status):
    minReplicas: Optional[int] = None
    maxReplicas: Optional[int] = None
    desiredReplicas: Optional[int] = Field(None, description="What the HPA currently asks for.")
    currentReplicas: Optional[int] = None


class TierStatus(_Status):
    replicas: int = 0
    readyReplicas: int = 0
    updatedReplicas: int = 0
    availableReplicas: int = 0
    ready: str = Field("0/0", description="ready/desired, for printer columns.")
    autoscaling: Optional[TierAutoscaling] = None
    message: Optional[str] = Field(None, description="Why pods of this tier are not ready, when known "
                                   "(e.g. the scheduler's reason for pods it cannot place).")


class Tiers(_Status):
    encoder: Optional[TierStatus] = None
    prefill: Optional[TierStatus] = None
    decode: Optional[TierStatus] = None
    router: Optional[TierStatus] = None


class EPDDeploymentStatus(_Status):
    observedGeneration: Optional[int] = None
    phase: Phase = "Pending"
    topology: Optional[Literal["E+PD", "E/P/D"]] = None
    endpoint: Optional[str] = Field(None, description="The router Service URL clients talk to.")
    conditions: list[Condition] = Field(default_factory=list)
    tiers: Tiers = Field(default_factory=Tiers)
