"""controller/status: what the EPDDeployment says about its HPAs, from HPAs shaped as kube-controller-manager's
HPA controller writes them (pkg/controller/podautoscaler/horizontal.go: condition types, reasons and
message wording). An HPA that cannot act must never hide behind a Ready deployment."""

from __future__ import annotations

import pytest

from epd_operator.api.status import TierAutoscaling
from epd_operator.controller.status import (
    AutoscalingVerdict,
    TierInput,
    autoscaling_verdict,
    derive_status,
    tier_state,
    transitions,
)
from epd_operator.controller.status_hpa import hpa_inactive, missing
from tests.support.workloads import settled_deployment

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"
LOAD = "epd_router_encoder_inflight"
# The words of the real HPA controller on a cluster that serves no custom metrics API
# (tests/integration/test_autoscaling_status.py sees them on the local control plane).
NOT_SERVED = (
    f"the HPA was unable to compute the replica count: unable to get metric {LOAD}: unable to fetch metrics "
    "from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered"
)


def hpa(*conditions: tuple[str, str, str, str], metrics=None, desired=None, current=1) -> dict:
    return {
        "spec": {
            "minReplicas": 1,
            "maxReplicas": 8,
            "metrics": metrics
            if metrics is not None
            else [{"type": "Pods", "pods": {"metric": {"name": LOAD}, "target": {"type": "AverageValue"}}}],
        },
        "status": {
            "currentReplicas": current,
            **({"desiredReplicas": desired} if desired is not None else {}),
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": T0}
                for t, s, r, m in conditions
            ],
        },
    }


ABLE = ("AbleToScale", "True", "SucceededGetScale", "the HPA controller was able to get the target's current scale")
ACTIVE = (
    "ScalingActive",
    "True",
    "ValidMetricFound",
    f"the HPA was able to successfully calculate a replica count from pods metric {LOAD}",
)
WITHIN = ("ScalingLimited", "False", "DesiredWithinRange", "the desired count is within the acceptable range")
NOT_ZERO = ("ScaledToZero", "False", "NotScaledToZero", "the HPA controller did not scale the workload to zero")
INACTIVE = ("ScalingActive", "False", "FailedGetPodsMetric", NOT_SERVED)


def derive(encoder_hpa, previous=None, now=T0, decode=None):
    return derive_status(
        tiers={
            "encoder": TierInput(settled_deployment(1), encoder_hpa),
            "decode": decode or TierInput(settled_deployment(1)),
        },
        topology="E+PD",
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=previous,
        now=now,
    )


def cond(status, type_):
    return next((c for c in status.conditions if c.type == type_), None)


def shown(tier: TierInput) -> TierAutoscaling:
    autoscaling = tier_state(tier).status.autoscaling
    assert autoscaling is not None
    return autoscaling


def verdict_of(tiers: dict[str, TierInput]) -> AutoscalingVerdict:
    verdict = autoscaling_verdict(tiers)
    assert verdict is not None
    return verdict


def test_the_tier_carries_the_hpas_own_conditions_and_replicas():
    assert shown(TierInput(settled_deployment(1), hpa(ABLE, INACTIVE, current=1))).model_dump(exclude_none=True) == {
        "minReplicas": 1,
        "maxReplicas": 8,
        "currentReplicas": 1,
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale", "message": ABLE[3]},
            {"type": "ScalingActive", "status": "False", "reason": "FailedGetPodsMetric", "message": NOT_SERVED},
        ],
    }
    odd = shown(TierInput(settled_deployment(1), hpa(("ScalingActive", "Maybe", "", "")))).conditions
    assert odd is not None and odd[0].status == "Unknown"
    # what the HPA leaves out stays empty: the operator adds no words of its own
    bare = hpa()
    bare["status"]["conditions"] = [{"status": "False"}]
    assert shown(TierInput(settled_deployment(1), bare)).model_dump()["conditions"] == [
        {"type": "", "status": "False", "reason": "", "message": ""}
    ]


