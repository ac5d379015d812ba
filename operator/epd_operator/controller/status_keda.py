"""A tier's autoscaler as its KEDA ScaledObject says it (engine KEDA, keda.sh/v1alpha1).

KEDA's conditions: Ready=False, it cannot scale (TriggerError: a trigger fails, e.g. Prometheus is
unreachable or the query is bad); Fallback=True, it holds the fallback replicas because the triggers
fail; Paused=True, someone paused it (annotation autoscaling.keda.sh/paused), which is shown but does
not degrade the deployment. A ScaledObject KEDA has not marked Ready yet is *waiting*.
"""

from __future__ import annotations

from typing import Any

from ..api.status import AUTOSCALING_INACTIVE, TierAutoscaling
from .pods import condition
from .status_hpa import autoscaler_conditions


def keda_autoscaling(so: dict[str, Any]) -> TierAutoscaling:
    spec = so.get("spec") or {}
    return TierAutoscaling(
        engine="KEDA",
        minReplicas=spec.get("minReplicaCount", 0),  # KEDA's default
        maxReplicas=spec.get("maxReplicaCount", 100),  # KEDA's default
        conditions=autoscaler_conditions(so) or None,
    )


def keda_inactive(tier: str, so: dict[str, Any]) -> tuple[str, str, bool] | None:
    """(reason, message, degrades) when a ScaledObject says KEDA cannot scale its tier, else None."""
    conditions = {c.get("type"): c for c in (so.get("status") or {}).get("conditions") or []}
    ready, fallback, paused = (conditions.get(t, {}) for t in ("Ready", "Fallback", "Paused"))
    for found, words in (
        (ready if ready.get("status") == "False" else None, "KEDA cannot scale it"),
        (fallback if fallback.get("status") == "True" else None, "KEDA holds its fallback replicas"),
    ):
        if found is not None:
            reason, message = str(found.get("reason") or AUTOSCALING_INACTIVE), str(found.get("message") or "")
            return reason, f"{tier} autoscaling inactive: {words} (ScaledObject {reason}: {message})", True
    if paused.get("status") == "True":
        reason = str(paused.get("reason") or "ScaledObjectPaused")
        return reason, f"{tier} autoscaling paused: its ScaledObject is paused ({paused.get('message') or ''})", False
    return None


def keda_waiting(so: dict[str, Any]) -> bool:
    """KEDA has not marked the ScaledObject Ready yet."""
    return condition(so, "Ready").get("status") != "True"
