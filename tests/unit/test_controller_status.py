"""controller/status beyond the phase table of test_operator_status.py: every number and condition field
a status pass writes, read from hand-written Deployments, HPAs, pods and previous statuses."""

from __future__ import annotations

import json

from epd_operator.api.status import Condition, EPDDeploymentStatus, GenerationStatus
from epd_operator.api.validation import FieldError
from epd_operator.controller.status import (
    TierInput,
    derive_status,
    generations,
    last_described,
    observed_by_status_pass,
    parse_status,
    standing_refusal,
    status_document,
    tier_state,
    transitions,
    unschedulable_reason,
)

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def deployment(spec_replicas=2, generation=3, **status) -> dict:
    return {"metadata": {"generation": generation}, "spec": {"replicas": spec_replicas}, "status": status}


def settled(n=2, ready=None, **extra) -> dict:
    ready = n if ready is None else ready
    return deployment(
        n, observedGeneration=3, replicas=n, updatedReplicas=n, readyReplicas=ready, availableReplicas=ready, **extra
    )


def derive(tiers, previous=None, errors=None, refused=None, now=T0, generation=4):
    return derive_status(
        tiers=tiers,
        topology="E/P/D",
        endpoint="http://vl.ns.svc:8000",
        observed_generation=generation,
        spec_errors=errors,
        previous=previous,
        now=now,
        refused=refused,
    )


def cond(st, type_) -> Condition:
    return next(c for c in st.conditions if c.type == type_)


def test_tier_state_copies_every_count_and_the_ready_column():
    state = tier_state(
        TierInput(
            deployment(3, observedGeneration=3, replicas=4, updatedReplicas=3, readyReplicas=2, availableReplicas=1)
        )
    )
    assert state.status.model_dump(exclude_none=True) == {
        "replicas": 4,
        "readyReplicas": 2,
        "updatedReplicas": 3,
        "availableReplicas": 1,
        "ready": "2/3",
    }
    assert (state.settled, state.ready, state.stuck) == (False, False, False)  # an old pod is left


def test_a_deployment_without_status_or_replicas_counts_as_zero_of_one():
    state = tier_state(TierInput({"metadata": {}, "spec": {}}))
    assert state.status.model_dump(exclude_none=True) == {
        "replicas": 0,
        "readyReplicas": 0,
        "updatedReplicas": 0,
        "availableReplicas": 0,
        "ready": "0/1",
    }
    assert (state.settled, state.ready) == (False, False)
    zero = tier_state(TierInput({"metadata": {}, "spec": {"replicas": 0}, "status": {}}))
    assert (zero.settled, zero.ready, zero.status.ready) == (True, True, "0/0")


def test_settled_needs_the_latest_generation_seen_all_updated_and_no_old_pod():
    assert tier_state(TierInput(settled(2))).settled is True
    assert tier_state(TierInput(deployment(2, observedGeneration=2, replicas=2, updatedReplicas=2))).settled is False
    assert tier_state(TierInput(deployment(2, observedGeneration=4, replicas=2, updatedReplicas=2))).settled is True
    no_generation = {"metadata": {}, "spec": {"replicas": 2}, "status": {"replicas": 2, "updatedReplicas": 2}}
    assert tier_state(TierInput(no_generation)).settled is True
    assert tier_state(TierInput(deployment(2, observedGeneration=3, replicas=2, updatedReplicas=1))).settled is False
    assert tier_state(TierInput(deployment(2, observedGeneration=3, replicas=3, updatedReplicas=2))).settled is False
    assert tier_state(TierInput(deployment(2, replicas=2, updatedReplicas=2))).settled is False  # never observed


def test_ready_needs_enough_ready_and_available_pods_and_a_settled_rollout():
    assert tier_state(TierInput(settled(2))).ready is True
    short_available = deployment(
        2, observedGeneration=3, replicas=2, updatedReplicas=2, readyReplicas=2, availableReplicas=1
    )
    assert tier_state(TierInput(short_available)).ready is False
    short_ready = deployment(
        2, observedGeneration=3, replicas=2, updatedReplicas=2, readyReplicas=1, availableReplicas=2
    )
    assert tier_state(TierInput(short_ready)).ready is False
    extra = deployment(2, observedGeneration=3, replicas=2, updatedReplicas=3, readyReplicas=3, availableReplicas=3)
    assert tier_state(TierInput(extra)).ready is True
    rolling = deployment(2, observedGeneration=2, replicas=2, updatedReplicas=2, readyReplicas=2, availableReplicas=2)
    assert tier_state(TierInput(rolling)).ready is False


