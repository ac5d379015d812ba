"""controller/pods and controller/status: a tier's pods the kubelet cannot run, named in the status and in one
Event per change. The container statuses are the kubelet's own (1.37, containerd, runc), as the real node
reported them for an image no registry serves and for an image without the command it is told to run."""

from __future__ import annotations

from typing import Any

from epd_operator.controller.pods import PodTrouble, container_trouble, pod_trouble
from epd_operator.controller.status import TierInput, derive_status, status_document, transitions
from tests.support.workloads import settled_deployment

T0 = "2026-01-01T00:00:00Z"
IMAGE = "localhost/epd-missing:never"
PULL_ERROR = (
    f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": failed to do request: '
    'Head "http://localhost/v2/epd-missing/manifests/never": dial tcp 127.0.0.1:80: connect: connection refused'
)
EXEC_ERROR = (
    "failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: "
    'unable to start container process: exec: "vllm": executable file not found in $PATH: unknown'
)
START_ERROR = {"exitCode": 128, "reason": "StartError", "message": EXEC_ERROR}


def container(state: dict[str, Any], last: dict[str, Any] | None = None, ready: bool = False) -> dict[str, Any]:
    return {"name": "vllm", "ready": ready, "state": state, "lastState": {"terminated": last} if last else {}}


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message} if message else {"reason": reason}}


# The image pull: ErrImagePull, then the back-off that carries the pull's error.
PULLING = [
    container(waiting("ErrImagePull", PULL_ERROR)),
    container(waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}": ErrImagePull: {PULL_ERROR}')),
]
# The restart loop: RunContainerError, then the back-off, its delay growing, the last exit unchanged.
RESTARTING = [
    container(waiting("RunContainerError", EXEC_ERROR), START_ERROR),
    container(waiting("CrashLoopBackOff", "back-off 10s restarting failed container=vllm pod=p_ns(u)"), START_ERROR),
    container(waiting("CrashLoopBackOff", "back-off 1m20s restarting failed container=vllm pod=p_ns(u)"), START_ERROR),
]


def test_both_sides_of_the_pull_loop_give_the_pull_error():
    for seen in PULLING:
        assert container_trouble(seen) == ("ErrImagePull", PULL_ERROR)


def test_a_pull_back_off_without_the_pull_error_is_reported_as_it_is():
    bare = container(waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'))
    assert container_trouble(bare) == ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')


def test_every_side_of_the_restart_loop_gives_the_last_exit():
    expected = ("CrashLoopBackOff", f"StartError (exit code 128): {EXEC_ERROR}")
    for seen in RESTARTING:
        assert container_trouble(seen) == expected
    # running again, not ready yet: still the loop, until the container is ready
    assert container_trouble(container({"running": {}}, START_ERROR)) == expected
    assert container_trouble(container({"running": {}}, START_ERROR, ready=True)) is None
    # between two runs the current exit is the news
    assert container_trouble(container({"terminated": {"exitCode": 1, "reason": "Error"}})) == (
        "CrashLoopBackOff",
        "Error (exit code 1)",
    )
    oom = {"exitCode": 137, "reason": "OOMKilled"}
    assert container_trouble(container(waiting("CrashLoopBackOff", "back-off 5m0s"), oom)) == (
        "CrashLoopBackOff",
        "OOMKilled (exit code 137)",
    )


def test_a_container_on_its_way_up_is_no_trouble_and_other_reasons_pass_through():
    assert container_trouble(container(waiting("ContainerCreating"))) is None
    assert container_trouble(container(waiting("PodInitializing"))) is None
    assert container_trouble(container({"running": {}})) is None
    assert container_trouble(container({})) is None
    assert container_trouble(container(waiting("CreateContainerConfigError", 'secret "hf-token" not found'))) == (
        "CreateContainerConfigError",
        'secret "hf-token" not found',
    )
    assert container_trouble(container(waiting("ErrImageNeverPull", "no image"))) == ("ErrImageNeverPull", "no image")
    # a restart-loop reason without a recorded exit is passed on as the kubelet gives it
    assert container_trouble(container(waiting("RunContainerError", "boom"))) == ("RunContainerError", "boom")


def test_an_init_container_that_finished_is_no_trouble():
    done = container({"terminated": {"exitCode": 0, "reason": "Completed"}})
    assert container_trouble(done, init=True) is None
    assert container_trouble(done) == ("CrashLoopBackOff", "Completed (exit code 0)")


def pod(name: str, *containers: dict[str, Any], ready: bool = False, init=(), **status: Any) -> dict[str, Any]:
    st: dict[str, Any] = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": list(containers),
        **status,
    }
    if init:
        st["initContainerStatuses"] = list(init)
    return {"metadata": {"name": name}, "status": st}