def test_an_hpa_whose_metric_is_not_served_degrades_a_ready_deployment_and_says_so():
    status = derive(hpa(ABLE, NOT_ZERO, INACTIVE))
    assert status.phase == "Degraded"
    expected = (
        f"encoder autoscaling inactive: the HPA cannot read {LOAD} from the custom metrics API: no APIService serves "
        "it; the HPA holds the tier at 1 replica until it reads its metrics again; FailedGetPodsMetric, in the HPA's "
        "words in status.tiers.encoder.autoscaling.conditions"
    )
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason, scaling.message) == ("False", "FailedGetPodsMetric", expected)
    degraded = cond(status, "Degraded")
    assert (degraded.status, degraded.reason, degraded.message) == ("True", "AutoscalingInactive", expected)
    assert cond(status, "Ready").status == "True"  # the pods serve; only the autoscaler cannot act


def test_an_acting_hpa_keeps_the_deployment_ready():
    status = derive(hpa(ABLE, NOT_ZERO, ACTIVE, WITHIN, desired=1))
    assert status.phase == "Ready"
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("True", "ScalingActive")
    assert cond(status, "Degraded").reason == "AsExpected"
    # limited by maxReplicas is the HPA acting as asked: shown on the tier, not a degradation
    at_max = ("ScalingLimited", "True", "TooManyReplicas", "the desired replica count is more than the maximum")
    assert derive(hpa(ABLE, ACTIVE, at_max, desired=8)).phase == "Ready"


def test_no_autoscaling_condition_without_an_hpa():
    status = derive(None)
    assert status.phase == "Ready" and cond(status, "AutoscalingActive") is None
    assert autoscaling_verdict({"decode": TierInput(settled_deployment(1))}) is None


def test_an_hpa_that_has_not_reported_yet_is_unknown_and_does_not_degrade():
    for fresh in ({"spec": {"maxReplicas": 8}}, hpa(ABLE)):
        status = derive(fresh)
        scaling = cond(status, "AutoscalingActive")
        assert (scaling.status, scaling.reason) == ("Unknown", "HPAPending")
        assert scaling.message == "waiting for the first replica count of the HPA of encoder"
        assert status.phase == "Ready"


def test_a_rollout_in_progress_wins_over_an_inactive_hpa():
    rolling = TierInput({"metadata": {"generation": 2}, "spec": {"replicas": 1}, "status": {"observedGeneration": 1}})
    status = derive(hpa(ABLE, INACTIVE), decode=rolling)
    assert status.phase == "Progressing"
    assert cond(status, "AutoscalingActive").status == "False"
    assert (cond(status, "Degraded").status, cond(status, "Degraded").reason) == ("False", "AsExpected")


def test_every_failing_hpa_is_named_and_the_first_gives_the_reason():
    cpu = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}]
    no_cpu = (
        "ScalingActive",
        "False",
        "FailedGetResourceMetric",
        "the HPA was unable to compute the replica count: failed to get cpu utilization: unable to get metrics "
        "for resource cpu: no metrics returned from resource metrics API",
    )
    cannot_scale = ("AbleToScale", "False", "FailedGetScale", "the HPA controller was unable to get the target's")
    verdict = verdict_of(
        {
            "encoder": TierInput(settled_deployment(1), hpa(cannot_scale)),
            "decode": TierInput(settled_deployment(1), hpa(ABLE, no_cpu, metrics=cpu)),
            "router": TierInput(settled_deployment(1), hpa(("ScalingActive", "False", "", "no reason given"))),
        }
    )
    assert verdict.active is False and verdict.reason == "FailedGetScale"
    assert verdict.message.split("; ") == [
        "encoder autoscaling inactive",
        f"FailedGetScale: {cannot_scale[3]}",
        "decode autoscaling inactive: the HPA cannot read cpu from the resource (metrics-server) metrics API",
        "the HPA holds the tier at 1 replica until it reads its metrics again",
        f"FailedGetResourceMetric: {no_cpu[3]}",
        "router autoscaling inactive: no reason given",
    ]