def test_stuck_only_on_the_progress_deadline():
    def with_progressing(reason):
        return settled(
            2,
            conditions=[
                {"type": "Available", "reason": "ProgressDeadlineExceeded"},
                {"type": "Progressing", "reason": reason},
            ],
        )

    assert tier_state(TierInput(with_progressing("ProgressDeadlineExceeded"))).stuck is True
    assert tier_state(TierInput(with_progressing("NewReplicaSetAvailable"))).stuck is False
    assert tier_state(TierInput(settled(2, conditions=None))).stuck is False


def test_a_tier_not_created_yet_shows_its_planned_replicas_hpa_and_reason():
    hpa = {"spec": {"maxReplicas": 5}}
    state = tier_state(TierInput(None, hpa, planned_replicas=4, unschedulable="no GPU"))
    assert state.status.model_dump(exclude_none=True) == {
        "replicas": 0,
        "readyReplicas": 0,
        "updatedReplicas": 0,
        "availableReplicas": 0,
        "ready": "0/4",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 5},
        "message": "no GPU",
    }
    assert (state.settled, state.ready, state.stuck) == (False, False, False)


def test_an_hpa_without_spec_or_status():
    state = tier_state(TierInput(settled(1), {"spec": None, "status": None}))
    assert state.status.autoscaling.model_dump() == {
        "minReplicas": 1,
        "maxReplicas": None,
        "desiredReplicas": None,
        "currentReplicas": None,
    }
    assert tier_state(TierInput(settled(1))).status.autoscaling is None


def test_a_ready_deployment_carries_every_condition_field():
    st = derive(
        {
            "encoder": TierInput(settled(1)),
            "prefill": TierInput(settled(1)),
            "decode": TierInput(settled(2)),
            "router": TierInput(settled(2)),
        }
    )
    assert status_document(st) == {
        "observedGeneration": 4,
        "phase": "Ready",
        "topology": "E/P/D",
        "endpoint": "http://vl.ns.svc:8000",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "AllTiersReady",
                "message": "every tier has its pods ready",
                "lastTransitionTime": T0,
                "observedGeneration": 4,
            },
            {
                "type": "Progressing",
                "status": "False",
                "reason": "RolloutComplete",
                "message": "every tier runs its latest template",
                "lastTransitionTime": T0,
                "observedGeneration": 4,
            },
            {
                "type": "Degraded",
                "status": "False",
                "reason": "AsExpected",
                "message": "",
                "lastTransitionTime": T0,
                "observedGeneration": 4,
            },
            {
                "type": "SpecValid",
                "status": "True",
                "reason": "Valid",
                "message": "the spec was accepted and applied",
                "lastTransitionTime": T0,
                "observedGeneration": 4,
            },
        ],
        "tiers": {
            name: {"replicas": n, "readyReplicas": n, "updatedReplicas": n, "availableReplicas": n, "ready": f"{n}/{n}"}
            for name, n in (("encoder", 1), ("prefill", 1), ("decode", 2), ("router", 2))
        },
    }


def test_pending_until_any_deployment_exists_even_if_only_one_tier_is_listed():
    st = derive({"encoder": TierInput(None), "decode": TierInput(None)})
    assert st.phase == "Pending"
    assert (cond(st, "Progressing").status, cond(st, "Progressing").message) == (
        "True",
        "rolling out: encoder 0/1, decode 0/1",
    )
    assert derive({"encoder": TierInput(None), "decode": TierInput(settled(2))}).phase == "Progressing"
    empty = derive({})
    assert empty.phase == "Pending" and cond(empty, "Ready").status == "False"


