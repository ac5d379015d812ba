"""A tier's autoscaler as its KEDA ScaledObject says it (engine KEDA, keda.sh/v1alpha1).

KEDA's conditions: Ready=False, it cannot scale (TriggerError: a trigger fails, e.g. Prometheus is
unreachable or the query is bad); Fallback=True, it holds the fallback replicas because the triggers
fail; Paused=True, someone paused it (annotation autoscaling.keda.sh/paused), which is shown but does
not degrade the deployment. A ScaledObject KEDA has not marked Ready yet is *waiting*.

KEDA's own HPA (`status.hpaName`, which carries the ScaledObject's labels) reads the triggers through
KEDA's metrics server (the external metrics API). While that server is away the ScaledObject stays Ready
(KEDA's operator still reaches the triggers) and only the HPA says it cannot read its metric: the tier is
inactive in the same words as an HPA the operator renders, naming KEDA's metrics server. Its
ScalingDisabled at zero replicas is not a failure: KEDA scales from and to zero itself.
"""

from __future__ import annotations

from typing import Any

from ..api.status import AUTOSCALING_INACTIVE, TierAutoscaling
from .pods import condition
from .status_hpa import KEDA_METRICS, autoscaler_conditions, hpa_inactive


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


def keda_hpa_name(name: str, so: dict[str, Any]) -> str:
    """The HPA KEDA made for the ScaledObject `name`: the one its status names, else KEDA's default name."""
    return str((so.get("status") or {}).get("hpaName") or f"keda-hpa-{name}")


def keda_hpa_inactive(tier: str, hpa: dict[str, Any] | None) -> tuple[str, str, bool] | None:
    """(reason, message, degrades) when KEDA's HPA cannot read its metric, else None."""
    found = hpa_inactive(tier, hpa, KEDA_METRICS) if hpa is not None else None
    return None if found is None else (*found, True)


def keda_waiting(so: dict[str, Any]) -> bool:
    """KEDA has not marked the ScaledObject Ready yet."""
    return condition(so, "Ready").get("status") != "True"
