"""controller/status: what the EPDDeployment says about a tier KEDA scales, from ScaledObjects shaped as
KEDA v2.21's controller writes them (apis/keda/v1alpha1/condition_types.go and pkg/scaling/executor:
condition types Ready, Active, Fallback, Paused, their reasons and words), and an encoder tier at zero."""

from __future__ import annotations

from typing import Any

from epd_operator.controller.status import SCALED_TO_ZERO, TierInput, derive_status, tier_state, transitions
from tests.support.workloads import settled_deployment
from tests.unit.controller.test_status_autoscaling import wordless

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"

READY = ("Ready", "True", "ScaledObjectReady", "ScaledObject is defined correctly and is ready for scaling")
ACTIVE = ("Active", "True", "ScalerActive", "Scaling is performed because triggers are active")
IDLE = ("Active", "False", "ScalerNotActive", "Scaling is not performed because triggers are not active")
NO_FALLBACK = ("Fallback", "False", "NoFallbackFound", "No fallbacks are active on this scaled object")
NOT_PAUSED = ("Paused", "False", "ScaledObjectUnpaused", "pause annotation removed for ScaledObject")
TRIGGER_ERROR = (
    "Ready",
    "False",
    "TriggerError",
    'error inside prometheus trigger: Get "http://prometheus:9090/api/v1/query": dial tcp: lookup prometheus: '
    "no such host",
)
FALLING_BACK = ("Fallback", "True", "FallbackExists", "At least one trigger is falling back on this scaled object")
PAUSED = ("Paused", "True", "ScaledObjectPaused", "ScaledObject is paused")


def scaled_object(*conditions: tuple[str, str, str, str], min_replicas: int = 0) -> dict:
    return {
        "spec": {"minReplicaCount": min_replicas, "maxReplicaCount": 4},
        "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]},
    }


def derive(encoder: TierInput, previous=None, now=T0):
    return derive_status(
        tiers={"encoder": encoder, "decode": TierInput(settled_deployment(1))},
        topology="E+PD",
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=previous,
        now=now,
    )


def cond(status, type_):
    return next((c for c in status.conditions if c.type == type_), None)


def at_zero(so: dict) -> TierInput:
    return TierInput(settled_deployment(0), scaled_object=so)


def test_an_encoder_tier_at_zero_is_scaled_to_zero_and_the_deployment_stays_ready():
    so = scaled_object(READY, IDLE, NO_FALLBACK, NOT_PAUSED)
    status = derive(at_zero(so))
    assert status.phase == "Ready"
    encoder = status.tiers.encoder
    assert encoder is not None
    assert (encoder.ready, encoder.reason) == ("0/0", SCALED_TO_ZERO)
    assert encoder.message == "scaled to zero by its autoscaler until its load activates it"
    assert cond(status, "Ready").message == "every tier has its pods ready (encoder scaled to zero)"
    assert cond(status, "Degraded").status == "False"
    # the ScaledObject's own verdict, as KEDA wrote it
    autoscaling = encoder.autoscaling
    assert autoscaling is not None
    assert (autoscaling.engine, autoscaling.minReplicas, autoscaling.maxReplicas) == ("KEDA", 0, 4)
    assert [(c.type, c.status, c.reason) for c in autoscaling.conditions or []] == [
        ("Ready", "True", "ScaledObjectReady"),
        ("Active", "False", "ScalerNotActive"),
        ("Fallback", "False", "NoFallbackFound"),
        ("Paused", "False", "ScaledObjectUnpaused"),
    ]
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("True", "ScalingActive")
    # one Normal Event when the tier goes to zero, no Warning
    before = derive(TierInput(settled_deployment(1), scaled_object=scaled_object(READY, ACTIVE)))
    events = transitions(before, status)
    assert [(e.type, e.reason) for e in events] == [("Normal", SCALED_TO_ZERO)]
    assert events[0].message == "encoder scaled to zero by its autoscaler until its load activates it"


def test_a_tier_at_zero_without_an_autoscaler_is_not_called_scaled_to_zero():
    state = tier_state(TierInput(settled_deployment(0)))
    assert state.ready and state.status.reason is None


