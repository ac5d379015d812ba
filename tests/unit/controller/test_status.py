"""controller/status: the EPDDeployment status rules (phase, conditions and the Events worth posting), every
number and condition field a status pass writes, and capacity per compatibility generation, read from
hand-written Deployments, HPAs, pods and previous statuses."""

from __future__ import annotations

import json
from typing import Any

from epd_operator.api.status import Condition, EPDDeploymentStatus, GenerationStatus
from epd_operator.api.validation import FieldError
from epd_operator.controller.apply import REFUSED_WHEN_WRITTEN
from epd_operator.controller.pods import unschedulable_reason
from epd_operator.controller.rollout import Held
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
)
from tests.support.workloads import settled_deployment

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def deployment(spec_replicas=2, generation=3, **status) -> dict:
    """A Deployment with exactly the given `status` fields (none derived from the spec)."""
    return {**settled_deployment(spec_replicas, generation=generation), "status": status}


settled = settled_deployment


def derive(tiers, previous=None, errors=None, refused=None, now=T0, generation=4, held=None):
    return derive_status(
        tiers=tiers,
        topology="E/P/D",
        endpoint="http://vl.ns.svc:8000",
        observed_generation=generation,
        spec_errors=errors,
        previous=previous,
        now=now,
        refused=refused,
        held=held,
    )


def cond(st, type_) -> Condition:
    return next(c for c in st.conditions if c.type == type_)


def refusal_status(generation, reason="RefusedByAPIServer", message="Deployment x: no") -> EPDDeploymentStatus:
    return EPDDeploymentStatus(
        phase="Failed",
        conditions=[
            Condition(type="Ready", status="False", reason="TiersNotReady", observedGeneration=generation),
            Condition(type="SpecValid", status="False", reason=reason, message=message, observedGeneration=generation),
        ],
    )


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


def _pod(role, generation, ready=True, leaving=False) -> dict:
    meta = {
        "name": f"{role}-{generation}",
        "labels": {"serving.epd.dev/role": role, "serving.epd.dev/compat-generation": generation},
    }
    if leaving:
        meta["deletionTimestamp"] = T0
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


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


def lws(desired: int, ready: int, updated: int | None = None, size: int = 2) -> dict[str, Any]:
    """A LeaderWorkerSet as its controller (sigs.k8s.io/lws v0.9) reports it: ready and updated
    groups, no availableReplicas, and one of its conditions True (Available when every group is
    updated and ready, UpdateInProgress and Progressing during a rolling update, else Progressing)."""
    updated = desired if updated is None else updated
    if updated < desired:
        true = [("UpdateInProgress", "GroupsUpdating", "Rolling Upgrade is in progress")]
        true.append(("Progressing", "GroupsProgressing", "Replicas are progressing"))
    elif ready >= desired:
        true = [("Available", "AllGroupsReady", "All replicas are ready")]
    else:
        true = [("Progressing", "GroupsProgressing", "Replicas are progressing")]
    kinds = {t for t, _, _ in true}
    false = [("Available", "AllGroupsReady", "All replicas are ready")] if "Available" not in kinds else []
    false += [("Progressing", "GroupsProgressing", "Replicas are progressing")] if "Progressing" not in kinds else []
    conditions = [
        {"type": t, "status": status, "reason": r, "message": m, "observedGeneration": 3}
        for status, group in (("True", true), ("False", false))
        for t, r, m in group
    ]
    return {
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "m-decode", "generation": 3},
        "spec": {"replicas": desired, "leaderWorkerTemplate": {"size": size}},
        "status": {
            "observedGeneration": 3,
            "replicas": desired,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "conditions": conditions,
        },
    }


GEN = "serving.epd.dev/compat-generation"


def generation_pod(role: str, generation: str | None, ready: bool = True, leaving: bool = False) -> dict:
    labels = {"serving.epd.dev/role": role, **({GEN: generation} if generation else {})}
    meta: dict = {"name": f"{role}-{generation}", "labels": labels}
    if leaving:
        meta["deletionTimestamp"] = "2026-11-30T21:00:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


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
        "reason": "Unschedulable",
        "message": "no GPU",
    }
    assert (state.settled, state.ready, state.stuck) == (False, False, False)