def test_the_first_troubled_pod_by_name_names_itself_and_its_container():
    pulling, restarting = PULLING[0], RESTARTING[0]
    assert pod_trouble([]) is None
    assert pod_trouble([pod("b", restarting), pod("a", pulling)]) == PodTrouble(
        "ErrImagePull", f"pod a container vllm: {PULL_ERROR}"
    )
    # ready pods, pods on their way out and pods that ended are passed over
    leaving = pod("a", pulling)
    leaving["metadata"]["deletionTimestamp"] = T0
    evicted = pod("a", pulling, phase="Failed")
    for other in (pod("a", pulling, ready=True), leaving, evicted):
        assert pod_trouble([other, pod("b", restarting)]) == PodTrouble(
            "CrashLoopBackOff", f"pod b container vllm: StartError (exit code 128): {EXEC_ERROR}"
        )
    # a pod without container statuses yet (just scheduled) has none to tell
    assert pod_trouble([{"metadata": {"name": "new"}, "status": {}}]) is None
    # init containers come first
    init = {**PULLING[0], "name": "fetch"}
    assert pod_trouble([pod("a", RESTARTING[0], init=[init])]) == PodTrouble(
        "ErrImagePull", f"pod a init container fetch: {PULL_ERROR}"
    )


def derive(tiers: dict[str, TierInput], previous=None):
    return derive_status(
        tiers=tiers,
        topology="E+PD",
        endpoint="http://vl.ns.svc:8000",
        observed_generation=1,
        spec_errors=None,
        previous=previous,
        now=T0,
    )


def cond(st, type_):
    return next(c for c in st.conditions if c.type == type_)


def observed(encoder: dict[str, Any], decode: dict[str, Any]) -> dict[str, TierInput]:
    """The tiers as a status pass sees them: the encoder's pod in the pull loop, decode's in the
    restart loop, the router ready."""
    return {
        "encoder": TierInput(settled_deployment(1, ready=0), trouble=pod_trouble([pod("vl-encoder-7f-x", encoder)])),
        "decode": TierInput(settled_deployment(1, ready=0), trouble=pod_trouble([pod("vl-decode-5c-y", decode)])),
        "router": TierInput(settled_deployment(1)),
    }


def test_each_failing_tier_is_named_with_the_kubelets_reason_and_the_router_stays_ready():
    st = derive(observed(PULLING[0], RESTARTING[0]))
    doc = status_document(st)
    assert doc["tiers"] == {
        "encoder": {
            "replicas": 1,
            "readyReplicas": 0,
            "updatedReplicas": 1,
            "availableReplicas": 0,
            "ready": "0/1",
            "reason": "ErrImagePull",
            "message": f"pod vl-encoder-7f-x container vllm: {PULL_ERROR}",
        },
        "decode": {
            "replicas": 1,
            "readyReplicas": 0,
            "updatedReplicas": 1,
            "availableReplicas": 0,
            "ready": "0/1",
            "reason": "CrashLoopBackOff",
            "message": f"pod vl-decode-5c-y container vllm: StartError (exit code 128): {EXEC_ERROR}",
        },
        "router": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1, "ready": "1/1"},
    }
    assert st.phase == "Progressing"
    ready = cond(st, "Ready")
    assert (ready.status, ready.reason) == ("False", "PodsFailing")
    assert ready.message == (
        "not ready: encoder 0/1, decode 0/1; "
        f"encoder ErrImagePull: pod vl-encoder-7f-x container vllm: {PULL_ERROR}; "
        f"decode CrashLoopBackOff: pod vl-decode-5c-y container vllm: StartError (exit code 128): {EXEC_ERROR}"
    )
    assert [(t.type, t.reason, t.message) for t in transitions(None, st)] == [
        ("Warning", "ErrImagePull", f"encoder ErrImagePull: pod vl-encoder-7f-x container vllm: {PULL_ERROR}"),
        (
            "Warning",
            "CrashLoopBackOff",
            f"decode CrashLoopBackOff: pod vl-decode-5c-y container vllm: StartError (exit code 128): {EXEC_ERROR}",
        ),
    ]


def test_the_kubelets_retry_loops_write_the_status_and_post_the_events_once():
    first = derive(observed(PULLING[0], RESTARTING[0]))
    previous = first
    for encoder, decode in zip(PULLING * 3, RESTARTING * 2, strict=True):
        again = derive(observed(encoder, decode), previous=previous)
        assert status_document(again) == status_document(first)  # nothing to write
        assert transitions(previous, again) == []
        previous = again