def test_a_stuck_rollout_names_the_stuck_tiers_and_wins_over_lost_pods():
    stuck = deployment(
        2,
        observedGeneration=3,
        replicas=3,
        updatedReplicas=1,
        readyReplicas=2,
        availableReplicas=2,
        conditions=[{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}],
    )
    ready = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2))})
    st = derive({"encoder": TierInput(settled(1, ready=0)), "decode": TierInput(stuck)}, previous=ready, now=T1)
    assert st.phase == "Degraded"
    degraded = cond(st, "Degraded")
    assert (degraded.status, degraded.reason, degraded.message, degraded.lastTransitionTime) == (
        "True",
        "ProgressDeadlineExceeded",
        "rollout stuck: decode 2/2",
        T1,
    )
    assert (cond(st, "Ready").reason, cond(st, "Ready").message) == (
        "TiersNotReady",
        "not ready: encoder 0/1, decode 2/2",
    )


def test_lost_pods_need_a_previous_ready_or_degraded_status_that_had_the_tier():
    now_short = {"encoder": TierInput(settled(1)), "decode": TierInput(settled(2, ready=1))}
    ready = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2))})
    assert derive(now_short, previous=ready).phase == "Degraded"
    progressing = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2, ready=0))})
    assert progressing.phase == "Progressing"
    assert derive(now_short, previous=progressing).phase == "Progressing"  # it never had them
    without_decode = derive({"encoder": TierInput(settled(1))})
    assert without_decode.phase == "Ready"
    assert derive(now_short, previous=without_decode).phase == "Progressing"  # a new tier loading
    same_count = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(3, ready=2))}, previous=ready)
    assert same_count.phase == "Progressing"  # a scale-up keeps its ready pods


def test_degraded_stays_for_the_tier_it_named_only():
    ready = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2))})
    lost = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2, ready=1))}, previous=ready)
    assert cond(lost, "Degraded").message == "pods lost: decode 1/2"
    # decode still one short without a further drop: still lost; encoder loading is not a loss
    still = derive({"encoder": TierInput(settled(2, ready=1)), "decode": TierInput(settled(3, ready=1))}, previous=lost)
    assert (still.phase, cond(still, "Degraded").message) == ("Degraded", "pods lost: decode 1/3")
    # a Degraded status whose Degraded condition is False does not carry a loss forward
    cleared = lost.model_copy(
        update={
            "conditions": [
                c if c.type != "Degraded" else c.model_copy(update={"status": "False"}) for c in lost.conditions
            ]
        }
    )
    assert (
        derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(3, ready=1))}, previous=cleared).phase
        == "Progressing"
    )


def test_spec_errors_win_over_a_refusal_and_every_error_is_listed():
    errors = [FieldError("spec.a", "bad"), FieldError("spec.b", "worse")]
    st = derive({"decode": TierInput(settled(2))}, errors=errors, refused=["Deployment x: no"])
    assert st.phase == "Failed"
    spec = cond(st, "SpecValid")
    assert (spec.status, spec.reason, spec.message, spec.observedGeneration) == (
        "False",
        "InvalidSpec",
        "spec.a: bad; spec.b: worse",
        4,
    )
    refused = derive({"decode": TierInput(settled(2))}, refused=["Deployment x: no", "Service y: no"])
    assert cond(refused, "SpecValid").message == "Deployment x: no; Service y: no"


def test_transition_time_is_kept_while_the_status_value_is_unchanged():
    first = derive({"decode": TierInput(settled(2, ready=1))}, now=T0)
    later = derive({"decode": TierInput(settled(2, ready=0))}, previous=first, now=T1)
    assert [(c.type, c.lastTransitionTime) for c in later.conditions] == [
        ("Ready", T0),
        ("Progressing", T0),
        ("Degraded", T0),
        ("SpecValid", T0),
    ]
    assert cond(later, "Ready").message == "not ready: decode 0/2"


def test_parse_status():
    assert parse_status(None) is None and parse_status({}) is None
    assert parse_status({"phase": "Nonsense"}) is None
    st = parse_status({"phase": "Ready", "observedGeneration": 2})
    assert (st.phase, st.observedGeneration) == ("Ready", 2)