def test_an_activated_tier_loading_its_first_pod_is_progressing_not_degraded():
    starting = TierInput(settled_deployment(1, ready=0), scaled_object=scaled_object(READY, ACTIVE))
    previous = derive(at_zero(scaled_object(READY, IDLE)))
    status = derive(starting, previous=previous, now=T1)
    assert status.phase == "Progressing"
    assert status.tiers.encoder is not None and status.tiers.encoder.reason is None


def test_keda_unable_to_query_its_trigger_degrades_the_deployment_with_kedas_words():
    status = derive(TierInput(settled_deployment(1), scaled_object=scaled_object(TRIGGER_ERROR, IDLE)))
    assert status.phase == "Degraded"
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("False", "TriggerError")
    assert scaling.message == (
        "encoder autoscaling inactive: KEDA cannot scale it (ScaledObject TriggerError: " + TRIGGER_ERROR[3] + ")"
    )
    assert cond(status, "Degraded").reason == "AutoscalingInactive"
    assert [(e.type, e.reason) for e in transitions(None, status)] == [("Warning", "AutoscalingInactive")]


def test_keda_holding_its_fallback_replicas_is_degraded():
    status = derive(TierInput(settled_deployment(2), scaled_object=scaled_object(READY, ACTIVE, FALLING_BACK)))
    assert status.phase == "Degraded"
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("False", "FallbackExists")
    assert scaling.message == (
        "encoder autoscaling inactive: KEDA holds its fallback replicas (ScaledObject FallbackExists: "
        + FALLING_BACK[3]
        + ")"
    )


def test_a_paused_scaled_object_is_reported_but_does_not_degrade():
    status = derive(TierInput(settled_deployment(1), scaled_object=scaled_object(READY, PAUSED)))
    assert status.phase == "Ready"
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("False", "ScaledObjectPaused")
    assert scaling.message == "encoder autoscaling paused: its ScaledObject is paused (ScaledObject is paused)"


def test_a_scaled_object_keda_has_not_taken_up_yet_is_pending():
    status = derive(TierInput(settled_deployment(1), scaled_object=scaled_object()))
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason) == ("Unknown", "ScaledObjectPending")
    assert scaling.message == "waiting for KEDA to take up the ScaledObject of encoder"
    assert status.phase == "Ready"


def test_a_keda_scaled_tier_reports_on_its_scaled_object_and_plans_one_pod_before_it_exists():
    from epd_operator.controller.reconciler import tier_inputs
    from epd_operator.render import render
    from tests.support.render_examples import variants

    objects = render(variants()["keda-encoder-scale-to-zero"])
    so = {
        **next(o for o in objects if o["kind"] == "ScaledObject"),
        **scaled_object(READY, IDLE),
    }
    keda_hpa: dict[str, Any] = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "keda-hpa-qwen-vl-encoder", "namespace": "default"},
    }
    tiers = tier_inputs(objects, [so, keda_hpa])
    assert tiers["encoder"].scaled_object is so
    assert tiers["encoder"].hpa is None  # KEDA's own HPA is KEDA's: not reported as ours
    # the Deployment does not exist yet: it is created without replicas, so it starts with one pod
    assert tiers["encoder"].deployment is None and tiers["encoder"].planned_replicas == 1


def test_a_scaled_object_shows_its_own_replica_bounds_and_kedas_defaults_without_them():
    kept_warm = tier_state(TierInput(settled_deployment(1), scaled_object=scaled_object(READY, min_replicas=1)))
    autoscaling = kept_warm.status.autoscaling
    assert autoscaling is not None and (autoscaling.minReplicas, autoscaling.maxReplicas) == (1, 4)
    so = scaled_object(READY, ACTIVE)
    del so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]
    autoscaling = tier_state(TierInput(settled_deployment(1), scaled_object=so)).status.autoscaling
    assert autoscaling is not None
    # KEDA scales between 0 and 100 replicas unless told otherwise
    assert (autoscaling.engine, autoscaling.minReplicas, autoscaling.maxReplicas) == ("KEDA", 0, 100)