def test_only_the_metric_the_hpa_names_in_its_message_is_blamed():
    other = {"type": "Pods", "pods": {"metric": {"name": "vllm_num_requests_waiting"}, "target": {}}}
    both = [other, {"type": "Pods", "pods": {"metric": {"name": LOAD}, "target": {}}}]
    verdict = verdict_of({"encoder": TierInput(settled_deployment(1), hpa(ABLE, INACTIVE, metrics=both))})
    assert f"cannot read {LOAD} from" in verdict.message and "vllm_num" not in verdict.message
    vague = ("ScalingActive", "False", "FailedGetExternalMetric", "unable to get external metric")
    external = [{"type": "External", "external": {"metric": {"name": "queue_depth"}, "target": {}}}]
    verdict = verdict_of({"encoder": TierInput(settled_deployment(1), hpa(vague, metrics=external))})
    assert verdict.message.startswith("encoder autoscaling inactive: the HPA cannot read queue_depth from the external")


def test_events_when_autoscaling_stops_changes_and_comes_back():
    active = derive(hpa(ABLE, ACTIVE, desired=1))
    inactive = derive(hpa(ABLE, INACTIVE), previous=active, now=T1)
    (event,) = transitions(active, inactive)  # one event, not a second generic Degraded one
    assert (event.type, event.reason) == ("Warning", "AutoscalingInactive")
    assert event.message == cond(inactive, "AutoscalingActive").message
    assert transitions(inactive, derive(hpa(ABLE, INACTIVE), previous=inactive, now=T2)) == []
    other = ("ScalingActive", "False", "FailedGetPodsMetric", "the HPA was unable to compute: no metrics returned")
    changed = derive(hpa(ABLE, other), previous=inactive, now=T2)
    assert [(e.type, e.reason) for e in transitions(inactive, changed)] == [("Warning", "AutoscalingInactive")]
    back = derive(hpa(ABLE, ACTIVE, desired=1), previous=changed, now=T2)
    assert [(e.type, e.reason, e.message) for e in transitions(changed, back)] == [
        ("Normal", "AutoscalingActive", "every autoscaler computes its replica count from its metrics"),
        ("Normal", "Ready", "every tier has its pods ready"),
    ]
    # an HPA inactive from the very first status is reported too
    assert [e.reason for e in transitions(None, derive(hpa(ABLE, INACTIVE)))] == ["AutoscalingInactive"]


def test_the_condition_keeps_its_transition_time_while_its_value_holds():
    first = derive(hpa(ABLE, INACTIVE))
    later = derive(hpa(ABLE, ("ScalingActive", "False", "FailedGetPodsMetric", "other words")), first, now=T1)
    assert cond(later, "AutoscalingActive").lastTransitionTime == T0
    assert cond(derive(hpa(ABLE, ACTIVE), later, now=T2), "AutoscalingActive").lastTransitionTime == T2


def test_autoscaling_degradation_is_not_mistaken_for_lost_pods():
    degraded = derive(hpa(ABLE, INACTIVE))
    # the encoder tier scales up (HPA acting again); its pods still loading are Progressing, not lost
    up = TierInput(
        {
            "metadata": {"generation": 1},
            "spec": {"replicas": 2},
            "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1},
        },
        hpa(ABLE, ACTIVE, desired=2),
    )
    status = derive_status(
        tiers={"encoder": up, "decode": TierInput(settled_deployment(1))},
        topology="E+PD",
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=degraded,
        now=T1,
    )
    assert status.phase == "Progressing"


