"""What a tier's HPA scales on: its load, the user's autoscaling/v2 metrics, or CPU utilisation.

The encoder tier's load is its demand: the media items the routers want encoded and have not
finished (on an encoder, spilled to a consumer, or raw because no encoder serves; router/encoding.py),
`epd_router_encoder_demand{epd_deployment}` summed over every router of the deployment. It belongs to
the deployment, not to any encoder pod (spilled and raw items have none), so the HPA reads it as an
Object metric describing the EPDDeployment, with an AverageValue target: the HPA divides it by the
tier's pod count, and asks for ceil(demand / targetPerPod) replicas in one decision. KEDA reads the
same gauge with the same sum (render/keda.py).

A prefill or decode tier's load is the work every router has in flight to each of its pods
(requests), exported per backend pod and read as the per-pod metric `load_metric_name(role)`.

The operator chart's prometheus-adapter rules (charts/epd-operator/prometheus-adapter/values.yaml)
serve both through the custom metrics API; a test evaluates them against the router's own
exposition and the metrics the rendered HPAs ask for.
"""

from __future__ import annotations

from typing import Any

from ..api.autoscaling import DEFAULT_ENCODER_LOAD_PER_POD, Autoscaling, VLLMAutoscaling
from ..api.spec import API_VERSION, KIND
from ..router.contract import ENCODER_DEMAND_METRIC

JSON = dict[str, Any]

CPU_TARGET_UTILISATION = 70  # percent of the CPU request, the fallback when no metric is named
CPU_UTILISATION = {
    "type": "Resource",
    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": CPU_TARGET_UTILISATION}},
}
LOAD_ROLES = ("prefill", "decode")  # per-pod in-flight load; the encoder tier's load is its demand


def load_metric_name(role: str) -> str:
    """The custom metric (per pod) that carries a prefill or decode tier's in-flight work."""
    if role not in LOAD_ROLES:
        raise ValueError(f"no per-pod load metric for the {role} tier")
    return f"epd_router_{role}_inflight"


def encoder_demand_metric(deployment: str, target_per_pod: int) -> JSON:
    """The encoder tier's demand (module doc), an Object metric of the EPDDeployment `deployment`."""
    return {
        "type": "Object",
        "object": {
            "describedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": deployment},
            "metric": {"name": ENCODER_DEMAND_METRIC},
            "target": {"type": "AverageValue", "averageValue": str(target_per_pod)},
        },
    }


def load_metric(deployment: str, role: str, target_per_pod: int) -> JSON:
    if role == "encoder":
        return encoder_demand_metric(deployment, target_per_pod)
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": load_metric_name(role)},
            "target": {"type": "AverageValue", "averageValue": str(target_per_pod)},
        },
    }


def hpa_metrics(deployment: str, role: str, autoscaling: Autoscaling) -> list[JSON]:
    """The HPA's metrics: the tier's load (when asked for, and by default on the encoder tier), then
    the user's metrics as written; CPU utilisation when neither is set."""
    metrics: list[JSON] = []
    load = autoscaling.load if isinstance(autoscaling, VLLMAutoscaling) else None
    if load is not None:
        metrics.append(load_metric(deployment, role, load.targetPerPod))
    elif role == "encoder" and not autoscaling.metrics:
        metrics.append(load_metric(deployment, role, DEFAULT_ENCODER_LOAD_PER_POD))
    metrics += autoscaling.metrics
    return metrics or [CPU_UTILISATION]
