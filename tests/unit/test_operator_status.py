"""EPDDeployment status rules: phase, conditions and the Events worth posting."""

from __future__ import annotations

from typing import Any

from epd_operator.api.validation import FieldError
from epd_operator.controller.status import TierInput, derive_status, status_document, tier_state, transitions

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def dep(
    desired: int = 2,
    ready: int | None = None,
    *,
    updated: int | None = None,
    replicas: int | None = None,
    generation: int = 1,
    observed: int = 1,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    ready = desired if ready is None else ready
    updated = desired if updated is None else updated
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": desired if replicas is None else replicas,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": conditions or [],
        },
    }


def status(tiers: dict[str, TierInput], previous=None, errors=None, now=T0, generation=1):
    return derive_status(
        tiers=tiers,
        topology="E+PD",
        endpoint="http://vl.ns.svc:8000",
        observed_generation=generation,
        spec_errors=errors,
        previous=previous,
        now=now,
    )


def cond(st, type_):
    return next(c for c in st.conditions if c.type == type_)


def test_nothing_created_yet_is_pending_with_the_planned_counts():
    st = status({"encoder": TierInput(None, planned_replicas=3), "decode": TierInput(None)})
    assert st.phase == "Pending"
    assert st.tiers.encoder.ready == "0/3"


def test_all_tiers_ready_is_ready():
    st = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2)), "router": TierInput(dep(2))})
    assert st.phase == "Ready"
    assert (cond(st, "Ready").status, cond(st, "Progressing").status, cond(st, "Degraded").status) == (
        "True",
        "False",
        "False",
    )
    assert st.tiers.decode.ready == "2/2" and st.tiers.prefill is None


def test_a_rollout_in_flight_is_progressing():
    for rolling in (dep(2, observed=0, generation=1), dep(2, updated=1), dep(2, replicas=3)):
        st = status({"encoder": TierInput(dep(1)), "decode": TierInput(rolling)})
        assert st.phase == "Progressing", rolling
        assert cond(st, "Progressing").message == f"rolling out: decode {st.tiers.decode.ready}"


def test_pods_still_loading_after_creation_are_progressing_not_degraded():
    st = status({"encoder": TierInput(dep(1, ready=0)), "decode": TierInput(dep(2))})
    assert st.phase == "Progressing" and cond(st, "Ready").message == "not ready: encoder 0/1"


def test_losing_pods_after_being_ready_is_degraded():
    ready = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2))})
    st = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2, ready=1))}, previous=ready, now=T1)
    assert st.phase == "Degraded"
    assert (cond(st, "Degraded").reason, cond(st, "Degraded").message) == (
        "ReplicasUnavailable",
        "pods lost: decode 1/2",
    )


def test_a_stuck_rollout_is_degraded():
    stuck = dep(
        2, updated=1, conditions=[{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]
    )
    st = status({"encoder": TierInput(dep(1)), "decode": TierInput(stuck)})
    assert st.phase == "Degraded" and cond(st, "Degraded").reason == "ProgressDeadlineExceeded"


def test_a_refused_spec_fails_with_the_field_path():
    st = status({"decode": TierInput(dep(2))}, errors=[FieldError("spec.kvTransfer", "needs a prefill tier")])
    assert st.phase == "Failed"
    spec_valid = cond(st, "SpecValid")
    assert (spec_valid.status, spec_valid.reason, spec_valid.message) == (
        "False",
        "InvalidSpec",
        "spec.kvTransfer: needs a prefill tier",
    )
    assert cond(st, "Ready").status == "True"  # what runs from the last good spec still serves


def test_transition_times_move_only_when_a_condition_flips():
    first = status({"decode": TierInput(dep(2, ready=0))}, now=T0)
    same = status({"decode": TierInput(dep(2, ready=0))}, previous=first, now=T1)
    assert status_document(same) == status_document(first)  # no change, no write
    flipped = status({"decode": TierInput(dep(2))}, previous=first, now=T1)
    assert cond(flipped, "Ready").lastTransitionTime == T1
    assert cond(flipped, "SpecValid").lastTransitionTime == T0


def test_hpa_numbers_are_reported_per_tier():
    hpa = {"spec": {"minReplicas": 2, "maxReplicas": 8}, "status": {"desiredReplicas": 5, "currentReplicas": 4}}
    state = tier_state(TierInput(dep(4, ready=4), hpa))
    assert state.status.autoscaling.model_dump() == {
        "minReplicas": 2,
        "maxReplicas": 8,
        "desiredReplicas": 5,
        "currentReplicas": 4,
    }
    assert state.status.ready == "4/4"


def test_events_mark_phase_changes_and_new_refusals_only():
    pending = status({"decode": TierInput(None)})
    assert transitions(None, pending) == []
    ready = status({"decode": TierInput(dep(2))}, previous=pending)
    assert [(t.type, t.reason) for t in transitions(pending, ready)] == [("Normal", "Ready")]
    assert transitions(ready, status({"decode": TierInput(dep(2))}, previous=ready)) == []
    refused = status({"decode": TierInput(dep(2))}, previous=ready, errors=[FieldError("spec.x", "bad")])
    assert [(t.type, t.reason, t.message) for t in transitions(ready, refused)] == [
        ("Warning", "InvalidSpec", "spec refused, nothing was changed: spec.x: bad")
    ]
    assert (
        transitions(
            refused, status({"decode": TierInput(dep(2))}, previous=refused, errors=[FieldError("spec.x", "bad")])
        )
        == []
    )
    degraded = status({"decode": TierInput(dep(2, ready=0))}, previous=ready)
    assert [(t.type, t.reason) for t in transitions(ready, degraded)] == [("Warning", "Degraded")]


def test_scaling_up_a_ready_tier_is_progressing_not_degraded():
    ready = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2))})
    assert ready.phase == "Ready"
    # The Deployment controller counts new pods as updated at once: settled, 2 of 4 ready.
    scaling = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(4, ready=2))}, previous=ready, now=T1)
    assert scaling.phase == "Progressing"
    assert cond(scaling, "Degraded").status == "False"
    assert cond(scaling, "Ready").message == "not ready: decode 2/4"
    # ... and stays so while the new pods load, then becomes Ready.
    more = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(4, ready=3))}, previous=scaling, now=T1)
    assert more.phase == "Progressing"
    assert status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(4))}, previous=more).phase == "Ready"


