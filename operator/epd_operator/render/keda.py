"""What KEDA scales a tier with (`autoscaling.engine: KEDA`): a ScaledObject (keda.sh/v1alpha1, the KEDA
release `kube_schemas.KEDA_VERSION`) targeting the tier's Deployment or LeaderWorkerSet.

The load trigger is KEDA's Prometheus scaler on the same quantity the HPA path reads through
prometheus-adapter (render/autoscaling.py). For the encoder tier, its demand: the media items the
routers want encoded and have not finished (`epd_router_encoder_demand` of the deployment's routers,
summed), which counts the items spilled to consumers and the items sent raw while the tier is at zero,
so one query both sizes the tier and wakes it (`activationThreshold`). For prefill and decode, the work
every router has in flight to the tier's pods (`epd_router_endpoint_inflight`, summed over the routers
and the tier's pods). KEDA hands the value to the HPA it creates as an external metric of type
AverageValue, which the HPA divides by the tier's pod count, so `threshold: targetPerPod` aims for the
same average per pod as the HPA path.

Pure: no I/O. The Prometheus address is the spec's, else the operator's default (a render argument).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from ..api.autoscaling import DEFAULT_ENCODER_LOAD_PER_POD, KEDAScaling, VLLMAutoscaling
from ..api.kube_schemas import KEDA_API_VERSION
from ..api.labels import MANAGED_BY_LABEL
from ..api.spec import EPDDeployment
from ..api.validation import FieldError, SpecError
from ..router.contract import DEMAND_DEPLOYMENT_LABEL, ENCODER_DEMAND_METRIC
from .autoscaling import CPU_TARGET_UTILISATION
from .naming import ENCODER

JSON = dict[str, Any]

SCALED_OBJECT = "ScaledObject"
LOAD_TRIGGER = "load"
# KEDA copies a ScaledObject's labels onto the HPA it creates, unless named here: the HPA is KEDA's to
# manage (its own managed-by label stays), not the operator's, so the operator neither watches nor prunes it.
HPA_EXCLUDED_LABELS_ANNOTATION = "scaledobject.keda.sh/hpa-excluded-labels"
# Pods of a Deployment are `<deployment>-<template hash>-<suffix>`; LeaderWorkerSet leaders (the only pods of
# a multi-node tier the routers send work to) are `<lws>-<group index>`. PromQL regexes are anchored.
_DEPLOYMENT_PODS = "{name}-[a-z0-9]+-[a-z0-9]+"
_LWS_LEADERS = "{name}-[0-9]+"


def uses_keda(autoscaling: object) -> TypeGuard[VLLMAutoscaling]:
    """Whether a tier's `autoscaling` asks for KEDA."""
    return isinstance(autoscaling, VLLMAutoscaling) and autoscaling.engine == "KEDA"


def _number(value: float) -> str:
    """A trigger metadata value (KEDA parses strings): `4`, `0.5`."""
    return f"{value:g}"


def load_query(epd: EPDDeployment, role: str, workload: JSON) -> str:
    """PromQL: the encoder tier's demand summed over the deployment's routers; a prefill or decode tier's
    work in flight, summed over its pods and every router. 0, never empty, when no router reports."""
    name, namespace = workload["metadata"]["name"], workload["metadata"]["namespace"]
    if role == ENCODER:
        matchers = f'namespace="{namespace}",{DEMAND_DEPLOYMENT_LABEL}="{epd.name}"'
        return f"sum({ENCODER_DEMAND_METRIC}{{{matchers}}}) or vector(0)"
    pods = (_LWS_LEADERS if workload["kind"] == "LeaderWorkerSet" else _DEPLOYMENT_PODS).format(name=name)
    return (
        f'sum(epd_router_endpoint_inflight{{namespace="{namespace}",role="{role}",backend_pod=~"{pods}"}}) or vector(0)'
    )


def triggers(
    epd: EPDDeployment, role: str, workload: JSON, autoscaling: VLLMAutoscaling, prometheus_address: str | None
) -> list[JSON]:
    """The load trigger (when asked for, and by default on the encoder tier), then the user's triggers as
    written; KEDA's CPU trigger at 70% utilisation when neither is set."""
    keda = autoscaling.keda or KEDAScaling()
    target = autoscaling.load.targetPerPod if autoscaling.load is not None else None
    if target is None and role == ENCODER and not keda.triggers:
        target = DEFAULT_ENCODER_LOAD_PER_POD
    out: list[JSON] = []
    if target is not None:
        address = keda.prometheusAddress or prometheus_address
        if address is None:
            raise SpecError(
                [
                    FieldError(
                        f"spec.{role}.autoscaling.keda.prometheusAddress",
                        "KEDA reads this tier's load from Prometheus: name it here, or give the operator a default "
                        "(--keda-prometheus-address, the operator chart's keda.prometheusAddress)",
                    )
                ]
            )
        out.append(
            {
                "type": "prometheus",
                "name": LOAD_TRIGGER,
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": address,
                    "query": load_query(epd, role, workload),
                    "threshold": _number(target),
                    "activationThreshold": _number(keda.activationThreshold),
                },
            }
        )
    out += keda.triggers
    if not out:
        out.append({"type": "cpu", "metricType": "Utilization", "metadata": {"value": str(CPU_TARGET_UTILISATION)}})
    return out


def scaled_object(
    epd: EPDDeployment, role: str, workload: JSON, autoscaling: VLLMAutoscaling, prometheus_address: str | None
) -> JSON:
    """The ScaledObject that scales `workload` (the tier's rendered Deployment or LeaderWorkerSet)."""
    keda = autoscaling.keda or KEDAScaling()
    meta = workload["metadata"]
    spec: JSON = {
        "scaleTargetRef": {"apiVersion": workload["apiVersion"], "kind": workload["kind"], "name": meta["name"]},
        "minReplicaCount": autoscaling.minReplicas,
        "maxReplicaCount": autoscaling.maxReplicas,
    }
    if keda.pollingInterval is not None:
        spec["pollingInterval"] = keda.pollingInterval
    if keda.cooldownPeriod is not None:
        spec["cooldownPeriod"] = keda.cooldownPeriod
    if autoscaling.behavior:
        spec["advanced"] = {"horizontalPodAutoscalerConfig": {"behavior": autoscaling.behavior}}
    spec["triggers"] = triggers(epd, role, workload, autoscaling, prometheus_address)
    if keda.fallback is not None:
        spec["fallback"] = keda.fallback
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": SCALED_OBJECT,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": dict(meta["labels"]),
            "annotations": {HPA_EXCLUDED_LABELS_ANNOTATION: MANAGED_BY_LABEL},
        },
        "spec": spec,
    }