def test_the_autoscaling_condition_is_stamped_with_the_generation_like_the_others():
    status = derive_status(
        tiers={"encoder": TierInput(settled_deployment(1), hpa(ABLE, ACTIVE, desired=1))},
        topology="E+PD",
        endpoint=None,
        observed_generation=7,
        spec_errors=None,
        previous=None,
        now=T0,
    )
    assert {c.type: c.observedGeneration for c in status.conditions} == {
        "Ready": 7,
        "Progressing": 7,
        "Degraded": 7,
        "SpecValid": 7,
        "AutoscalingActive": 7,
    }


def test_every_metric_an_hpa_cannot_read_is_named_when_its_message_names_none():
    both = [
        {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}},
        {"type": "Resource", "resource": {"name": "memory", "target": {"type": "Utilization"}}},
    ]
    vague = ("ScalingActive", "False", "FailedGetResourceMetric", "no metrics returned from resource metrics API")
    verdict = verdict_of({"encoder": TierInput(settled_deployment(1), hpa(vague, metrics=both))})
    assert verdict.message == (
        "encoder autoscaling inactive: the HPA cannot read cpu, memory from the resource (metrics-server) metrics "
        f"API; the HPA holds the tier at 1 replica until it reads its metrics again; FailedGetResourceMetric: {vague[3]}"
    )


def test_every_hpa_not_reported_yet_is_named():
    status = derive(hpa(ABLE), decode=TierInput(settled_deployment(1), hpa()))
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.message) == (
        "Unknown",
        "waiting for the first replica count of the HPA of encoder, decode",
    )


# The HPA's words when the encoder demand's way is cut at each point, as kube-controller-manager quotes the
# custom metrics API's answer (replica_calculator.go, metrics/client.go) and the answer's own words: client-go's
# for a 503 of kube-aggregator (the APIService's server down) and k8s.io/metrics' once discovery marks its version
# stale, prometheus-adapter's when its query to Prometheus fails, custom-metrics-apiserver's when Prometheus has
# no series of it.
DEMAND = "epd_router_encoder_demand"
OBJECT_FAILED = (
    f"the HPA was unable to compute the replica count: unable to get metric {DEMAND} on EPDDeployment "
    "epd-local/tiny-vl: unable to fetch metrics from custom metrics API: "
)
CUT = {
    "the server is currently unable to handle the request (get epddeployments.serving.epd.dev tiny-vl)": (
        "its APIService's server, the adapter, does not answer"
    ),
    "no known available metric versions found": "its APIService's server, the adapter, does not answer",
    "Internal error occurred: unable to fetch metrics": (
        "the adapter answers but cannot query its source (Prometheus, for prometheus-adapter)"
    ),
    f"the server could not find the metric {DEMAND} for epddeployments.serving.epd.dev tiny-vl": (
        "the adapter finds no series of it (not scraped, or not with the labels the adapter's rules expect)"
    ),
}
DEMAND_METRIC = [
    {
        "type": "Object",
        "object": {
            "describedObject": {"apiVersion": "serving.epd.dev/v1alpha1", "kind": "EPDDeployment", "name": "tiny-vl"},
            "metric": {"name": DEMAND},
            "target": {"type": "AverageValue", "averageValue": "4"},
        },
    }
]


@pytest.mark.parametrize("answer", CUT)
def test_a_lost_metric_source_is_named_and_the_tier_held_at_its_replicas(answer: str):
    lost = ("ScalingActive", "False", "FailedGetObjectMetric", OBJECT_FAILED + answer)
    status = derive(hpa(ABLE, lost, metrics=DEMAND_METRIC, current=2, desired=2))
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("False", "FailedGetObjectMetric")
    assert scaling.message == (
        f"encoder autoscaling inactive: the HPA cannot read {DEMAND} from the custom metrics API: {CUT[answer]}; "
        "the HPA holds the tier at 2 replicas until it reads its metrics again; FailedGetObjectMetric, in the HPA's "
        "words in status.tiers.encoder.autoscaling.conditions"
    )
    assert cond(status, "Degraded").reason == "AutoscalingInactive"
    # the HPA's own words are in the tier's conditions
    assert status.tiers.encoder.autoscaling.conditions[1].message == lost[3]