def test_an_hpa_without_spec_or_status():
    state = tier_state(TierInput(settled(1), {"spec": None, "status": None}))
    assert state.status.autoscaling is not None
    assert state.status.autoscaling.model_dump() == {
        "engine": None,
        "minReplicas": 1,
        "maxReplicas": None,
        "desiredReplicas": None,
        "currentReplicas": None,
        "conditions": None,
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


def test_degraded_stays_for_the_tier_marked_lost_only():
    ready = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2))})
    lost = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2, ready=1))}, previous=ready)
    assert cond(lost, "Degraded").message == "pods lost: decode 1/2"
    assert lost.tiers.decode.lost is True and lost.tiers.encoder.lost is None
    assert (
        status_document(lost)["tiers"]["decode"]["lost"] is True
        and "lost" not in status_document(ready)["tiers"]["decode"]
    )
    # decode still one short without a further drop: still lost; encoder loading is not a loss
    still = derive({"encoder": TierInput(settled(2, ready=1)), "decode": TierInput(settled(3, ready=1))}, previous=lost)
    assert (still.phase, cond(still, "Degraded").message) == ("Degraded", "pods lost: decode 1/3")
    assert (still.tiers.decode.lost, still.tiers.encoder.lost) == (True, None)
    back = derive({"encoder": TierInput(settled(2)), "decode": TierInput(settled(3))}, previous=still)
    assert back.phase == "Ready" and back.tiers.decode.lost is None


def test_a_loss_is_carried_by_the_tiers_mark_not_by_the_words_of_the_last_message():
    short = {"encoder": TierInput(settled(1)), "decode": TierInput(settled(3, ready=1))}
    ready = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2))})
    lost = derive({"encoder": TierInput(settled(1)), "decode": TierInput(settled(2, ready=1))}, previous=ready)

    def reworded(status: EPDDeploymentStatus, message: str) -> EPDDeploymentStatus:
        conditions = [
            c.model_copy(update={"message": message}) if c.type == "Degraded" else c for c in status.conditions
        ]
        return status.model_copy(update={"conditions": conditions})

    # The Degraded message no longer names decode: the mark still carries the loss.
    assert derive(short, previous=reworded(lost, "something else")).phase == "Degraded"
    # The message names decode, its mark is gone: no loss is carried forward.
    unmarked = lost.model_copy(
        update={"tiers": lost.tiers.model_copy(update={"decode": lost.tiers.decode.model_copy(update={"lost": None})})}
    )
    assert derive(short, previous=reworded(unmarked, "pods lost: decode 1/2")).phase == "Progressing"
    # A mark left in a status that is no longer Degraded carries nothing either.
    assert derive(short, previous=lost.model_copy(update={"phase": "Progressing"})).phase == "Progressing"


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
    assert st is not None and (st.phase, st.observedGeneration) == ("Ready", 2)


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
    # refused when written (a webhook that judges real writes only): the Event does not claim nothing changed
    written = f'ScaledObject z: admission webhook "v" denied the request: no ({REFUSED_WHEN_WRITTEN})'
    partial = derive({"decode": TierInput(settled(2))}, previous=other, refused=[written])
    assert [t.message for t in transitions(other, partial)] == [f"spec refused: {written}"]


def test_unschedulable_event_again_only_when_the_reason_changes():
    first = derive({"decode": TierInput(settled(2, ready=0), unschedulable="no GPU")})
    again = derive({"decode": TierInput(settled(2, ready=0), unschedulable="no memory")}, previous=first)
    assert [(t.type, t.reason, t.message) for t in transitions(first, again)] == [
        ("Warning", "Unschedulable", "decode pods cannot be scheduled: no memory")
    ]
    # the same reason with another ready count is not a new reason
    fewer = derive({"decode": TierInput(settled(3, ready=1), unschedulable="no memory")}, previous=again)
    assert cond(fewer, "Ready").message == "not ready: decode 1/3; decode pods cannot be scheduled: no memory"
    assert transitions(again, fewer) == []
    # a ready tier's stale reason is not reported
    fine = derive({"decode": TierInput(settled(2), unschedulable="no GPU")})
    assert cond(fine, "Ready").reason == "AllTiersReady"


