"""An HPA that cannot act shows in the EPDDeployment, on a REAL control plane: kube-controller-manager's
own HPA controller judges the HPA the operator renders, and this cluster serves no custom metrics API
(no prometheus-adapter), so the encoder HPA cannot read its load. The operator must report the HPA's
verdict in its words, turn the deployment Degraded, post an Event, and stay quiet at rest.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epd_operator.controller.metrics import Metrics
from epd_operator.router.contract import ENCODER_DEMAND_METRIC
from tests.support.cluster import KubeView, volumes
from tests.support.operator_run import (
    condition,
    create,
    epd,
    epd_doc,
    operator_in_process,
    phase,
    posted,
    resyncs,
    wait_until,
    writes,
)
from tests.support.render_examples import NIXL_AUTOSCALED

HPA_API = "autoscaling/v2"
LOAD = ENCODER_DEMAND_METRIC


@pytest.fixture
def ns(kube: KubeView) -> KubeView:
    volumes(kube, "ec-cache", "models")
    return kube


@pytest.fixture
async def operator(ns: KubeView) -> AsyncIterator[Metrics]:
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "0.3") as m:
        yield m


def hpa_conditions(kube: KubeView, name: str = "vl-encoder") -> dict[str, dict[str, Any]]:
    hpa = kube.get(HPA_API, "HorizontalPodAutoscaler", name) or {}
    return {c["type"]: c for c in (hpa.get("status") or {}).get("conditions") or []}


async def test_an_hpa_whose_metric_is_not_served_shows_in_status_events_and_describe(ns, operator):
    doc = epd_doc(NIXL_AUTOSCALED)
    assert doc["spec"]["encoder"]["autoscaling"]["load"] == {"targetPerPod": 4}
    await create(ns, doc)

    # The real HPA controller's verdict on the HPA the operator rendered.
    await wait_until(
        lambda: hpa_conditions(ns).get("ScalingActive", {}).get("status") == "False",
        60,
        lambda: f"the HPA never reported ScalingActive=False: {hpa_conditions(ns)}",
    )
    verdict = hpa_conditions(ns)["ScalingActive"]
    assert verdict["reason"] == "FailedGetObjectMetric"
    assert f"unable to get metric {LOAD}" in verdict["message"]
    assert "custom metrics API" in verdict["message"]

    # Tiers ready, autoscaler unable to act: Degraded, never Ready.
    await phase(ns, "Degraded", timeout=90)
    await wait_until(lambda: epd(ns)["status"]["tiers"]["encoder"]["ready"] == "2/2", 60, lambda: epd(ns)["status"])
    status = epd(ns)["status"]
    shown = {c["type"]: c for c in status["tiers"]["encoder"]["autoscaling"]["conditions"]}
    verdict = hpa_conditions(ns)["ScalingActive"]
    assert shown["ScalingActive"] == {k: verdict[k] for k in ("type", "status", "reason", "message")}
    assert shown.keys() == hpa_conditions(ns).keys()
    assert status["tiers"]["encoder"]["autoscaling"]["minReplicas"] == 2
    active = condition(epd(ns), "AutoscalingActive")
    assert (active["status"], active["reason"]) == ("False", "FailedGetObjectMetric")
    said = (
        f"encoder autoscaling inactive: the HPA cannot read {LOAD} from the custom metrics API: no APIService serves "
        "it; the HPA holds the tier at 2 replicas until it reads its metrics again; FailedGetObjectMetric, in the "
        "HPA's words in status.tiers.encoder.autoscaling.conditions"
    )
    assert active["message"] == said
    degraded = condition(epd(ns), "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == ("True", "AutoscalingInactive", said)
    assert condition(epd(ns), "Ready")["status"] == "True"  # the pods serve; the autoscaler cannot act
    await posted(ns, "Warning", "AutoscalingInactive", said)

    # What a person reads.
    text = ns.kubectl("describe", "epd", "vl").stdout
    conditions = text[text.index("Conditions:") :]
    assert re.search(r"Reason:\s+AutoscalingInactive", conditions), conditions
    assert re.search(rf"Message:\s+encoder autoscaling inactive: the HPA cannot read {LOAD}", conditions), conditions
    assert re.search(r"Type:\s+AutoscalingActive", conditions), conditions
    events = text[text.index("Events:") :]
    assert re.search(r"Warning\s+AutoscalingInactive\s+\S+\s+epd-operator\s+encoder autoscaling inactive", events)
    table = ns.kubectl("get", "epd").stdout.splitlines()
    assert table[1].split()[:6] == ["vl", "E/P/D", "2/2", "2/2", "2/2", "Degraded"], table

    # At rest with an inactive HPA: nothing written (the HPA's own status does not change either).
    await resyncs(operator, 2)
    mark = writes(operator)
    await resyncs(operator, 5)
    assert writes(operator) == mark
