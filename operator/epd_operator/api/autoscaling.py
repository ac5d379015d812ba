"""How an `EPDDeployment`'s tiers scale: the autoscaler's bounds, the tier's own load as the metric, and the
engine serving it (an HPA, or KEDA's ScaledObject with its settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .fields import MAX_LIST_ITEMS, HorizontalPodAutoscalerBehavior, KEDAFallback, KEDATrigger, MetricSpec, Strict


class Autoscaling(Strict):
    minReplicas: int = Field(1, ge=1, description="Lower bound for the HPA.")
    maxReplicas: int = Field(ge=1, description="Upper bound for the HPA.")
    metrics: list[MetricSpec] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="autoscaling/v2 MetricSpecs, passed to the HPA as written (engine HPA only). With none (and no "
        "`load`), the "
        "encoder tier scales on its load and the other tiers on 70% average CPU utilisation, which needs a CPU "
        "request (`resources.requests.cpu`).",
    )
    behavior: HorizontalPodAutoscalerBehavior | None = Field(
        None,
        description="autoscaling/v2 HorizontalPodAutoscalerBehavior: the HPA's, or with engine KEDA the HPA KEDA "
        "creates (`advanced.horizontalPodAutoscalerConfig.behavior`).",
    )


# Media items in flight per encoder pod the encoder HPA aims for when `autoscaling` names no metric.
DEFAULT_ENCODER_LOAD_PER_POD = 4


class Load(Strict):
    """The tier's own load: for the encoder tier its demand (media items the routers want encoded and have
    not finished), for prefill and decode the requests the routers have sent to a pod and not yet had answered."""

    targetPerPod: int = Field(
        ge=1,
        description="Load per pod the autoscaler aims for, summed over every router. Encoder tier: its demand, "
        "the media items the routers want encoded and have not finished (on an encoder, spilled to a consumer, "
        "or raw while no encoder serves), `epd_router_encoder_demand` of this deployment's routers; the HPA "
        "reads it as an Object metric of the EPDDeployment, KEDA by the same sum from Prometheus, and either "
        "asks for ceil(demand / targetPerPod) pods. Prefill and decode: requests in flight, the per-pod custom "
        "metric `epd_router_<tier>_inflight` (the operator chart's prometheus-adapter rules serve both).",
    )


# What wakes an encoder tier scaled to zero: KEDA activates the tier once its load query is above this.
DEFAULT_ACTIVATION_THRESHOLD = 0.0
AutoscalingEngine = Literal["HPA", "KEDA"]


class KEDAScaling(Strict):
    """How KEDA scales a tier (`engine: KEDA`): the operator renders a ScaledObject (keda.sh/v1alpha1)."""

    prometheusAddress: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="The Prometheus the load trigger queries (its `serverAddress`), e.g. "
        "`http://prometheus-operated.monitoring.svc:9090`; default: the operator's (`--keda-prometheus-address`, "
        "the operator chart's `keda.prometheusAddress`). Needed when the tier scales on `load`.",
    )
    activationThreshold: float = Field(
        DEFAULT_ACTIVATION_THRESHOLD,
        ge=0,
        description="The load trigger's `activationThreshold`: KEDA scales a tier at zero up (and keeps it above "
        "zero) while the load query is above it. The encoder tier's load is its demand, which counts the media "
        "items the routers send raw while the tier is at zero, so the default (0) wakes the tier on its first "
        "media item.",
    )
    pollingInterval: int | None = Field(
        None, ge=1, description="Seconds between KEDA's queries of the triggers; default KEDA's (30)."
    )
    cooldownPeriod: int | None = Field(
        None,
        ge=0,
        description="Seconds the triggers must stay inactive before KEDA scales the tier to zero (minReplicas 0 "
        "only); default KEDA's (300).",
    )
    triggers: list[KEDATrigger] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="KEDA triggers passed to the ScaledObject as written, after the load trigger (when `load` is "
        "set, or by default on the encoder tier).",
    )
    fallback: KEDAFallback | None = Field(
        None,
        description="The ScaledObject's `fallback`: the replicas to hold while its triggers fail. As KEDA's "
        "webhook requires, the ScaledObject needs a trigger that is not cpu or memory (the load trigger counts), "
        "and behavior scalingModifiers is refused (the operator renders no scalingModifiers).",
    )


class VLLMAutoscaling(Autoscaling):
    """A vLLM tier's autoscaler: on its load (`load`), on any autoscaling/v2 metrics (`metrics`) or KEDA
    triggers (`keda.triggers`), or both; served by an HPA (`engine: HPA`) or by KEDA (`engine: KEDA`)."""

    minReplicas: int = Field(
        1,
        ge=0,
        description="Lower bound. 0 (scale to zero) only for the encoder tier with engine KEDA, whose consumers "
        "then encode the media themselves until KEDA activates the tier.",
    )
    engine: AutoscalingEngine = Field(
        "HPA",
        description="What scales the tier: `HPA`, an autoscaling/v2 HorizontalPodAutoscaler (its load through "
        "prometheus-adapter's custom metrics API), or `KEDA`, a KEDA ScaledObject (its load from Prometheus through "
        "KEDA's Prometheus scaler; KEDA must be installed). Either way the operator never writes its replicas.",
    )
    keda: KEDAScaling | None = Field(None, description="KEDA's settings; engine KEDA only.")
    load: Load | None = Field(
        None,
        description="Scale on this tier's load, `targetPerPod` in flight per pod; with `metrics` (or KEDA "
        "triggers) too, the autoscaler follows whichever asks for more pods. Encoder tier: when neither `load` nor "
        f"`metrics` (nor `keda.triggers`) is set, `load: {{targetPerPod: {DEFAULT_ENCODER_LOAD_PER_POD}}}`.",
    )