def test_the_same_cause_in_other_words_of_the_hpa_is_the_same_message_and_no_new_event():
    """A down adapter: the aggregator's 503, then the HPA's client finding its version stale, then the 503
    again (seen on the real node): one message, one Warning, while the HPA's words move."""
    said = [
        OBJECT_FAILED + "the server is currently unable to handle the request (get epddeployments.serving.epd.dev vl)",
        OBJECT_FAILED + "no known available metric versions found",
        OBJECT_FAILED + "the server is currently unable to handle the request (get epddeployments.serving.epd.dev vl)",
    ]
    active = derive(hpa(ABLE, ACTIVE, metrics=DEMAND_METRIC, current=2, desired=2))
    before, events = active, []
    for i, words in enumerate(said):
        now = derive(
            hpa(ABLE, ("ScalingActive", "False", "FailedGetObjectMetric", words), metrics=DEMAND_METRIC, current=2),
            previous=before,
            now=[T1, T2, T2][i],
        )
        events += transitions(before, now)
        before = now
    assert [(e.type, e.reason) for e in events] == [("Warning", "AutoscalingInactive")]
    # words it does not know stay in the message: they may be all a person has
    unknown = ("ScalingActive", "False", "FailedGetObjectMetric", OBJECT_FAILED + "an answer never seen")
    assert cond(derive(hpa(ABLE, unknown, metrics=DEMAND_METRIC)), "AutoscalingActive").message.endswith(unknown[3])


def test_a_metric_source_lost_then_back_posts_one_warning_and_one_normal_event():
    active = derive(hpa(ABLE, ACTIVE, metrics=DEMAND_METRIC, current=2, desired=2))
    lost = (
        "ScalingActive",
        "False",
        "FailedGetObjectMetric",
        OBJECT_FAILED + "Internal error occurred: unable to fetch metrics",
    )
    down = derive(hpa(ABLE, lost, metrics=DEMAND_METRIC, current=2), previous=active, now=T1)
    (warning,) = transitions(active, down)
    assert (warning.type, warning.reason) == ("Warning", "AutoscalingInactive")
    assert "cannot query its source (Prometheus" in warning.message
    # the same words on every HPA sync while it lasts: no second Event
    assert transitions(down, derive(hpa(ABLE, lost, metrics=DEMAND_METRIC, current=2), previous=down, now=T2)) == []
    back = derive(hpa(ABLE, ACTIVE, metrics=DEMAND_METRIC, current=2, desired=2), previous=down, now=T2)
    assert [(e.type, e.reason) for e in transitions(down, back)] == [
        ("Normal", "AutoscalingActive"),
        ("Normal", "Ready"),
    ]


def test_words_it_does_not_know_name_nothing_missing():
    assert missing("unable to fetch metrics from custom metrics API: an answer never seen") is None
    assert missing("no custom metrics API (custom.metrics.k8s.io) registered") == "no APIService serves it"


def wordless(obj: dict) -> dict:
    """The object with its conditions' empty reasons and messages left out, as a controller may write them."""
    for c in obj["status"]["conditions"]:
        for key in ("reason", "message"):
            if not c[key]:
                del c[key]
    return obj


def test_an_inactive_hpa_without_words_is_quoted_without_empty_ones():
    assert hpa_inactive("encoder", wordless(hpa(ABLE, ("ScalingActive", "False", "FailedGetScale", "")))) == (
        "FailedGetScale",
        "encoder autoscaling inactive; FailedGetScale",
    )
    assert hpa_inactive("encoder", wordless(hpa(ABLE, ("ScalingActive", "False", "", "")))) == (
        "AutoscalingInactive",
        "encoder autoscaling inactive",
    )
    assert hpa_inactive("encoder", wordless(hpa(ABLE, ("ScalingActive", "False", "", "the HPA is off")))) == (
        "AutoscalingInactive",
        "encoder autoscaling inactive: the HPA is off",
    )
