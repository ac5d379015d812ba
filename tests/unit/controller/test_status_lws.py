"""A multi-node tier's status read from its LeaderWorkerSet: the controller's own conditions and
ready groups, and the groups its pods show not ready (a group restart, a rolling update)."""

from __future__ import annotations

import copy
from typing import Any

from epd_operator.api.status import GROUPS_NOT_READY
from epd_operator.controller.pods import PodTrouble
from epd_operator.controller.status import TierInput, derive_status, tier_state, transitions, unready_groups_of
from epd_operator.controller.status_lws import unready_groups
from tests.unit.controller.test_status import lws

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
GROUP = "leaderworkerset.sigs.k8s.io/group-index"


def group_pod(group: int, worker: int, ready: bool = True, leaving: bool = False) -> dict[str, Any]:
    name = f"m-decode-{group}" if worker == 0 else f"m-decode-{group}-{worker}"
    meta: dict[str, Any] = {"name": name, "labels": {GROUP: str(group)}}
    if leaving:
        meta["deletionTimestamp"] = T0
    return {
        "metadata": meta,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def derive(decode: TierInput, previous=None, now=T0):
    return derive_status(
        tiers={"decode": decode},
        topology=None,
        endpoint=None,
        observed_generation=1,
        spec_errors=None,
        previous=previous,
        now=now,
    )


def cond(st, type_):
    return next(c for c in st.conditions if c.type == type_)


def test_ready_needs_the_controllers_available_condition_not_only_ready_counts():
    ready = lws(2, 2)
    assert tier_state(TierInput(ready)).ready
    # counts say ready, but the controller has not said Available (e.g. not reconciled since)
    unsaid = copy.deepcopy(ready)
    for c in unsaid["status"]["conditions"]:
        c["status"] = "False"
    state = tier_state(TierInput(unsaid))
    assert (state.settled, state.ready, state.status.reason) == (True, False, GROUPS_NOT_READY)
    # an Available condition of an older generation is not today's word
    stale = copy.deepcopy(ready)
    stale["metadata"]["generation"] = 4
    stale["status"]["observedGeneration"] = 4
    assert not tier_state(TierInput(stale)).ready
    # no conditions at all: never ready
    bare = copy.deepcopy(ready)
    del bare["status"]["conditions"]
    assert not tier_state(TierInput(bare)).ready


def test_a_rolling_update_of_groups_is_not_settled():
    state = tier_state(TierInput(lws(2, 2, updated=1)))
    assert (state.settled, state.ready) == (False, False)
    # UpdateInProgress alone (counts caught up, the controller not yet) still rolls
    rolling = lws(2, 2, updated=1)
    rolling["status"]["updatedReplicas"] = 2
    assert tier_state(TierInput(rolling)).settled is False
    st = derive(TierInput(lws(2, 1, updated=1), unready_groups=(1,)))
    assert (st.phase, cond(st, "Progressing").message) == ("Progressing", "rolling out: decode 1/2")
    assert (
        st.tiers.decode.message == "group 1 of 2 not ready (LeaderWorkerSet m-decode: Rolling Upgrade is in progress)"
    )


def test_unready_groups_miss_a_pod_or_have_one_not_ready():
    whole = lws(3, 1)
    pods = [
        group_pod(0, 0),
        group_pod(0, 1),
        group_pod(1, 0),
        group_pod(1, 1, ready=False),
        group_pod(2, 0),
        group_pod(2, 1, leaving=True),  # on its way out: missing
        group_pod(3, 0, ready=False),  # beyond the replicas (scaling down): not counted
        {"metadata": {"name": "other", "labels": {}}},  # not a group member
    ]
    assert unready_groups(whole, pods) == (1, 2)
    assert unready_groups(whole, []) == (0, 1, 2)  # a restarting group has no pods for a moment
    assert unready_groups(lws(2, 2), [group_pod(g, w) for g in (0, 1) for w in (0, 1)]) == ()


def test_only_a_leader_worker_set_has_groups_to_name():
    """What the reconciler asks of each tier's workload: a Deployment's pods form no groups."""
    pods = [group_pod(0, 0), group_pod(1, 0, ready=False)]
    assert unready_groups_of(lws(2, 1, size=1), pods) == (1,)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}}
    assert unready_groups_of(deployment, pods) == ()


def test_a_group_restart_names_the_group_and_is_degraded_until_it_is_ready_again():
    ready = derive(TierInput(lws(2, 2)))
    assert (ready.phase, ready.tiers.decode.reason) == ("Ready", None)
    # a worker pod of group 1 was deleted: LWS recreates the whole group
    restarting = derive(TierInput(lws(2, 1), unready_groups=(1,)), previous=ready, now=T1)
    decode = restarting.tiers.decode
    assert (restarting.phase, decode.ready, decode.reason) == ("Degraded", "1/2", GROUPS_NOT_READY)
    assert decode.message == "group 1 of 2 not ready (LeaderWorkerSet m-decode: Replicas are progressing)"
    readiness = cond(restarting, "Ready")
    assert (readiness.status, readiness.reason) == ("False", "TiersNotReady")
    assert readiness.message == f"not ready: decode 1/2; decode {GROUPS_NOT_READY}: {decode.message}"
    assert cond(restarting, "Degraded").message == "pods lost: decode 1/2"
    warning = [t for t in transitions(ready, restarting) if t.reason == GROUPS_NOT_READY]
    assert [w.message for w in warning] == [f"decode {GROUPS_NOT_READY}: {decode.message}"]
    back = derive(TierInput(lws(2, 2), unready_groups=()), previous=restarting, now=T1)
    assert (back.phase, back.tiers.decode.reason, back.tiers.decode.message) == ("Ready", None, None)
    assert [(t.type, t.reason) for t in transitions(restarting, back)] == [("Normal", "Ready")]