def test_a_leader_worker_set_counts_ready_groups_as_available():
    state = tier_state(TierInput(lws(2, 2)))
    assert (state.status.availableReplicas, state.ready) == (2, True)
    # a Deployment without availableReplicas has none available, whatever is ready
    dep_ = {**lws(2, 2), "kind": "Deployment"}
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
    assert state.status.autoscaling is not None
    assert state.status.autoscaling.model_dump() == {
        "engine": None,
        "minReplicas": 2,
        "maxReplicas": 8,
        "desiredReplicas": 5,
        "currentReplicas": 4,
        "conditions": None,
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
    assert (st.tiers.decode.reason, st.tiers.decode.message) == ("Unschedulable", why)
    assert (st.tiers.encoder.reason, st.tiers.encoder.message) == (None, None)
    [event] = transitions(None, st)
    assert (event.type, event.reason, event.message) == (
        "Warning",
        "Unschedulable",
        f"decode pods cannot be scheduled: {why}",
    )
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


def test_pods_are_counted_per_generation_current_first():
    pods = [
        generation_pod("encoder", "aaa"),
        generation_pod("decode", "aaa"),
        generation_pod("decode", "aaa", ready=False),
        generation_pod("encoder", "bbb"),
        generation_pod("decode", "bbb", ready=False),
        generation_pod("decode", "aaa", leaving=True),  # terminating: takes no new work
        generation_pod("router", None),
        generation_pod("encoder", None),
    ]  # the router has none; an unlabelled pod is not counted
    report = [g.model_dump() for g in generations(pods, current="bbb")]
    assert report == [
        {"name": "bbb", "current": True, "pods": {"encoder": 1, "decode": 1}, "readyPods": {"encoder": 1}},
        {
            "name": "aaa",
            "current": False,
            "pods": {"encoder": 1, "decode": 2},
            "readyPods": {"encoder": 1, "decode": 1},
        },
    ]


def test_without_pods_there_are_no_generations():
    assert generations([], current="aaa") == []


def test_consumers_held_for_an_encoder_make_it_progressing_and_name_both_generations():
    tiers = {"encoder": TierInput(settled(1)), "decode": TierInput(settled(2))}
    held = [Held("Deployment", "vl-decode", "decode", runs="old", waits_for="new")]
    st = derive(tiers, held=held)
    assert st.phase == "Progressing"
    progressing = cond(st, "Progressing")
    assert (progressing.status, progressing.reason) == ("True", "WaitingForEncoders")
    assert progressing.message == "decode (generation old) keep serving until an encoder pod of generation new is Ready"
    assert cond(st, "Ready").status == "True"  # its pods serve meanwhile
    assert derive(tiers).phase == "Ready"


def test_every_held_consumer_is_named_and_the_encoder_rolling_out_for_them_too():
    # the new generation's encoder is still rolling out; prefill and decode serve on the old one meanwhile
    rolling = {"metadata": {"generation": 2}, "spec": {"replicas": 1}, "status": {"observedGeneration": 1}}
    tiers = {"encoder": TierInput(rolling), "prefill": TierInput(settled(1)), "decode": TierInput(settled(2))}
    held = [
        Held("Deployment", "vl-prefill", "prefill", runs="old", waits_for="new"),
        Held("Deployment", "vl-decode", "decode", runs="old", waits_for="new"),
    ]
    progressing = cond(derive(tiers, held=held), "Progressing")
    assert (progressing.status, progressing.reason) == ("True", "WaitingForEncoders")
    assert progressing.message == (
        "prefill (generation old), decode (generation old) keep serving until an encoder pod of generation new "
        "is Ready; rolling out: encoder 0/1"
    )