def test_a_paused_scaled_object_gives_kedas_reason_and_a_default_when_it_gives_none():
    unsaid = ("Paused", "True", "", "ScaledObject is paused")
    status = derive(TierInput(settled_deployment(1), scaled_object=scaled_object(READY, unsaid)))
    assert cond(status, "AutoscalingActive").reason == "ScaledObjectPaused"
    own = ("Paused", "True", "PausedByOperator", "paused for maintenance")
    status = derive(TierInput(settled_deployment(1), scaled_object=scaled_object(READY, own)))
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.reason, scaling.message) == (
        "PausedByOperator",
        "encoder autoscaling paused: its ScaledObject is paused (paused for maintenance)",
    )


def two_tiers(encoder: dict, prefill: dict):
    return derive_status(
        tiers={
            "encoder": TierInput(settled_deployment(0), scaled_object=encoder),
            "prefill": TierInput(settled_deployment(0), scaled_object=prefill),
            "decode": TierInput(settled_deployment(1)),
        },
        topology="E/P/D",
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=None,
        now=T0,
    )


def test_every_tier_keda_scaled_to_zero_is_named():
    status = two_tiers(scaled_object(READY, IDLE), scaled_object(READY, IDLE))
    assert status.phase == "Ready"
    assert cond(status, "Ready").message == "every tier has its pods ready (encoder, prefill scaled to zero)"
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.message) == ("True", "every autoscaler computes its replica count from its metrics")


def test_every_paused_and_every_pending_scaled_object_is_named():
    paused = two_tiers(scaled_object(READY, PAUSED), scaled_object(READY, PAUSED))
    assert cond(paused, "AutoscalingActive").message == (
        "encoder autoscaling paused: its ScaledObject is paused (ScaledObject is paused); "
        "prefill autoscaling paused: its ScaledObject is paused (ScaledObject is paused)"
    )
    pending = two_tiers(scaled_object(), scaled_object())
    assert (
        cond(pending, "AutoscalingActive").message == "waiting for KEDA to take up the ScaledObject of encoder, prefill"
    )


# KEDA's HPA when KEDA's metrics server is away, as KEDA 2.21 mirrors it into the ScaledObject's HPAActive
# (pkg/scaling/executor checkHPAHealth: "HPA is not actively scaling: " + the HPA's ScalingActive message, its
# reason as is): kube-controller-manager's words for an External metric around kube-aggregator's 503, seen on the
# local cluster (tests/integration/test_keda_controller.py). The ScaledObject stays Ready meanwhile.
HPA_WORDS = (
    "HPA is not actively scaling: the HPA was unable to compute the replica count: unable to get external metric "
    "epd-local/s0-prometheus/&LabelSelector{MatchLabels:map[string]string{scaledobject.keda.sh/name: "
    "tiny-vl-encoder,},MatchExpressions:[]LabelSelectorRequirement{},}: unable to fetch metrics from external "
    "metrics API: "
)
SERVER_AWAY = (
    "HPAActive",
    "False",
    "FailedGetExternalMetric",
    HPA_WORDS + "the server is currently unable to handle the request (get s0-prometheus.external.metrics.k8s.io)",
)
SERVER_STALE = ("HPAActive", "False", "FailedGetExternalMetric", HPA_WORDS + "no known available metric versions found")
HPA_ACTIVE = ("HPAActive", "True", "HPAActive", "HPA is actively scaling")
HPA_AT_ZERO = (
    "HPAActive",
    "True",
    "ScalingDisabled",
    "scaling is disabled since the replica count of the target is zero",
)
SERVER_AWAY_SAYS = (
    "encoder autoscaling inactive: KEDA's HPA cannot read its metric from the external metrics API: its "
    "APIService's server, KEDA's metrics server, does not answer; the HPA holds the tier at its replicas until it "
    "reads it again; FailedGetExternalMetric, in the HPA's words in status.tiers.encoder.autoscaling.conditions "
    "(HPAActive)"
)