def refusal_status(generation, reason="RefusedByAPIServer", message="Deployment x: no") -> EPDDeploymentStatus:
    return EPDDeploymentStatus(
        phase="Failed",
        conditions=[
            Condition(type="Ready", status="False", reason="TiersNotReady", observedGeneration=generation),
            Condition(type="SpecValid", status="False", reason=reason, message=message, observedGeneration=generation),
        ],
    )


def test_standing_refusal_only_for_the_same_generation_and_reason():
    assert standing_refusal(None, 3) == []
    assert standing_refusal(refusal_status(3), 3) == ["Deployment x: no"]
    assert standing_refusal(refusal_status(2), 3) == []
    assert standing_refusal(refusal_status(3, reason="InvalidSpec"), 3) == []
    assert standing_refusal(EPDDeploymentStatus(phase="Ready"), 3) == []


def test_a_status_pass_observes_the_generation_the_last_full_pass_acted_on():
    assert observed_by_status_pass(None) is None
    assert observed_by_status_pass(EPDDeploymentStatus(phase="Ready", observedGeneration=3)) == 3


def test_a_refused_spec_keeps_the_topology_and_endpoint_of_the_last_status():
    assert last_described(None) == (None, None)
    previous = EPDDeploymentStatus(phase="Ready", topology="E/P/D", endpoint="http://x.ns.svc")
    assert last_described(previous) == ("E/P/D", "http://x.ns.svc")


def pod(name, status="False", reason="Unschedulable", message="0/3 nodes are available") -> dict:
    return {
        "metadata": {"name": name},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "PodScheduled", "status": status, "reason": reason, "message": message},
            ]
        },
    }


def test_unschedulable_reason_is_the_first_pod_by_name_the_scheduler_refused():
    assert unschedulable_reason([]) is None
    assert unschedulable_reason([pod("a", status="True", reason="")]) is None
    assert unschedulable_reason([pod("a", reason="SchedulerError")]) is None
    assert unschedulable_reason([pod("b", message="second"), pod("a", message="first")]) == "first"
    assert unschedulable_reason([pod("a", message="")]) == "Unschedulable"
    assert unschedulable_reason([{"metadata": {"name": "new"}, "status": {}}, pod("z", message="m")]) == "m"


def test_events_for_each_phase_change():
    pending = derive({"decode": TierInput(None)})
    loading = derive({"decode": TierInput(settled(2, ready=0))}, previous=pending)
    assert [(t.type, t.reason, t.message) for t in transitions(pending, loading)] == [
        ("Normal", "Progressing", "not ready: decode 0/2")
    ]
    ready = derive({"decode": TierInput(settled(2))}, previous=loading)
    assert [(t.type, t.reason, t.message) for t in transitions(loading, ready)] == [
        ("Normal", "Ready", "every tier has its pods ready")
    ]
    rolling = derive(
        {"decode": TierInput(deployment(2, observedGeneration=2, replicas=2, updatedReplicas=2))}, previous=ready
    )
    assert [(t.type, t.reason, t.message) for t in transitions(ready, rolling)] == [
        ("Normal", "Progressing", "rolling out: decode 0/2")
    ]
    lost = derive({"decode": TierInput(settled(2, ready=1))}, previous=ready)
    assert [(t.type, t.reason, t.message) for t in transitions(ready, lost)] == [
        ("Warning", "Degraded", "pods lost: decode 1/2")
    ]
    # the first status ever written is Progressing: no event for leaving a phase nobody saw
    assert transitions(None, loading) == []
    failed = derive({"decode": TierInput(settled(2))}, previous=ready, refused=["Service y: no"])
    assert [(t.type, t.reason) for t in transitions(ready, failed)] == [("Warning", "RefusedByAPIServer")]
    other = derive({"decode": TierInput(settled(2))}, previous=failed, refused=["Service y: still no"])
    assert [t.message for t in transitions(failed, other)] == ["spec refused, nothing was changed: Service y: still no"]


def test_unschedulable_event_again_only_when_the_reason_changes():
    first = derive({"decode": TierInput(settled(2, ready=0), unschedulable="no GPU")})
    again = derive({"decode": TierInput(settled(2, ready=0), unschedulable="no memory")}, previous=first)
    assert [(t.type, t.reason, t.message) for t in transitions(first, again)] == [
        ("Warning", "Unschedulable", "not ready: decode 0/2; decode pods cannot be scheduled: no memory")
    ]
    # a ready tier's stale reason is not reported
    fine = derive({"decode": TierInput(settled(2), unschedulable="no GPU")})
    assert cond(fine, "Ready").reason == "AllTiersReady"


