"""A tier's autoscaler as its KEDA ScaledObject says it (engine KEDA, keda.sh/v1alpha1).

KEDA's conditions: Ready=False, it cannot scale (TriggerError: a trigger fails, e.g. Prometheus is
unreachable or the query is bad); Fallback=True, it holds the fallback replicas because the triggers
fail; HPAActive=False, the HPA KEDA made cannot act (KEDA 2.21 mirrors that HPA's ScalingActive into it,
with the HPA's reason and words: pkg/scaling/executor's checkHPAHealth), e.g. while KEDA's metrics server
is away, which leaves the ScaledObject Ready since KEDA's operator still reaches the triggers; Paused=True,
someone paused it (annotation autoscaling.keda.sh/paused), which is shown but does not degrade the
deployment. A ScaledObject KEDA has not marked Ready yet is *waiting*.
"""

from __future__ import annotations

from typing import Any

from ..api.status import AUTOSCALING_INACTIVE, TierAutoscaling
from .pods import condition
from .status_hpa import KEDA_METRICS, autoscaler_conditions, missing, worded


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
            return reason, f"{tier} autoscaling inactive: {words} (ScaledObject {worded(reason, message)})", True
    hpa = conditions.get("HPAActive", {})
    if hpa.get("status") == "False":
        return _hpa_inactive(tier, hpa)
    if paused.get("status") == "True":
        reason = str(paused.get("reason") or "ScaledObjectPaused")
        said = str(paused.get("message") or "")
        return reason, f"{tier} autoscaling paused: its ScaledObject is paused" + (f" ({said})" if said else ""), False
    return None


def _hpa_inactive(tier: str, hpa: dict[str, Any]) -> tuple[str, str, bool]:
    """KEDA's HPA cannot act: what is missing on its metric's way when its words say (the same words whichever
    way the HPA puts it, so one message while the cause holds), else KEDA's words."""
    reason, message = str(hpa.get("reason") or AUTOSCALING_INACTIVE), str(hpa.get("message") or "")
    gone = missing(message, KEDA_METRICS)
    if gone is None:
        return (
            reason,
            f"{tier} autoscaling inactive: KEDA's HPA cannot act (ScaledObject HPAActive {worded(reason, message)})",
            True,
        )
    return (
        reason,
        f"{tier} autoscaling inactive: KEDA's HPA cannot read its metric from the external metrics API: {gone}; the "
        f"HPA holds the tier at its replicas until it reads it again; {reason}, in the HPA's words in "
        f"status.tiers.{tier}.autoscaling.conditions (HPAActive)",
        True,
    )


def keda_waiting(so: dict[str, Any]) -> bool:
    """KEDA has not marked the ScaledObject Ready yet."""
    return condition(so, "Ready").get("status") != "True"