def test_a_restarting_group_that_counts_as_not_updated_is_no_rollout():
    # While LWS recreates a group it counts it neither updated nor current: no UpdateInProgress.
    restarting = lws(2, 1)
    restarting["status"]["updatedReplicas"] = 1
    state = tier_state(TierInput(restarting, unready_groups=(1,)))
    assert (state.settled, state.ready, state.status.reason) == (True, False, GROUPS_NOT_READY)
    st = derive(TierInput(restarting, unready_groups=(1,)), previous=derive(TierInput(lws(2, 2))), now=T1)
    assert (st.phase, cond(st, "Progressing").status) == ("Degraded", "False")


def test_several_groups_and_no_group_known_from_pods():
    state = tier_state(TierInput(lws(3, 1), unready_groups=(0, 2)))
    assert state.status.message == "groups 0, 2 of 3 not ready (LeaderWorkerSet m-decode: Replicas are progressing)"
    state = tier_state(TierInput(lws(3, 1)))
    assert state.status.message == "1 of 3 groups ready (LeaderWorkerSet m-decode: Replicas are progressing)"
    silent = lws(3, 1)
    silent["status"]["conditions"] = []
    assert tier_state(TierInput(silent)).status.message == "1 of 3 groups ready (LeaderWorkerSet m-decode)"


def test_a_pods_own_trouble_wins_over_the_group_count():
    trouble = PodTrouble("CrashLoopBackOff", "pod m-decode-1-1 container vllm: Error (exit code 1)")
    st = derive(TierInput(lws(2, 1), trouble=trouble, unready_groups=(1,)))
    assert (st.tiers.decode.reason, st.tiers.decode.message) == (trouble.reason, trouble.message)
    assert cond(st, "Ready").reason == "PodsFailing"


def test_the_lws_controllers_word_is_quoted_whichever_of_its_conditions_holds():
    # a scale-up from 2 to 3 groups the controller has not seen yet: it still says Available, as it wrote
    # it (its conditions carry no observedGeneration), and the tier says so next to its count
    scaling = lws(2, 2)
    scaling["metadata"]["generation"] = 4
    scaling["spec"]["replicas"] = 3
    for c in scaling["status"]["conditions"]:
        del c["observedGeneration"]
    state = tier_state(TierInput(scaling))
    assert (state.settled, state.ready, state.status.reason) == (False, False, GROUPS_NOT_READY)
    assert state.status.message == "2 of 3 groups ready (LeaderWorkerSet m-decode: All replicas are ready)"
    # a condition without words adds none, not an empty quote
    mute = lws(3, 1)
    for c in mute["status"]["conditions"]:
        c.pop("message")
    assert tier_state(TierInput(mute)).status.message == "1 of 3 groups ready (LeaderWorkerSet m-decode)"


def test_a_leader_worker_set_without_replicas_or_size_has_one_group_of_one_pod():
    # the LWS API's defaults: replicas 1, leaderWorkerTemplate.size 1
    bare = {"kind": "LeaderWorkerSet", "metadata": {"name": "m-decode"}, "spec": {}}
    assert unready_groups(bare, [group_pod(0, 0)]) == ()
    assert unready_groups(bare, [group_pod(0, 0, ready=False)]) == (0,)
    assert unready_groups(bare, []) == (0,)


def test_a_leader_worker_sets_rollout_reads_every_count_of_its_status():
    from epd_operator.controller.status_deployment import Rollout
    from epd_operator.controller.status_lws import lws_rollout

    ws = {
        "metadata": {"name": "qwen-decode", "generation": 3},
        "spec": {"replicas": 4},
        "status": {
            "observedGeneration": 3,
            "replicas": 5,
            "readyReplicas": 2,
            "updatedReplicas": 3,
            "availableReplicas": 1,
            "conditions": [
                {"type": "Progressing", "status": "True", "reason": "ProgressDeadlineExceeded", "message": "slow"}
            ],
        },
    }
    assert lws_rollout(ws, (2, 3)) == Rollout(
        desired=4,
        replicas=5,
        ready=2,
        updated=3,
        available=1,
        settled=True,
        is_ready=False,
        stuck=True,
        reason=GROUPS_NOT_READY,
        message="groups 2, 3 of 4 not ready (LeaderWorkerSet qwen-decode: slow)",
    )


def test_a_bare_leader_worker_set_has_one_group_and_counts_nothing_yet():
    from epd_operator.controller.status_deployment import Rollout
    from epd_operator.controller.status_lws import lws_rollout

    assert lws_rollout({}, ()) == Rollout(
        desired=1,
        replicas=0,
        ready=0,
        updated=0,
        available=0,
        settled=True,
        is_ready=False,
        stuck=False,
        reason=GROUPS_NOT_READY,
        message="0 of 1 groups ready (LeaderWorkerSet )",
    )
    ready = {
        "spec": {"replicas": 2},
        "status": {"readyReplicas": 2, "conditions": [{"type": "Available", "status": "True"}]},
    }
    rollout = lws_rollout(ready, ())
    assert (rollout.is_ready, rollout.available, rollout.reason, rollout.message) == (True, 2, None, None)