def test_a_leader_worker_set_counts_ready_groups_as_available():
    lws = {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": 1},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2},
    }
    state = tier_state(TierInput(lws))
    assert (state.status.availableReplicas, state.ready) == (2, True)
    # a Deployment without availableReplicas has none available, whatever is ready
    dep_ = {**lws, "kind": "Deployment"}
    assert (tier_state(TierInput(dep_)).status.availableReplicas, tier_state(TierInput(dep_)).ready) == (0, False)


def test_an_object_without_metadata_or_spec_and_a_status_not_yet_observed():
    bare = tier_state(
        TierInput({"status": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1}})
    )
    assert (bare.status.ready, bare.settled, bare.ready) == ("1/1", True, True)
    unobserved = {
        "metadata": {"generation": 1},
        "spec": {"replicas": 1},
        "status": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1},
    }
    assert tier_state(TierInput(unobserved)).settled is False


def test_reasons_of_a_rollout_in_progress():
    st = derive({"decode": TierInput(deployment(2, observedGeneration=2, replicas=2, updatedReplicas=2))})
    progressing = cond(st, "Progressing")
    assert (progressing.status, progressing.reason, progressing.message) == (
        "True",
        "RollingOut",
        "rolling out: decode 0/2",
    )


def test_several_unplaced_tiers_are_each_named():
    st = derive(
        {
            "prefill": TierInput(settled(1, ready=0), unschedulable="no GPU"),
            "decode": TierInput(settled(1, ready=0), unschedulable="no memory"),
        }
    )
    assert cond(st, "Ready").message == (
        "not ready: prefill 0/1, decode 0/1; prefill pods cannot be scheduled: no GPU; "
        "decode pods cannot be scheduled: no memory"
    )


def test_generations_are_reported_only_when_there_are_some():
    gens = [GenerationStatus(name="g2", current=True, pods={"decode": 2}, readyPods={"decode": 1})]
    st = derive_status(
        tiers={"decode": TierInput(settled(2))},
        topology="E+PD",
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=None,
        now=T0,
        generations=gens,
    )
    assert status_document(st)["generations"] == [
        {"name": "g2", "current": True, "pods": {"decode": 2}, "readyPods": {"decode": 1}}
    ]
    empty = derive_status(
        tiers={"decode": TierInput(settled(2))},
        topology="E+PD",
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=None,
        now=T0,
        generations=[],
    )
    assert "generations" not in status_document(empty)


def test_the_status_document_is_json():
    doc = status_document(derive({"decode": TierInput(settled(2))}))
    assert json.loads(json.dumps(doc)) == doc
    assert isinstance(doc["conditions"][0], dict) and isinstance(doc["tiers"]["decode"], dict)


def test_a_refused_spec_stamps_its_condition_with_the_generation_and_time():
    for kwargs in ({"errors": [FieldError("spec.a", "bad")]}, {"refused": ["Service y: no"]}):
        spec = cond(derive({"decode": TierInput(settled(2))}, now=T1, **kwargs), "SpecValid")
        assert (spec.status, spec.observedGeneration, spec.lastTransitionTime) == ("False", 4, T1)


def _pod(role, generation, ready=True, leaving=False) -> dict:
    meta = {
        "name": f"{role}-{generation}",
        "labels": {"serving.epd.dev/role": role, "serving.epd.dev/compat-generation": generation},
    }
    if leaving:
        meta["deletionTimestamp"] = T0
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_generations_skip_pods_that_leave_and_count_every_ready_pod_after_them():
    pods = [
        _pod("decode", "g1", leaving=True),
        _pod("decode", "g1"),
        _pod("decode", "g1"),
        _pod("router", "g1"),
        _pod("encoder", "g1", ready=False),
    ]
    assert [g.model_dump() for g in generations(pods, current="g1")] == [
        {"name": "g1", "current": True, "pods": {"decode": 2, "encoder": 1}, "readyPods": {"decode": 2}}
    ]
