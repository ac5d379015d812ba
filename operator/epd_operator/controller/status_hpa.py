"""A tier's autoscaler as its HorizontalPodAutoscaler says it (engine HPA).

The status shows the HPA's bounds, its replica counts and its own conditions. An HPA that cannot act
(ScalingActive or AbleToScale False, e.g. its metric is not served) is *inactive*, in words that name
the metric it cannot read, the metrics API that should serve it, what of the metric's path the API's
answer says is missing (:func:`missing`) and that the HPA keeps the tier's replicas meanwhile; one with
no ScalingActive verdict yet is *waiting*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.status import AUTOSCALING_INACTIVE, HPACondition, TierAutoscaling

# The HPA controller's reasons for failing to read a metric, and which metrics API and MetricSpec
# type each is about (kube-controller-manager pkg/controller/podautoscaler/horizontal.go).
_METRIC_FAILURES = {
    "FailedGetPodsMetric": ("pods", "custom"),
    "FailedGetObjectMetric": ("object", "custom"),
    "FailedGetExternalMetric": ("external", "external"),
    "FailedGetResourceMetric": ("resource", "resource (metrics-server)"),
    "FailedGetContainerResourceMetric": ("containerResource", "resource (metrics-server)"),
}


@dataclass(frozen=True)
class MetricsWay:
    """Through what an HPA reads a tier's metric, in the status's words: the HPA the operator renders
    (prometheus-adapter serving the custom metrics API), or the HPA KEDA makes for a ScaledObject (KEDA's
    metrics server serving the external metrics API)."""

    server: str  # the metrics API's server
    source: str  # what that server queries


ADAPTER = MetricsWay("the adapter", "Prometheus, for prometheus-adapter")
KEDA_METRICS = MetricsWay("KEDA's metrics server", "KEDA's operator, which queries the triggers")

# What is missing on a metric's way to the HPA, read from the metrics API's answer as the HPA quotes it
# (first match wins): the API not registered (client-go's discovery), registered but its server not
# answering (kube-aggregator's 503 for an APIService whose server is down, then discovery marking its
# version stale: k8s.io/metrics' "no known available metric versions"), its server answering without
# its source (prometheus-adapter's words when its query to Prometheus fails:
# pkg/custom-provider/provider.go), or the source without the metric (custom-metrics-apiserver's not-found).
_DOWN = "its APIService's server, {server}, does not answer"
_MISSING = (
    (") registered", "no APIService serves it"),
    ("the server is currently unable to handle the request", _DOWN),
    ("no known available metric versions found", _DOWN),
    ("Internal error occurred: unable to fetch metrics", "{server} answers but cannot query its source ({source})"),
    (
        "could not find the metric",
        "{server} finds no series of it (not scraped, or not with the labels the adapter's rules expect)",
    ),
)


def missing(message: str, way: MetricsWay = ADAPTER) -> str | None:
    """What the HPA's message about a metric it cannot read says is missing, in words; None when it
    does not say."""
    words = next((words for found, words in _MISSING if found in message), None)
    return None if words is None else words.format(server=way.server, source=way.source)


def autoscaler_conditions(obj: dict[str, Any]) -> list[HPACondition]:
    """An autoscaler's status conditions (an HPA's, or a KEDA ScaledObject's, which has the same shape)."""
    return [
        HPACondition(
            type=str(c.get("type", "")),
            status=c.get("status") if c.get("status") in ("True", "False") else "Unknown",
            reason=str(c.get("reason") or ""),
            message=str(c.get("message") or ""),
        )
        for c in (obj.get("status") or {}).get("conditions") or []
    ]


def hpa_autoscaling(hpa: dict[str, Any]) -> TierAutoscaling:
    spec, st = hpa.get("spec") or {}, hpa.get("status") or {}
    return TierAutoscaling(
        minReplicas=spec.get("minReplicas", 1),
        maxReplicas=spec.get("maxReplicas"),
        desiredReplicas=st.get("desiredReplicas"),
        currentReplicas=st.get("currentReplicas"),
        conditions=autoscaler_conditions(hpa) or None,
    )


def _metric_names(hpa: dict[str, Any], source: str) -> list[str]:
    names = []
    for metric in (hpa.get("spec") or {}).get("metrics") or []:
        block = metric.get(source) or {}
        name = (block.get("metric") or {}).get("name") or block.get("name")
        if name:
            names.append(str(name))
    return names


def _inactive(tier: str, hpa: dict[str, Any], failed: dict[str, Any]) -> str:
    """`<tier> autoscaling inactive: <what it cannot read>: <what is missing>; <what the HPA does
    meanwhile>; <the HPA's reason>: <its message>`. Once the words name what is missing, the HPA's own
    message is left to the tier's autoscaling conditions: it changes while the cause does not (a down
    adapter's 503, then its stale discovery, and back), and each change would be a new message and Event."""
    reason, message = str(failed.get("reason") or ""), str(failed.get("message") or "")
    words = f"{tier} autoscaling inactive"
    gone = None
    if reason in _METRIC_FAILURES:
        source, api = _METRIC_FAILURES[reason]
        names = _metric_names(hpa, source)
        named = [n for n in names if n in message] or names
        if named:
            words += f": the HPA cannot read {', '.join(named)} from the {api} metrics API"
            if (gone := missing(message)) is not None:
                words += f": {gone}"
        # An HPA that cannot compute a replica count leaves the target's replicas as they are
        # (kube-controller-manager: horizontal.go, computeReplicasForMetrics returns -1).
        current = (hpa.get("status") or {}).get("currentReplicas")
        if current is not None:
            replicas = f"{current} replica{'' if current == 1 else 's'}"
            words += f"; the HPA holds the tier at {replicas} until it reads its metrics again"
    if gone is not None:
        return f"{words}; {reason}, in the HPA's words in status.tiers.{tier}.autoscaling.conditions"
    if reason:
        return f"{words}; {worded(reason, message)}"
    return f"{words}: {message}" if message else words


def worded(reason: str, message: str) -> str:
    """A condition as the status quotes it: `<reason>: <message>`, the reason alone when it has no message."""
    return f"{reason}: {message}" if message else reason


def hpa_inactive(tier: str, hpa: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) when the HPA says it cannot act, else None."""
    conditions = {c.get("type"): c for c in (hpa.get("status") or {}).get("conditions") or []}
    failed = next(
        (conditions[t] for t in ("ScalingActive", "AbleToScale") if conditions.get(t, {}).get("status") == "False"),
        None,
    )
    if failed is None:
        return None
    return str(failed.get("reason") or AUTOSCALING_INACTIVE), _inactive(tier, hpa, failed)


def hpa_waiting(hpa: dict[str, Any]) -> bool:
    """The HPA has not yet said it computes a replica count (no ScalingActive True)."""
    conditions = {c.get("type"): c for c in (hpa.get("status") or {}).get("conditions") or []}
    return conditions.get("ScalingActive", {}).get("status") != "True"
