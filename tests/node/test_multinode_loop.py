"""A multi-node tier on real pods: the prefill+decode tier of examples/epd-local-cpu-multinode.yaml is a
LeaderWorkerSet whose two pods (standing for two nodes) run vLLM 0.32 for CPU with the model split by
tensor parallelism across them, on the local cluster's real node with the real LWS controller
(dev/parts/lws.py, started on the shared cluster; the chart's operator restarted so that it watches the
LeaderWorkerSets whose CRD just appeared).

LWS creates the leader and the worker, and both vLLM ranks say they joined one group; the tier's Service
holds the leader only; a chat with an image answers through the router Service; with two groups, a
worker pod deleted makes LWS recreate its whole group (its leader too) while the other group keeps
serving and the EPDDeployment's status names the group not ready, then Ready; a change to the tier
rolls the groups one at a time; deleting the EPDDeployment removes everything. Each test asks a
fixture for the deployment it needs (one group or two, Ready), so any test runs alone or in any order;
how long each state took to reach is printed, not asserted.

`long` (tens of minutes on 2 cores: up to five vLLM processes start, each group twice more), so outside
`make test`'s budget; `make test-node` runs it.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.local.client import Reply, chat, chat_body, image_part, text_part
from tests.support.cluster import wait_for
from tests.support.mission import Mission, remove
from tests.support.mission import all_ready as _all_ready
from tests.support.mission import describe as _describe
from tests.support.mission import port_forward as _port_forward
from tests.support.real_node import is_ready, unavailable

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "epd-local-cpu-multinode.yaml"
NS, NAME, SERVED = "epd-local", "tiny-vl-mn", "tiny-vl"
LWS_NAME = f"{NAME}-decode"
EPD_API = "serving.epd.dev/v1alpha1"
LWS_API = "leaderworkerset.x-k8s.io/v1"
GROUP = "leaderworkerset.sigs.k8s.io/group-index"
WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
MAX_TOKENS = 4
ROLLOUT = "EPD_LOCAL_ROLLOUT"  # an env var the tests change to roll the tier

pytestmark = [
    pytest.mark.long,  # tens of minutes: `-m "not long"` leaves it out
    pytest.mark.timeout(3000),
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@pytest.fixture(scope="module")
def mission(shared_mission: Mission) -> Iterator[Mission]:
    m = dataclasses.replace(shared_mission, name=NAME)
    m.cluster.start_part("lws")
    # The operator watches the optional kinds whose CRDs exist when it starts; it would restart itself within
    # its poll interval to watch LWS (controller/served_kinds.py): a rollout restart does it at once.
    [operator] = m.system.list("apps/v1", "Deployment", labels={"app.kubernetes.io/name": "epd-operator"})
    deployment = f"deployment/{operator['metadata']['name']}"
    m.system.kubectl("-n", m.system.ns, "rollout", "restart", deployment)
    m.system.kubectl("-n", m.system.ns, "rollout", "status", deployment, "--timeout=300s")
    yield m
    remove(m, NAME)


def deployed(m: Mission, groups: int) -> Mission:
    """The example applied (when absent) with `groups` LWS groups in its decode tier, every pod Ready."""
    started = time.monotonic()
    if m.kube.get(EPD_API, "EPDDeployment", NAME) is None:
        m.kube.kubectl("apply", "-f", str(EXAMPLE))
    m.kube.ok(
        "PATCH", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/{NAME}", {"spec": {"decode": {"replicas": groups}}}
    )
    wait_all_ready(m, groups)
    print(f"{groups} group(s) Ready after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return m


@pytest.fixture
def one_group(mission: Mission) -> Mission:
    return deployed(mission, 1)


@pytest.fixture
def two_groups(mission: Mission) -> Mission:
    return deployed(mission, 2)


def group_pods(m: Mission) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in m.kube.pods(**{"leaderworkerset.sigs.k8s.io/name": LWS_NAME})
        if not p["metadata"].get("deletionTimestamp")
    }


def leader_worker_set(m: Mission) -> dict[str, Any]:
    obj = m.kube.get(LWS_API, "LeaderWorkerSet", LWS_NAME)
    assert obj is not None, "the LeaderWorkerSet is gone"
    return obj


def body(seed: int) -> dict[str, Any]:
    return chat_body(SERVED, [text_part("Describe the image."), image_part(seed)], MAX_TOKENS)


def logs(m: Mission, pod: str, *, previous: bool = False) -> str:
    flags = ("--previous",) if previous else ()
    return m.kube.kubectl("-n", NS, "logs", pod, "-c", "vllm", *flags, check=False).stdout


def group_logs(m: Mission, lines: int = 60) -> str:
    """The last lines each group pod's vLLM wrote, this run's and the one before a restart: what an
    assertion about the group shows when it fails."""
    said = []
    for pod in sorted(group_pods(m)):
        for previous in (True, False):
            text = logs(m, pod, previous=previous).splitlines()[-lines:]
            if text:
                said.append(f"--- {pod}{' (previous)' if previous else ''}:\n" + "\n".join(text))
    return "\n".join(said)


def tier(m: Mission) -> dict[str, Any]:
    epd = m.kube.get(EPD_API, "EPDDeployment", NAME) or {}
    return dict(epd.get("status", {}).get("tiers", {}).get("decode") or {})


def wait_all_ready(m: Mission, groups: int, timeout: float = 1200) -> None:
    """`groups` groups of two Ready pods, and no pod of a group removed by a scale-down still terminating."""

    def ready() -> bool:
        pods = m.kube.pods(**{"leaderworkerset.sigs.k8s.io/name": LWS_NAME})
        settled = all(is_ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods)
        return _all_ready(m) and len(pods) == 2 * groups and settled

    wait_for(ready, timeout, lambda: f"{_describe(m)}\n{group_logs(m)}", interval=3)


def test_lws_creates_the_group_and_both_vllm_ranks_join_it(one_group: Mission):
    mission = one_group
    pods = group_pods(mission)
    assert set(pods) == {LWS_NAME + "-0", LWS_NAME + "-0-1"}
    leader, worker = pods[LWS_NAME + "-0"], pods[LWS_NAME + "-0-1"]
    assert (leader["metadata"]["labels"][WORKER], worker["metadata"]["labels"][WORKER]) == ("0", "1")
    assert {p["spec"]["nodeName"] for p in pods.values()} == {"cpu-node-1"}
    assert "--headless" in worker["spec"]["containers"][0]["args"]
    # vLLM's own words: one torch.distributed group of two ranks, one in each pod, TP split across them.
    assert "world_size=2 rank=0" in logs(mission, LWS_NAME + "-0")
    assert "world_size=2 rank=1" in logs(mission, LWS_NAME + "-0-1")
    assert "TP rank 1" in logs(mission, LWS_NAME + "-0-1")
    assert "headless" in logs(mission, LWS_NAME + "-0-1")
    said = {c["type"]: c["status"] for c in leader_worker_set(mission)["status"]["conditions"]}
    assert said.get("Available") == "True", said


def test_the_tier_service_holds_the_leader_only(one_group: Mission):
    mission = one_group

    def targets() -> list[str]:
        labels = {"kubernetes.io/service-name": LWS_NAME}
        slices = mission.kube.list("discovery.k8s.io/v1", "EndpointSlice", labels=labels)
        return sorted(e["targetRef"]["name"] for s in slices for e in s.get("endpoints") or [])

    # The endpointslice controller follows the pods (a group a scale-down removed leaves within seconds).
    wait_for(lambda: targets() == [LWS_NAME + "-0"], 60, lambda: f"the Service's endpoints: {targets()}", interval=1)


def test_a_chat_with_an_image_answers_through_the_router_service(one_group: Mission):
    mission = one_group
    [leader] = [p for n, p in group_pods(mission).items() if n == LWS_NAME + "-0"]
    answered = mission.pod_metric(leader, "vllm:request_success_total")
    with _port_forward(mission) as port:
        reply = chat(f"http://127.0.0.1:{port}", body(1))
    assert reply.ok, f"through the router Service: {reply}\n{group_logs(mission)}"
    assert reply.completion_tokens == MAX_TOKENS
    assert mission.pod_metric(leader, "vllm:request_success_total") == answered + 1, "the leader answered"


def test_a_lost_worker_restarts_its_whole_group_while_the_other_group_serves(two_groups: Mission):
    mission = two_groups
    leader_uid = group_pods(mission)[LWS_NAME + "-1"]["metadata"]["uid"]

    replies: list[Any] = []
    stop = threading.Event()
    with _port_forward(mission) as port:

        def load() -> None:
            seed = 100
            while not stop.is_set():
                started = time.monotonic()
                try:
                    replies.append(chat(f"http://127.0.0.1:{port}", body(seed), timeout=60))
                except OSError as error:  # no HTTP answer at all: recorded as status 0, which fails below
                    replies.append(Reply(0, str(error), time.monotonic() - started))
                seed += 1

        client = threading.Thread(target=load, daemon=True)
        client.start()
        mission.kube.delete("v1", "Pod", LWS_NAME + "-1-1")
        try:
            # LWS recreates group 1 whole: a new leader, not only a new worker.
            wait_for(
                lambda: (
                    group_pods(mission).get(LWS_NAME + "-1", {}).get("metadata", {}).get("uid")
                    not in (None, leader_uid)
                ),
                300,
                lambda: f"group 1's leader was not recreated: {sorted(group_pods(mission))}",
                interval=1,
            )
            named = wait_for(
                lambda: "group 1 of 2 not ready" in (tier(mission).get("message") or "") and tier(mission),
                300,
                lambda: f"the status does not name group 1: {tier(mission)}",
                interval=1,
            )
            print(f"during the restart: {named}", file=sys.stderr)
            assert named["ready"] == "1/2"
            wait_all_ready(mission, groups=2)
        finally:
            stop.set()
            client.join(timeout=90)
    assert "reason" not in tier(mission)
    served = [r for r in replies if r.ok]
    assert served, f"no request was served during the restart: {[str(r) for r in replies[:5]]}"
    failed = [r for r in replies if not r.ok]
    # With the other group up, a request sent meanwhile is served, or refused with a 5xx (not left unanswered).
    assert all(r.status >= 500 for r in failed), [str(r) for r in failed[:5]]
    slowest = max((r.seconds for r in failed), default=0.0)
    print(f"during the restart: {len(served)} served, {len(failed)} failed (slowest {slowest:.1f} s)", file=sys.stderr)


def test_a_change_to_the_tier_rolls_the_groups_one_at_a_time(two_groups: Mission):
    mission = two_groups
    before = {n: p["metadata"]["uid"] for n, p in group_pods(mission).items()}
    epd = mission.kube.get(EPD_API, "EPDDeployment", NAME)
    assert epd is not None
    # A value the tier does not have yet, whichever test ran before: the change always makes a new generation.
    env = [e for e in epd["spec"]["decode"].get("env", []) if e["name"] != ROLLOUT]
    rollouts = [int(e["value"]) for e in epd["spec"]["decode"].get("env", []) if e["name"] == ROLLOUT]
    env.append({"name": ROLLOUT, "value": str(max(rollouts, default=0) + 1)})
    mission.kube.ok(
        "PATCH", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/{NAME}", {"spec": {"decode": {"env": env}}}
    )
    lowest_ready, phases = 2, set()

    def rolled() -> bool:
        nonlocal lowest_ready
        status = leader_worker_set(mission).get("status") or {}
        lowest_ready = min(lowest_ready, status.get("readyReplicas", 0))
        phases.add((mission.kube.get(EPD_API, "EPDDeployment", NAME) or {}).get("status", {}).get("phase"))
        pods = group_pods(mission)
        fresh = all(p["metadata"]["uid"] != before.get(n) for n, p in pods.items())
        return len(pods) == 4 and fresh and all(is_ready(p) for p in pods.values())

    wait_for(rolled, 1800, lambda: _describe(mission), interval=2)
    wait_all_ready(mission, groups=2)
    # LWS's rolling update (maxUnavailable 1, maxSurge 0): one group at a time, the other serving.
    assert lowest_ready >= 1, "both groups were down at once"
    assert "Progressing" in phases, phases
    with _port_forward(mission) as port:
        reply = chat(f"http://127.0.0.1:{port}", body(2))
    assert reply.ok, str(reply)


def test_deleting_the_epddeployment_removes_everything(one_group: Mission):
    mission = one_group
    remove(mission, NAME)
    assert mission.kube.get(LWS_API, "LeaderWorkerSet", LWS_NAME) is None

    def services() -> list[str]:  # the tier's, the router's and LWS's per-group headless ones
        return [
            s["metadata"]["name"] for s in mission.kube.list("v1", "Service") if s["metadata"]["name"].startswith(NAME)
        ]

    wait_for(lambda: not services(), 120, lambda: f"Services left: {services()}", interval=2)
