"""The rendered NetworkPolicies enforced on real pods by the local cluster's engine (kube-router's
firewall, dev/network_policy_engine.py): the E/P/D CPU example (examples/epd-local-cpu-nixl.yaml, under
a name of its own) with its policies on by default, and a client pod in another namespace.

In file order on one deployment: from that pod, a direct request to the encoder's and decode's vLLM
port and a connection to prefill's and decode's NIXL side-channel port fail, while a chat through the
router Service answers 200 and moves its prompt's KV from prefill to decode over NIXL (vLLM's own
counters); with `spec.networkPolicy.enabled: false` the same direct requests answer again, so the
refusals were the engine's, not a pod that was down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev import kube_router, network_policy_engine
from dev.client import chat_body
from dev.images import operator_image
from tests.support.cluster import EPD_API, KubeView, wait_for
from tests.support.mission import Mission, all_ready, describe, port_forward, remove
from tests.support.real_node import is_ready, unavailable

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "epd-local-cpu-nixl.yaml"
NAME, SERVED, MAX_TOKENS = "tiny-vl-netpol", "tiny-vl", 4
CLIENT_NS, CLIENT = "netpol-client", "client"
VLLM_PORT = 8000
ROLES = ("encoder", "prefill", "decode", "router")

pytestmark = [
    pytest.mark.timeout(1500),  # vLLM starts three pods on two cores
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
    # The engine is a late build (make k8s): a cluster's real node runs it only when it is built.
    pytest.mark.late_build,
    pytest.mark.skipif(
        not kube_router.KUBE_ROUTER.built(), reason="kube-router is not built: make k8s (or python -m dev.kube_router)"
    ),
]

# Run in the client pod: one TCP connection or HTTP request, its outcome as JSON on stdout.
_PROBE = """
import json, socket, sys, urllib.error, urllib.request
kind, target, body = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if kind == "tcp":
        host, port = target.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5).close()
        out = ["open", 0, ""]
    else:
        data = body.encode() if body else None
        req = urllib.request.Request(target, data=data, headers={"Content-Type": "application/json"})
        r = urllib.request.urlopen(req, timeout=5 if data is None else 120)
        out = ["open", r.status, r.read().decode()[:2000]]
except urllib.error.HTTPError as e:
    out = ["open", e.code, ""]
except Exception as e:
    out = ["closed", 0, repr(e)]
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Outcome:
    reached: bool
    status: int
    detail: str


@dataclass
class Deployment:
    m: Mission
    client: KubeView  # the other namespace, where the client pod runs

    def probe(self, kind: str, target: str, body: dict[str, Any] | None = None) -> Outcome:
        out = self.client.kubectl(
            "-n",
            CLIENT_NS,
            "exec",
            CLIENT,
            "--",
            "python",
            "-c",
            _PROBE,
            kind,
            target,
            json.dumps(body) if body else "",
        )
        reached, status, detail = json.loads(out.stdout)
        return Outcome(reached == "open", int(status), str(detail))

    def pod_ip(self, role: str) -> str:
        [pod] = self.m.pods(role)
        return str(pod["status"]["podIP"])

    def side_channel(self) -> int:
        epd = self.m.kube.get(EPD_API, "EPDDeployment", NAME)
        assert epd is not None
        return int(epd["spec"]["kvTransfer"]["nixl"]["sideChannelPort"])


def _client_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": CLIENT, "namespace": CLIENT_NS, "labels": {"app": "netpol-client"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "client",
                    "image": operator_image(),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                }
            ],
        },
    }


