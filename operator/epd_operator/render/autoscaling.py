"""What a tier's HPA scales on: its load, the user's autoscaling/v2 metrics, or CPU utilisation.

A vLLM tier's load is the work every router has in flight to each of its pods (media items for
encoders, requests for prefill and decode). The routers export it per backend pod; the operator
chart's prometheus-adapter rules (charts/epd-operator/prometheus-adapter/values.yaml) serve it
through the custom metrics API as the per-pod metric `load_metric_name(role)`, which the rendered
HPA asks for. A test evaluates those rules against the router's own exposition and this name.
"""

from __future__ import annotations

from typing import Any

from ..api.autoscaling import DEFAULT_ENCODER_LOAD_PER_POD, Autoscaling, VLLMAutoscaling

JSON = dict[str, Any]

CPU_TARGET_UTILISATION = 70  # percent of the CPU request, the fallback when no metric is named
CPU_UTILISATION = {
    "type": "Resource",
    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": CPU_TARGET_UTILISATION}},
}
LOAD_ROLES = ("encoder", "prefill", "decode")


def load_metric_name(role: str) -> str:
    """The custom metric (per pod) that carries a vLLM tier's in-flight work."""
    if role not in LOAD_ROLES:
        raise ValueError(f"no load metric for the {role} tier")
    return f"epd_router_{role}_inflight"


def load_metric(role: str, target_per_pod: int) -> JSON:
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": load_metric_name(role)},
            "target": {"type": "AverageValue", "averageValue": str(target_per_pod)},
        },
    }


def hpa_metrics(role: str, autoscaling: Autoscaling) -> list[JSON]:
    """The HPA's metrics: the tier's load (when asked for, and by default on the encoder tier), then
    the user's metrics as written; CPU utilisation when neither is set."""
    metrics: list[JSON] = []
    load = autoscaling.load if isinstance(autoscaling, VLLMAutoscaling) else None
    if load is not None:
        metrics.append(load_metric(role, load.targetPerPod))
    elif role == "encoder" and not autoscaling.metrics:
        metrics.append(load_metric(role, DEFAULT_ENCODER_LOAD_PER_POD))
    metrics += autoscaling.metrics
    return metrics or [CPU_UTILISATION]