def test_a_new_reason_is_posted_once_and_a_ready_tier_explains_nothing():
    first = derive(observed(PULLING[0], RESTARTING[0]))
    # the encoder's image is fixed; its new pod cannot run the command
    fixed_image = {
        "encoder": TierInput(
            settled_deployment(1, ready=0), trouble=pod_trouble([pod("vl-encoder-9d-z", RESTARTING[1])])
        ),
        "decode": observed(PULLING[0], RESTARTING[0])["decode"],
        "router": TierInput(settled_deployment(1)),
    }
    second = derive(fixed_image, previous=first)
    assert [(t.reason, t.message) for t in transitions(first, second)] == [
        (
            "CrashLoopBackOff",
            f"encoder CrashLoopBackOff: pod vl-encoder-9d-z container vllm: StartError (exit code 128): {EXEC_ERROR}",
        )
    ]
    # every tier ready: a pod still reporting trouble (on its way out) is not the tier's reason
    healthy = {
        name: TierInput(settled_deployment(1), trouble=PodTrouble("ErrImagePull", "stale"))
        for name in ("encoder", "decode", "router")
    }
    done = derive(healthy, previous=second)
    assert done.phase == "Ready" and cond(done, "Ready").reason == "AllTiersReady"
    assert all(
        t.reason is None and t.message is None for t in (done.tiers.encoder, done.tiers.decode, done.tiers.router)
    )
    assert [(t.type, t.reason) for t in transitions(second, done)] == [("Normal", "Ready")]


def test_an_unplaced_pod_comes_before_a_failing_one_and_sets_the_ready_reason():
    tiers = {
        "encoder": TierInput(settled_deployment(1, ready=0), trouble=pod_trouble([pod("e", PULLING[0])])),
        "decode": TierInput(
            settled_deployment(2, ready=0), unschedulable="no GPU", trouble=pod_trouble([pod("d", RESTARTING[0])])
        ),
    }
    st = derive(tiers)
    assert (st.tiers.decode.reason, st.tiers.decode.message) == ("Unschedulable", "no GPU")
    ready = cond(st, "Ready")
    assert ready.reason == "Unschedulable"
    assert ready.message == (
        f"not ready: encoder 0/1, decode 0/2; encoder ErrImagePull: pod e container vllm: {PULL_ERROR}; "
        "decode pods cannot be scheduled: no GPU"
    )


def test_an_exit_reads_in_plain_words_where_the_runtime_left_a_field_out():
    # `reason` is optional in a terminated state: the exit still says it ended, and with what code
    assert container_trouble(container({"terminated": {"exitCode": 2}})) == ("CrashLoopBackOff", "exited (exit code 2)")
    assert container_trouble(container({"terminated": {"reason": "Error"}})) == (
        "CrashLoopBackOff",
        "Error (exit code ?)",
    )


def test_a_waiting_container_is_trouble_only_by_the_kubelets_own_reason():
    # no reason given: nothing to tell, the operator makes none up
    assert container_trouble(container({"waiting": {}})) is None
    assert container_trouble(container({"waiting": {"message": "pulling"}})) is None
    # a reason without a message is passed on with no words added
    assert container_trouble(container(waiting("CreateContainerError"))) == ("CreateContainerError", "")


def test_a_pod_that_ran_to_completion_is_passed_over():
    done = container({"terminated": {"exitCode": 0, "reason": "Completed"}})
    assert pod_trouble([pod("a", done, phase="Succeeded"), pod("b", RESTARTING[0])]) == PodTrouble(
        "CrashLoopBackOff", f"pod b container vllm: StartError (exit code 128): {EXEC_ERROR}"
    )


def test_an_init_container_that_did_its_work_leaves_the_word_to_the_container_that_fails():
    fetched = {**container({"terminated": {"exitCode": 0, "reason": "Completed"}}), "name": "fetch"}
    assert pod_trouble([pod("a", RESTARTING[0], init=[fetched])]) == PodTrouble(
        "CrashLoopBackOff", f"pod a container vllm: StartError (exit code 128): {EXEC_ERROR}"
    )
    # a container of the pod (not an init container) that exited 0 is still a container that stopped
    exited = container({"terminated": {"exitCode": 0, "reason": "Completed"}})
    assert pod_trouble([pod("a", exited, init=[fetched])]) == PodTrouble(
        "CrashLoopBackOff", "pod a container vllm: Completed (exit code 0)"
    )