def _example_under_our_name() -> str:
    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    for doc in docs:
        if doc["kind"] == "EPDDeployment":
            doc["metadata"]["name"] = NAME
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def deployment(shared_mission: Mission) -> Iterator[Deployment]:
    m = dataclasses.replace(shared_mission, name=NAME)
    client = KubeView(m.cluster, CLIENT_NS, m.kube.kubeconfig)
    m.kube.kubectl("apply", "-f", "-", input=_example_under_our_name())
    m.kube.kubectl("create", "namespace", CLIENT_NS)
    try:
        client.create(_client_pod())
        started = time.monotonic()
        wait_for(lambda: all_ready(m, ROLES), 900, lambda: describe(m), interval=2)
        wait_for(lambda: is_ready(client.get("v1", "Pod", CLIENT)), 120, "the client pod did not start", interval=1)
        print(f"E/P/D with NetworkPolicies Ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        yield Deployment(m, client)
    finally:
        m.kube.kubectl("delete", "namespace", CLIENT_NS, "--wait=false", check=False)
        remove(m, NAME)


def test_the_policies_are_applied_and_the_engine_enforces_them(deployment: Deployment):
    policies = deployment.m.kube.list("networking.k8s.io/v1", "NetworkPolicy")
    assert {p["metadata"]["name"] for p in policies} == {f"{NAME}-backends", f"{NAME}-router"}
    assert network_policy_engine.synced(deployment.m.cluster.real_node())


def test_from_another_namespace_the_vllm_ports_and_the_side_channel_are_closed(deployment: Deployment):
    for role in ("encoder", "decode"):
        outcome = deployment.probe("http", f"http://{deployment.pod_ip(role)}:{VLLM_PORT}/health")
        assert not outcome.reached, f"{role}'s vLLM port answered a pod of another namespace: {outcome}"
    for role in ("prefill", "decode"):
        outcome = deployment.probe("tcp", f"{deployment.pod_ip(role)}:{deployment.side_channel()}")
        assert not outcome.reached, f"{role}'s NIXL side channel took a connection from another namespace"


@dataclass
class _PodsEPD:
    """The E/P/D deployment as `dev.kv_transfer` reads one: port-forwards to prefill's and decode's
    own /metrics (through the kubelet, not the pod network) and their logs."""

    m: Mission
    urls: dict[str, str]
    logs: Path

    def url(self, role: str) -> str:
        return self.urls[role]

    def log_path(self, role: str) -> Path:
        [pod] = self.m.pods(role)
        out = self.m.kube.kubectl("-n", self.m.kube.ns, "logs", pod["metadata"]["name"], "-c", "vllm")
        path = self.logs / f"{role}.log"
        path.write_text(out.stdout)
        return path


def test_through_the_router_service_a_chat_answers_and_moves_kv_over_nixl(deployment: Deployment, tmp_path: Path):
    from dev import kv_transfer

    m = deployment.m
    with contextlib.ExitStack() as stack:
        urls = {}
        for role in ("prefill", "decode"):
            [pod] = m.pods(role)
            port = stack.enter_context(port_forward(m, f"pod/{pod['metadata']['name']}"))
            urls[role] = f"http://127.0.0.1:{port}"
        running = _PodsEPD(m, urls, tmp_path)
        before = kv_transfer.read(running)
        url = f"http://{NAME}.{m.kube.ns}.svc:{VLLM_PORT}/v1/chat/completions"
        outcome = deployment.probe("http", url, chat_body(SERVED, "Prefill here, decode there.", MAX_TOKENS))
        moved = kv_transfer.read(running).since(before)
    assert outcome.reached and outcome.status == 200, outcome
    assert json.loads(outcome.detail)["usage"]["completion_tokens"] == MAX_TOKENS
    assert not moved.problems(), moved.line()
    assert moved.transfers >= 1, moved.line()
    print(f"E/P/D over NIXL with NetworkPolicies: {moved.line()}", file=sys.stderr)


def test_turned_off_the_direct_requests_answer_again(deployment: Deployment):
    m = deployment.m
    m.kube.ok(
        "PATCH",
        f"/apis/{EPD_API}/namespaces/{m.kube.ns}/epddeployments/{NAME}",
        {"spec": {"networkPolicy": {"enabled": False}}},
    )
    wait_for(
        lambda: not m.kube.list("networking.k8s.io/v1", "NetworkPolicy"),
        120,
        lambda: (
            f"policies left: {[p['metadata']['name'] for p in m.kube.list('networking.k8s.io/v1', 'NetworkPolicy')]}"
        ),
        interval=1,
    )
    targets = [("http", f"http://{deployment.pod_ip(role)}:{VLLM_PORT}/health") for role in ("encoder", "decode")]
    targets += [("tcp", f"{deployment.pod_ip(role)}:{deployment.side_channel()}") for role in ("prefill", "decode")]

    def all_open() -> bool:
        return all(deployment.probe(kind, target).reached for kind, target in targets)

    # the engine follows the deletions through its watch: a few seconds
    wait_for(all_open, 60, lambda: f"still closed: {[(t, deployment.probe(k, t)) for k, t in targets]}", interval=2)
    assert deployment.probe("http", targets[1][1]).status == 200