def test_losing_ready_pods_is_degraded_until_they_are_back_even_while_scaling():
    ready = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2))})
    lost = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2, ready=1))}, previous=ready, now=T1)
    assert lost.phase == "Degraded"
    assert (cond(lost, "Degraded").reason, cond(lost, "Degraded").message) == (
        "ReplicasUnavailable",
        "pods lost: decode 1/2",
    )
    # Still one short on the next pass (no further drop): still Degraded, since the same transition time.
    still = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(3, ready=1))}, previous=lost, now=T1)
    assert still.phase == "Degraded" and cond(still, "Degraded").lastTransitionTime == T1
    back = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(3))}, previous=still)
    assert back.phase == "Ready" and cond(back, "Degraded").reason == "AsExpected"


def test_an_unschedulable_tier_names_itself_and_the_schedulers_reason():
    why = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    st = status({"encoder": TierInput(dep(1)), "decode": TierInput(dep(2, ready=0), unschedulable=why)})
    assert st.phase == "Progressing"
    ready = cond(st, "Ready")
    assert (ready.status, ready.reason) == ("False", "Unschedulable")
    assert ready.message == f"not ready: decode 0/2; decode pods cannot be scheduled: {why}"
    assert st.tiers.decode.message == why and st.tiers.encoder.message is None
    [event] = transitions(None, st)
    assert (event.type, event.reason, event.message) == ("Warning", "Unschedulable", ready.message)
    assert (
        transitions(
            st,
            status(
                {"encoder": TierInput(dep(1)), "decode": TierInput(dep(2, ready=0), unschedulable=why)}, previous=st
            ),
        )
        == []
    )  # said once, not on every pass


def test_objects_the_api_server_refuses_fail_the_spec_with_its_words():
    refused = [
        'Deployment vl-decode: Deployment.apps "vl-decode" is invalid: spec.template.spec.nodeSelector: '
        'Invalid value: "bad key": name part must consist of alphanumeric characters'
    ]
    st = derive_status(
        tiers={"decode": TierInput(None)},
        topology="E+PD",
        endpoint=None,
        observed_generation=2,
        spec_errors=None,
        previous=None,
        now=T0,
        refused=refused,
    )
    assert st.phase == "Failed"
    spec_valid = cond(st, "SpecValid")
    assert (spec_valid.status, spec_valid.reason, spec_valid.message) == ("False", "RefusedByAPIServer", refused[0])
    [event] = transitions(None, st)
    assert (event.type, event.reason) == ("Warning", "RefusedByAPIServer")
    assert event.message == f"spec refused, nothing was changed: {refused[0]}"


def lws(desired: int, ready: int, updated: int | None = None) -> dict[str, Any]:
    """A LeaderWorkerSet as its controller reports it: ready groups, no availableReplicas."""
    return {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": 3},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": 3,
            "replicas": desired,
            "readyReplicas": ready,
            "updatedReplicas": desired if updated is None else updated,
        },
    }


def test_a_leader_worker_set_tier_is_ready_when_its_groups_are():
    state = tier_state(TierInput(lws(2, 2)))
    assert (state.ready, state.settled, state.status.ready, state.status.availableReplicas) == (True, True, "2/2", 2)
    state = tier_state(TierInput(lws(2, 1)))
    assert (state.ready, state.status.ready, state.status.availableReplicas) == (False, "1/2", 1)
    assert not tier_state(TierInput(lws(2, 2, updated=1))).settled  # a rolling update under way


def test_a_deployment_without_availability_is_not_available():
    deployment = dep(2)
    del deployment["status"]["availableReplicas"]
    assert tier_state(TierInput(deployment)).status.availableReplicas == 0


def test_a_multi_node_tiers_status_comes_from_its_leader_worker_set():
    from epd_operator.controller.reconciler import tier_inputs
    from epd_operator.render import render
    from tests.support.render_examples import MULTI_NODE, example

    objects = render(example(MULTI_NODE))
    live = {
        **lws(2, 2),
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "metadata": {"name": "qwen-vl-72b-decode", "namespace": "default", "generation": 3},
    }
    tiers = tier_inputs(objects, [live])
    assert set(tiers) == {"encoder", "decode", "router"}
    assert tiers["decode"].deployment is live and tiers["decode"].planned_replicas == 2
    assert tiers["encoder"].deployment is None  # not created yet