def test_kedas_metrics_server_away_is_named_while_the_scaled_object_stays_ready():
    so = scaled_object(READY, ACTIVE, NO_FALLBACK, NOT_PAUSED, SERVER_AWAY, min_replicas=1)
    status = derive(TierInput(settled_deployment(2), scaled_object=so))
    scaling = cond(status, "AutoscalingActive")
    assert (scaling.status, scaling.reason, scaling.message) == ("False", "FailedGetExternalMetric", SERVER_AWAY_SAYS)
    assert cond(status, "Degraded").reason == "AutoscalingInactive"
    # the HPA's other words for the same cause: the same message, no new Event
    stale = derive(
        TierInput(settled_deployment(2), scaled_object=scaled_object(READY, ACTIVE, SERVER_STALE, min_replicas=1)),
        previous=status,
    )
    assert cond(stale, "AutoscalingActive").message == SERVER_AWAY_SAYS
    assert [e for e in transitions(status, stale) if e.reason.startswith("Autoscaling")] == []
    # back: active again, a Normal Event
    back = derive(
        TierInput(settled_deployment(2), scaled_object=scaled_object(READY, ACTIVE, HPA_ACTIVE, min_replicas=1)),
        previous=stale,
    )
    assert cond(back, "AutoscalingActive").status == "True"
    assert ("Normal", "AutoscalingActive") in [(e.type, e.reason) for e in transitions(stale, back)]


def test_words_of_kedas_hpa_it_does_not_know_are_quoted():
    odd = ("HPAActive", "False", "FailedGetScale", "HPA is not actively scaling: something new")
    status = derive(TierInput(settled_deployment(2), scaled_object=scaled_object(READY, odd, min_replicas=1)))
    assert cond(status, "AutoscalingActive").message == (
        "encoder autoscaling inactive: KEDA's HPA cannot act (ScaledObject HPAActive FailedGetScale: HPA is not "
        "actively scaling: something new)"
    )
    assert status.phase == "Degraded"  # KEDA's HPA cannot scale the tier: not a pause someone chose
    unnamed = ("HPAActive", "False", "", "")
    status = derive(
        TierInput(settled_deployment(2), scaled_object=wordless(scaled_object(READY, unnamed, min_replicas=1)))
    )
    assert (cond(status, "AutoscalingActive").reason, cond(status, "AutoscalingActive").message) == (
        "AutoscalingInactive",
        "encoder autoscaling inactive: KEDA's HPA cannot act (ScaledObject HPAActive AutoscalingInactive)",
    )


def test_keda_conditions_without_messages_are_quoted_without_empty_ones():
    failing = ("Ready", "False", "TriggerError", "")
    status = derive(TierInput(settled_deployment(2), scaled_object=wordless(scaled_object(failing, min_replicas=1))))
    assert cond(status, "AutoscalingActive").message == (
        "encoder autoscaling inactive: KEDA cannot scale it (ScaledObject TriggerError)"
    )
    paused = ("Paused", "True", "ScaledObjectPaused", "")
    status = derive(TierInput(settled_deployment(1), scaled_object=wordless(scaled_object(READY, paused))))
    assert cond(status, "AutoscalingActive").message == "encoder autoscaling paused: its ScaledObject is paused"


def test_kedas_hpa_disabled_at_zero_is_not_a_failure():
    so = scaled_object(READY, IDLE, NO_FALLBACK, NOT_PAUSED, HPA_AT_ZERO)
    status = derive(TierInput(settled_deployment(0), scaled_object=so))
    assert cond(status, "AutoscalingActive").status == "True"
    assert status.tiers.encoder is not None and status.tiers.encoder.reason == SCALED_TO_ZERO


def test_a_failing_trigger_is_named_before_the_hpa():
    so = scaled_object(TRIGGER_ERROR, NO_FALLBACK, NOT_PAUSED, SERVER_AWAY, min_replicas=1)
    assert (
        cond(derive(TierInput(settled_deployment(2), scaled_object=so)), "AutoscalingActive").reason == "TriggerError"
    )
