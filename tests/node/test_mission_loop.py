"""The mission on real pods: `helm install` the operator chart, `kubectl apply` the CPU example,
and chat with an image through the router Service, as a user would on the local cluster.

Everything runs on the real node from locally built images: the operator (from its chart, under its
ServiceAccount), the router it renders, and vLLM 0.32 for CPU (`localhost/epd-vllm-cpu:0.32.0`) in
the encoder and prefill+decode pods, which mount the tiny model from the node's model cache and
share the encoder cache through an RWX hostPath volume (`examples/epd-local-cpu.yaml`, unchanged).
The tests share one deployment: probes pass, a request with an image answers through `kubectl
port-forward` and through the Service's ClusterIP from a client pod, vLLM's own metrics show the
encoder encoded the image once, the faults that restart no vLLM pod cost what their rows of the fault
table allow (tests/support/fault_table.py, under load, with the router tier scaled to two), a change
to one tier rolls only that tier, and deleting the EPDDeployment removes every pod. Then the E/P/D
variant (examples/epd-local-cpu-nixl.yaml) moves the KV cache between pods over NIXL, and its rendered
NetworkPolicies, enforced by the node's engine, hold against a pod of another namespace: a direct
request to the encoder's and decode's vLLM port and a connection to the NIXL side channel fail, a pod
carrying the encoder tier's labels is refused at prefill's and decode's vLLM port and at prefill's side
channel, a chat through the router Service answers and moves its KV over NIXL (UCX on the ports the
policies name), with `egressTo` naming only the API server the deployment's pods still resolve names
through CoreDNS (port 1053 behind the Service's 53) and reach the API server while an unlisted pod is
refused, a real gateway (Traefik running as a pod, dev/parts/gateway.py) accepts the rendered HTTPRoute and
answers an image request and a stream through its address as the router Service does, with `routerFrom`
naming the gateway's pods a pod beside the gateway is refused by the router while the gateway is
answered, a Prometheus pod of another namespace (tests/support/scraper.py) scrapes the router and every
vLLM pod through the scraper rule and cannot without it, and with
`spec.networkPolicy.enabled: false` the direct requests answer again. Each test asks a fixture for the state it needs
(the example applied and settled, the E+PD answer it compares with), so any test runs alone or in any
order; in file order each state is already there when the next test asks for it.
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

from dev.builds.images import VLLM_CPU_IMAGE, operator_image
from dev.local.client import chat_body, image_part, text_part
from dev.parts import gateway, kube_router
from epd_operator.render.router_args import ROUTER_METRICS_PORT, ROUTER_PORT
from tests.support import scraper
from tests.support.cluster import EPD_API, KubeView, wait_for
from tests.support.fault_checks import check
from tests.support.fault_table import QUICK_REPLICAS, QUICK_ROWS, SECOND, FaultRecord, run_recorded
from tests.support.mission import Mission, remove
from tests.support.mission import all_ready as _allis_ready
from tests.support.mission import describe as _describe
from tests.support.mission import port_forward as _port_forward
from tests.support.real_node import is_ready, unavailable

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "epd-local-cpu.yaml"
NIXL_EXAMPLE = REPO / "examples" / "epd-local-cpu-nixl.yaml"
NS, NAME, SERVED = "epd-local", "tiny-vl", "tiny-vl"
PD_NAME = "tiny-vl-pd"  # the E/P/D variant's EPDDeployment
VLLM_PORT = 8000
MAX_TOKENS = 4
ROLES = ("encoder", "decode", "router")
PD_ROLES = ("encoder", "prefill", "decode", "router")
CLIENT_NS, CLIENT = "netpol-client", "client"  # a pod of another namespace, for the NetworkPolicy tests
CLIENT_PORT = 8081  # where the client pod answers HTTP (an egress destination the policies do not list)
IMPOSTOR = "encoder-impostor"  # a pod of the deployment's namespace carrying the encoder tier's labels
BESIDE_GATEWAY = "beside-gateway"  # a pod in the gateway's namespace that is not the gateway


pytestmark = [
    pytest.mark.timeout(1500),  # the first run builds the images (minutes) and starts vLLM on two cores
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


@dataclass
class Example:
    """examples/epd-local-cpu.yaml on the shared cluster, as this module's tests need it."""

    m: Mission
    applied: list[str] = dataclasses.field(default_factory=list)  # each `kubectl apply`'s output, in order
    # Greedy answers of the E+PD deployment by image seed; the E/P/D one must give the same.
    answers: dict[int, list[int]] = dataclasses.field(default_factory=dict)

    def settled(self) -> bool:
        """Ready on its current spec, one pod per tier, none on its way out or still starting."""
        pods = self.m.kube.pods(**{"app.kubernetes.io/instance": NAME})
        return (
            _allis_ready(self.m)
            and all(len(self.m.pods(role)) == 1 for role in ROLES)
            and all(is_ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods)
        )

    def deployed(self) -> Mission:
        """The example as shipped applied (a no-op when it is), and settled on it, alone on the node."""
        if self.m.kube.get(EPD_API, "EPDDeployment", PD_NAME) is not None:
            remove(self.m, PD_NAME)
        started = time.monotonic()
        out = self.m.kube.kubectl("apply", "-f", str(EXAMPLE)).stdout
        self.applied.append(out)
        wait_for(self.settled, 900, lambda: _describe(self.m), interval=2)
        if f"epddeployment.serving.epd.dev/{NAME} unchanged" not in out:
            print(f"EPDDeployment settled {time.monotonic() - started:.0f} s after kubectl apply", file=sys.stderr)
        return self.m

    def e_p_d(self) -> Mission:
        """examples/epd-local-cpu-nixl.yaml applied as shipped (a no-op when it is) and Ready, alone on
        the node: the E+PD example is removed first."""
        if self.m.kube.get(EPD_API, "EPDDeployment", NAME) is not None:
            remove(self.m, NAME)
        m = dataclasses.replace(self.m, name=PD_NAME)
        started = time.monotonic()
        out = m.kube.kubectl("apply", "-f", str(NIXL_EXAMPLE)).stdout
        self.applied.append(out)
        wait_for(lambda: _allis_ready(m, PD_ROLES), 900, lambda: _describe(m), interval=2)
        if f"epddeployment.serving.epd.dev/{PD_NAME} unchanged" not in out:
            print(f"E/P/D Ready {time.monotonic() - started:.0f} s after kubectl apply", file=sys.stderr)
        return m

    def present(self) -> Mission:
        """The example's EPDDeployment, in whatever state the tests before left it (applied when absent)."""
        if self.m.kube.get(EPD_API, "EPDDeployment", NAME) is None:
            return self.deployed()
        return self.m


@pytest.fixture(scope="module")
def example(shared_mission: Mission) -> Iterator[Example]:
    m = dataclasses.replace(shared_mission, name=NAME)
    remove(m, NAME, PD_NAME)  # the module starts from nothing of its own
    yield Example(m)
    m.kube.kubectl("delete", "namespace", CLIENT_NS, "--ignore-not-found", "--wait=false", check=False)
    remove(m, NAME, PD_NAME)  # whatever a failed test left


@pytest.fixture
def mission(example: Example) -> Mission:
    """The example applied and settled."""
    return example.deployed()


def test_the_example_applies_and_its_vllm_pods_pass_their_probes(mission: Mission, example: Example):
    # An apply of the module created it (the module starts with no EPDDeployment of its own; whichever test ran
    # first applied it, and the E/P/D variant's tests may have removed and applied it again).
    assert any(f"epddeployment.serving.epd.dev/{NAME} created" in out for out in example.applied), example.applied

    for role in ("encoder", "decode"):
        [pod] = mission.pods(role)
        assert pod["spec"]["nodeName"] == "cpu-node-1"
        [vllm] = [c for c in pod["status"]["containerStatuses"] if c["name"] == "vllm"]
        assert vllm["image"].endswith(VLLM_CPU_IMAGE.split("/", 1)[1]), vllm["image"]
        assert vllm["restartCount"] == 0, f"{role}: the liveness probe or the process failed: {vllm}"
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(container), "the rendered probes ran"
    [router] = mission.pods("router")
    assert router["spec"]["containers"][0]["image"] == operator_image()


def _chat_body(seed: int) -> dict[str, Any]:
    return chat_body(SERVED, [text_part("Describe the image."), image_part(seed)], MAX_TOKENS)


def test_a_chat_with_an_image_through_kubectl_port_forward_is_encoded_once(mission: Mission, example: Example):
    from dev.local.client import chat

    encoded = mission.metric("encoder", "vllm:request_success_total")
    answered = mission.metric("decode", "vllm:request_success_total")
    reused = mission.metric("router", "epd_router_items_total", port=9090, outcome="reused")
    with _port_forward(mission) as port:
        first = chat(f"http://127.0.0.1:{port}", _chat_body(1))
        assert first.ok, f"through port-forward: {first}"
        assert first.completion_tokens == MAX_TOKENS
        example.answers[1] = first.token_ids
        assert mission.metric("encoder", "vllm:request_success_total") == encoded + 1, "the encoder encoded the image"

        again = chat(f"http://127.0.0.1:{port}", _chat_body(1))
        assert again.ok, f"the repeat: {again}"
    assert mission.metric("encoder", "vllm:request_success_total") == encoded + 1, "the repeat was not re-encoded"
    assert mission.metric("decode", "vllm:request_success_total") == answered + 2
    assert mission.metric("router", "epd_router_items_total", port=9090, outcome="reused") == reused + 1


def test_a_chat_through_the_cluster_ip_from_a_client_pod(mission: Mission):
    service = mission.kube.get("v1", "Service", NAME)
    assert service is not None
    url = f"http://{service['spec']['clusterIP']}:8000/v1/chat/completions"
    script = (
        "import json, os, urllib.request\n"
        "body = open('/request/body.json', 'rb').read()\n"
        "req = urllib.request.Request(os.environ['URL'], data=body, headers={'Content-Type': 'application/json'})\n"
        "r = urllib.request.urlopen(req, timeout=120)\n"
        "print(r.status, json.loads(r.read())['usage']['completion_tokens'])\n"
    )
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "chat-client", "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "client",
                    "image": operator_image(),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", script],
                    "env": [{"name": "URL", "value": url}],
                    "volumeMounts": [{"name": "request", "mountPath": "/request"}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
            "volumes": [{"name": "request", "configMap": {"name": "chat-request"}}],
        },
    }
    request = {"body.json": json.dumps(_chat_body(2))}  # a data URL is too long for an env var or argument
    for kind, name in (("pod", "chat-client"), ("configmap", "chat-request")):  # what a failed run left
        mission.kube.kubectl("-n", NS, "delete", kind, name, "--ignore-not-found", "--wait=true")
    mission.kube.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chat-request"}, "data": request}
    )
    encoded = mission.metric("encoder", "vllm:request_success_total")
    mission.kube.create(client)
    pod = wait_for(
        lambda: (
            (p := mission.kube.get("v1", "Pod", "chat-client"))
            and p["status"].get("phase") in ("Succeeded", "Failed")
            and p
        ),
        300,
        lambda: f"the client pod did not finish: {mission.kube.get('v1', 'Pod', 'chat-client')}",
        interval=1,
    )
    logs = mission.kube.kubectl("-n", NS, "logs", "chat-client", check=False)
    assert pod["status"]["phase"] == "Succeeded", logs.stdout + logs.stderr
    assert logs.stdout.split() == ["200", str(MAX_TOKENS)]
    assert mission.metric("encoder", "vllm:request_success_total") == encoded + 1
    mission.kube.delete("v1", "Pod", "chat-client")
    mission.kube.delete("v1", "ConfigMap", "chat-request")


def _uids(m: Mission) -> dict[str, set[str]]:
    return {role: {p["metadata"]["uid"] for p in m.pods(role)} for role in ("encoder", "decode", "router")}


@dataclass
class QuickFaults:
    record: FaultRecord
    vllm_before: dict[str, set[str]]
    vllm_after: dict[str, set[str]]


@pytest.fixture(scope="module")
def quick_faults(example: Example, tmp_path_factory: pytest.TempPathFactory) -> QuickFaults:
    """The fault rows that restart no vLLM pod, on this deployment: the example applied again with two
    routers (only the router tier changes), the rows one after another under load, then the example as
    shipped again (one router) for the tests after them."""
    mission = example.deployed()
    before = _uids(mission)
    try:
        record = run_recorded(
            mission,
            tmp_path_factory.mktemp("faults-quick"),
            lambda line: print(line, file=sys.stderr),
            QUICK_ROWS,
            QUICK_REPLICAS,
        )
    finally:
        remove(mission, SECOND)  # whatever a failed row left
        example.deployed()
    after = _uids(mission)
    return QuickFaults(
        record,
        {role: before[role] for role in ("encoder", "decode")},
        {role: after[role] for role in ("encoder", "decode")},
    )


@pytest.mark.parametrize("name", QUICK_ROWS)
def test_a_fault_that_restarts_no_vllm_pod_costs_what_its_row_allows(quick_faults: QuickFaults, name: str):
    check(quick_faults.record, name)


def test_the_fault_rows_ran_on_this_deployments_vllm_pods_and_left_them_serving(quick_faults: QuickFaults):
    assert quick_faults.vllm_after == quick_faults.vllm_before, "the faults or the router change replaced a vLLM pod"


def test_a_change_of_one_tier_rolls_only_that_tier(mission: Mission):
    before = _uids(mission)
    doc = next(d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d["kind"] == "EPDDeployment")
    env = [*doc["spec"]["encoder"]["env"], {"name": "EPD_LOCAL_ROLLOUT", "value": "1"}]
    mission.kube.ok(
        "PATCH",
        f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/{NAME}",
        {"spec": {"encoder": {"env": env}}},
    )

    def rolled() -> bool:
        now = _uids(mission)
        encoders = mission.pods("encoder")
        return bool(now["encoder"]) and not (now["encoder"] & before["encoder"]) and all(is_ready(p) for p in encoders)

    wait_for(rolled, 600, lambda: _describe(mission), interval=2)
    wait_for(lambda: _allis_ready(mission), 300, lambda: _describe(mission), interval=2)
    after = _uids(mission)
    assert after["decode"] == before["decode"], "the decode tier was not rolled"
    assert after["router"] == before["router"], "the router was not rolled"
    # The new encoder serves: a new image is encoded by it.
    encoded = mission.metric("encoder", "vllm:request_success_total")
    [router] = mission.pods("router")
    status, text = mission.in_node(f"http://{router['status']['podIP']}:8000/v1/chat/completions", _chat_body(3))
    assert status == 200, text[:500]
    assert mission.metric("encoder", "vllm:request_success_total") == encoded + 1


def test_deleting_the_epddeployment_removes_every_pod(example: Example):
    mission = example.present()
    mission.kube.kubectl("-n", NS, "delete", "epddeployment", NAME, "--wait=false")
    wait_for(
        lambda: not mission.kube.pods(**{"app.kubernetes.io/instance": NAME}),
        300,
        lambda: f"pods left: {[p['metadata']['name'] for p in mission.kube.pods()]}",
        interval=2,
    )


@dataclass
class _PodsEPD:
    """A running E/P/D deployment as `dev.local.kv_transfer` reads one: each tier's URL (a port-forward to its
    one pod) and its log (`kubectl logs`)."""

    m: Mission
    urls: dict[str, str]
    logs: Path

    def url(self, role: str) -> str:
        return self.urls[role]

    def log_path(self, role: str) -> Path:
        [pod] = self.m.pods(role)
        out = self.m.kube.kubectl("-n", NS, "logs", pod["metadata"]["name"], "-c", "vllm")
        path = self.logs / f"{role}.log"
        path.write_text(out.stdout)
        return path


@pytest.fixture
def e_pd_answer(example: Example) -> list[int]:
    """The E+PD deployment's greedy answer for image 1 (the port-forward test's, else asked for here)."""
    from dev.local.client import chat

    if 1 not in example.answers:
        with _port_forward(example.deployed()) as port:
            reply = chat(f"http://127.0.0.1:{port}", _chat_body(1))
        assert reply.ok, reply
        example.answers[1] = reply.token_ids
    return example.answers[1]


@contextlib.contextmanager
def _kv_counters(mission: Mission, logs: Path) -> Iterator[_PodsEPD]:
    """Prefill's and decode's own /metrics and logs (port-forwards through the kubelet, not the pod
    network), as `dev.local.kv_transfer` reads them."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for role in ("prefill", "decode"):
            [pod] = mission.pods(role)
            port = stack.enter_context(_port_forward(mission, f"pod/{pod['metadata']['name']}"))
            urls[role] = f"http://127.0.0.1:{port}"
        yield _PodsEPD(mission, urls, logs)


def test_the_e_p_d_variant_moves_the_kv_cache_between_pods_over_nixl(
    example: Example, e_pd_answer: list[int], tmp_path: Path
):
    """examples/epd-local-cpu-nixl.yaml: prefill and decode in separate pods, the KV cache read by
    decode from prefill with NIXL (UCX over TCP) through the rendered side channel (the pod's IP),
    unchanged; vLLM's own counters say every transfer succeeded and no lease expired, and the greedy
    answer equals the E+PD deployment's for the same image."""
    from dev.local import kv_transfer
    from dev.local.client import chat

    mission = example.e_p_d()
    for role in ("prefill", "decode"):
        [pod] = mission.pods(role)
        [vllm] = [c for c in pod["spec"]["containers"] if c["name"] == "vllm"]
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)" and env["UCX_TLS"] == "tcp"
    with _kv_counters(mission, tmp_path) as running, _port_forward(mission) as router:
        before = kv_transfer.read(running)
        reply = chat(f"http://127.0.0.1:{router}", _chat_body(1))
        assert reply.ok, reply
        text = chat(f"http://127.0.0.1:{router}", chat_body(SERVED, "Prefill here, decode there.", MAX_TOKENS))
        assert text.ok, text
        moved = kv_transfer.read(running).since(before)
    assert not moved.problems(), moved.line()
    assert moved.transfers >= 2, moved.line()
    assert reply.token_ids == e_pd_answer, "E/P/D over NIXL answers as E+PD does (greedy, same image)"
    print(f"E/P/D over NIXL between pods: {moved.line()}", file=sys.stderr)


# The rendered NetworkPolicies on the E/P/D variant (on by default), enforced by the node's engine
# (kube-router's firewall, dev/parts/kube_router.py), seen from a pod of another namespace.

# Run in the client pod: one TCP connection or HTTP request, its outcome as JSON on stdout.
_PROBE = """
import json, socket, sys, urllib.error, urllib.request
kind, target, body = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if kind == "dns":
        out = ["open", 0, sorted({a[4][0] for a in socket.getaddrinfo(target, 443, proto=socket.IPPROTO_TCP)})[0]]
    elif kind == "tcp":
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
class Policed:
    """The E/P/D variant with its policies on, and a client pod in another namespace."""

    m: Mission
    client: KubeView

    def probe(
        self, kind: str, target: str, body: dict[str, Any] | None = None, *, source: tuple[str, str, str] | None = None
    ) -> Outcome:
        """`_PROBE` run in the client pod, or in `source` (namespace, pod, container)."""
        ns, pod, container = source or (CLIENT_NS, CLIENT, "client")
        argv = ["-n", ns, "exec", pod, "-c", container, "--", "python", "-c", _PROBE, kind, target]
        out = self.client.kubectl(*argv, json.dumps(body) if body else "")
        reached, status, detail = json.loads(out.stdout)
        return Outcome(reached == "open", int(status), str(detail))

    def router(self) -> tuple[str, str, str]:
        """The router pod as a probe's source."""
        [pod] = self.m.pods("router")
        return NS, pod["metadata"]["name"], pod["spec"]["containers"][0]["name"]

    def patch(self, spec: dict[str, Any]) -> None:
        self.m.kube.ok("PATCH", f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/{PD_NAME}", {"spec": spec})

    def pod_ip(self, role: str) -> str:
        [pod] = self.m.pods(role)
        return str(pod["status"]["podIP"])

    def side_channel(self) -> int:
        epd = self.m.kube.get(EPD_API, "EPDDeployment", PD_NAME)
        assert epd is not None
        return int(epd["spec"]["kvTransfer"]["nixl"]["sideChannelPort"])

    def policies(self) -> set[str]:
        return {p["metadata"]["name"] for p in self.m.kube.list("networking.k8s.io/v1", "NetworkPolicy")}


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
                    "command": ["python", "-m", "http.server", str(CLIENT_PORT), "--directory", "/tmp"],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                }
            ],
        },
    }


needs_engine = pytest.mark.skipif(
    not kube_router.KUBE_ROUTER.built(),
    reason="kube-router is not built: make k8s-node (or python -m dev.parts build kube-router)",
)


@pytest.fixture
def policed(example: Example) -> Policed:
    """The E/P/D variant Ready with `spec.networkPolicy` as shipped (unset: on), its two policies
    applied and the engine synced, and the client pod running."""
    m = example.e_p_d()
    client = KubeView(m.cluster, CLIENT_NS, m.kube.kubeconfig)
    deployed = Policed(m, client)
    deployed.patch({"networkPolicy": None})  # what a test turning the policies off or narrowing egress left
    if m.kube.get("v1", "Namespace", CLIENT_NS) is None:
        m.kube.kubectl("create", "namespace", CLIENT_NS)
    if client.get("v1", "Pod", CLIENT) is None:
        client.create(_client_pod())
    wanted = {f"{PD_NAME}-{suffix}" for suffix in ("backends", "router", "prefill-transfer", "decode-transfer")}

    def as_shipped() -> bool:
        listed = m.kube.list("networking.k8s.io/v1", "NetworkPolicy")
        return {p["metadata"]["name"] for p in listed} == wanted and all("egress" not in p["spec"] for p in listed)

    wait_for(as_shipped, 60, lambda: f"policies: {deployed.policies()}", interval=1)
    wait_for(lambda: is_ready(client.get("v1", "Pod", CLIENT)), 120, "the client pod did not start", interval=1)
    wait_for(lambda: kube_router.synced(m.cluster.real_node()), 60, "the engine did not sync", interval=1)
    return deployed


@needs_engine
def test_from_another_namespace_the_vllm_ports_and_the_side_channel_are_closed(policed: Policed):
    for role in ("encoder", "decode"):
        outcome = policed.probe("http", f"http://{policed.pod_ip(role)}:{VLLM_PORT}/health")
        assert not outcome.reached, f"{role}'s vLLM port answered a pod of another namespace: {outcome}"
    for role in ("prefill", "decode"):
        outcome = policed.probe("tcp", f"{policed.pod_ip(role)}:{policed.side_channel()}")
        assert not outcome.reached, f"{role}'s NIXL side channel took a connection from another namespace"


@needs_engine
def test_with_the_policies_on_the_router_service_answers_and_kv_moves_over_nixl(policed: Policed, tmp_path: Path):
    from dev.local import kv_transfer

    m = policed.m
    with _kv_counters(m, tmp_path) as running:
        before = kv_transfer.read(running)
        url = f"http://{PD_NAME}.{NS}.svc:{VLLM_PORT}/v1/chat/completions"
        outcome = policed.probe("http", url, chat_body(SERVED, "Policies on, KV moving.", MAX_TOKENS))
        moved = kv_transfer.read(running).since(before)
    assert outcome.reached and outcome.status == 200, outcome
    assert json.loads(outcome.detail)["usage"]["completion_tokens"] == MAX_TOKENS
    assert not moved.problems(), moved.line()
    assert moved.transfers >= 1, moved.line()


def _impostor_pod() -> dict[str, Any]:
    """A pod of the deployment's namespace with the encoder tier's labels (what a compromised encoder
    looks like to the policies). Never Ready (its readiness probe fails), so the encoder Service and
    the router never count it."""
    pod = _client_pod()
    pod["metadata"] = {
        "name": IMPOSTOR,
        "namespace": NS,
        "labels": {"app.kubernetes.io/instance": PD_NAME, "serving.epd.dev/role": "encoder"},
    }
    pod["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["false"]}, "periodSeconds": 60}
    return pod


@needs_engine
def test_a_pod_with_the_encoders_labels_reaches_neither_prefills_nor_decodes_api(policed: Policed):
    """The backends reach each other only on their transfers' ports: an encoder pod (the one parsing
    untrusted media) cannot call prefill's or decode's vLLM API, nor prefill's NIXL side channel, which
    only decode dials. Decode's side channel and the UCX ports are probed by the KV transfer itself
    (the test above and below: KV moves with these policies on)."""
    m = policed.m
    m.kube.kubectl("-n", NS, "delete", "pod", IMPOSTOR, "--ignore-not-found", "--wait=true")
    m.kube.create(_impostor_pod())
    try:
        wait_for(
            lambda: (p := m.kube.get("v1", "Pod", IMPOSTOR)) is not None and p["status"].get("phase") == "Running",
            120,
            "the impostor pod did not start",
            interval=1,
        )
        source = (NS, IMPOSTOR, "client")
        for role in ("prefill", "decode"):
            outcome = policed.probe("http", f"http://{policed.pod_ip(role)}:{VLLM_PORT}/health", source=source)
            assert not outcome.reached, f"{role}'s vLLM API answered a pod with the encoder's labels: {outcome}"
        outcome = policed.probe("tcp", f"{policed.pod_ip('prefill')}:{policed.side_channel()}", source=source)
        assert not outcome.reached, "prefill's NIXL side channel took a connection from the encoder's labels"
        # The router, by contrast, is admitted to the API port (so the refusals are the policy's).
        outcome = policed.probe(
            "http", f"http://{policed.pod_ip('decode')}:{VLLM_PORT}/health", source=policed.router()
        )
        assert outcome.reached and outcome.status == 200, outcome
    finally:
        m.kube.kubectl("-n", NS, "delete", "pod", IMPOSTOR, "--ignore-not-found", "--wait=false")


@needs_engine
def test_narrowed_egress_resolves_names_reaches_the_api_server_and_refuses_the_unlisted(policed: Policed):
    """`egressTo` naming only the API server (its endpoint: the node's address and the API server's
    port, what the `kubernetes` Service translates to): the router still resolves names through CoreDNS
    (whose pods listen on 1053 behind the Service's 53) and reaches the API server it watches, the chat
    through the router Service still answers, and a pod the policies do not list is refused; before the
    narrowing that same pod answered (so the refusal is the policy's)."""
    m = policed.m
    client_ip = str((policed.client.get("v1", "Pod", CLIENT) or {})["status"]["podIP"])
    unlisted = f"http://{client_ip}:{CLIENT_PORT}/"
    wait_for(lambda: policed.probe("http", unlisted, source=policed.router()).reached, 60, "the client never answered")
    node = m.cluster.real_node()
    service = m.cluster.request("GET", "/api/v1/namespaces/default/services/kubernetes")
    policed.patch({"networkPolicy": {"egressTo": [{"cidr": f"{node.spec.node_ip}/32", "ports": [node.api_port]}]}})
    try:

        def narrowed() -> bool:
            listed = m.kube.list("networking.k8s.io/v1", "NetworkPolicy")
            return bool(listed) and all("Egress" in p["spec"]["policyTypes"] for p in listed)

        wait_for(narrowed, 60, lambda: f"policies: {policed.policies()}", interval=1)
        wait_for(lambda: kube_router.synced(node), 60, "the engine did not sync", interval=1)
        wait_for(
            lambda: not policed.probe("http", unlisted, source=policed.router()).reached,
            60,
            "the unlisted pod still answered the router with egress narrowed",
            interval=2,
        )
        resolved = policed.probe("dns", "kubernetes.default.svc.cluster.local", source=policed.router())
        assert resolved.reached and resolved.detail == service["spec"]["clusterIP"], resolved
        api = policed.probe("tcp", f"{service['spec']['clusterIP']}:443", source=policed.router())
        assert api.reached, f"the router could not reach the API server it watches: {api}"
        url = f"http://{PD_NAME}.{NS}.svc:{VLLM_PORT}/v1/chat/completions"
        chat = policed.probe("http", url, chat_body(SERVED, "Egress narrowed.", MAX_TOKENS))
        assert chat.reached and chat.status == 200, chat
    finally:
        policed.patch({"networkPolicy": None})


@pytest.fixture
def through_gateway(policed: Policed) -> tuple[Policed, str]:
    """Traefik running as the cluster's gateway, the E/P/D variant's HTTPRoute attached to its Gateway
    and accepted by it; the Gateway's address."""
    m = policed.m
    m.cluster.start_part("gateway")
    address = gateway.address(m.cluster)
    policed.patch({"router": {"gateway": {"parentRefs": [gateway.parent_ref()]}}})
    wanted = {"Accepted": "True", "ResolvedRefs": "True"}
    wait_for(lambda: wanted.items() <= _route_conditions(m).items(), 120, lambda: str(_route(m)))
    # Traefik reports the route before its router takes it (its configuration is applied after a
    # throttle): until then the Gateway answers its own 404. Until kube-proxy has the Service's new
    # endpoint, its address refuses connections. The router answers /v1/models.
    wait_for(lambda: _answers(m, f"{address}/v1/models"), 60, lambda: f"the Gateway at {address} did not answer")
    return policed, address


def _answers(m: Mission, url: str) -> bool:
    try:
        return m.in_node(url, timeout=10)[0] == 200
    except AssertionError:  # refused or timed out
        return False


def _route(m: Mission) -> dict[str, Any] | None:
    return m.kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", PD_NAME)


def _route_conditions(m: Mission) -> dict[str, str]:
    """The route's conditions as Traefik (by its controllerName) set them for the Gateway."""
    route = _route(m) or {}
    for parent in (route.get("status") or {}).get("parents") or []:
        if parent.get("controllerName") == gateway.CONTROLLER and parent["parentRef"]["name"] == gateway.GATEWAY:
            return {c["type"]: c["status"] for c in parent.get("conditions") or []}
    return {}


@needs_engine
def test_the_gateway_accepts_the_rendered_route_and_answers_an_image_request(through_gateway: tuple[Policed, str]):
    policed, address = through_gateway
    route = _route(policed.m)
    assert route is not None and route["spec"]["parentRefs"][0]["name"] == gateway.GATEWAY
    status, text = policed.m.in_node(f"{address}/v1/chat/completions", _chat_body(4))
    assert status == 200, text[:500]
    assert json.loads(text)["usage"]["completion_tokens"] == MAX_TOKENS


def _stream_meaning(raw: bytes) -> dict[str, Any]:
    """What a streamed chat answer says, event by event joined: vLLM decides where one chunk ends
    (tokens that arrive together share one), so two generations of the same greedy answer may split
    it differently; the tokens, the text, the end and the framing are the answer."""
    events = [e for e in raw.decode().split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), events[:3]
    assert events[-1] == "data: [DONE]", events[-3:]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    choices = [c["choices"][0] for c in chunks if c.get("choices")]
    return {
        "objects": {c["object"] for c in chunks},
        "model": {c["model"] for c in chunks},
        "tokens": [t for choice in choices for t in choice.get("token_ids") or []],
        "text": "".join(choice["delta"].get("content") or "" for choice in choices),
        "finish": [choice["finish_reason"] for choice in choices if choice.get("finish_reason")],
    }


@needs_engine
def test_a_stream_through_the_gateway_is_the_router_services_stream(through_gateway: tuple[Policed, str]):
    """The same streamed request (same x-request-id, greedy, caches warm) through the Gateway's address
    and through the router Service: the same events, framed the same, with the same tokens and text (how
    vLLM groups tokens into chunks follows its own timing, not the path the request took)."""
    policed, address = through_gateway
    m = policed.m
    body = chat_body(SERVED, [text_part("Stream it."), image_part(5)], MAX_TOKENS, stream=True)
    service = m.kube.get("v1", "Service", PD_NAME)
    assert service is not None
    direct_url = f"http://{service['spec']['clusterIP']}:{VLLM_PORT}/v1/chat/completions"
    # A first request warms the caches (the image's embedding, prefill's prefix cache): a greedy answer
    # computed from cached KV may differ from a cold one in a near-tie of the random weights, so the two
    # compared requests both find them warm.
    warm, text = m.in_node(direct_url, body)
    assert warm == 200, text[:500]
    streams = {}
    for where, url in (("router Service", direct_url), ("gateway", f"{address}/v1/chat/completions")):
        status, text = m.in_node(url, body, headers={"X-Request-Id": "gateway-stream"})
        assert status == 200, (where, text[:500])
        streams[where] = _stream_meaning(text.encode())
    direct, gatewayed = streams["router Service"], streams["gateway"]
    assert len(direct["tokens"]) == MAX_TOKENS and direct["finish"] == ["length"], direct
    assert gatewayed == direct


def _pod_beside_the_gateway() -> dict[str, Any]:
    """A pod in the gateway's namespace that is not one of its pods (another label)."""
    pod = _client_pod()
    pod["metadata"] = {"name": BESIDE_GATEWAY, "namespace": gateway.NAMESPACE, "labels": {"app": BESIDE_GATEWAY}}
    return pod


def _router_policy_admits_only_named_peers(m: Mission) -> bool:
    policy = m.kube.get("networking.k8s.io/v1", "NetworkPolicy", f"{PD_NAME}-router") or {"spec": {}}
    api_rules = [
        r for r in policy["spec"].get("ingress") or [] if {"port": ROUTER_PORT, "protocol": "TCP"} in r["ports"]
    ]
    return bool(api_rules) and all("from" in r for r in api_rules)


@needs_engine
def test_with_router_from_naming_the_gateways_pods_only_the_gateway_reaches_the_router(
    through_gateway: tuple[Policed, str],
):
    """`spec.networkPolicy.routerFrom` naming Traefik's pods (their namespace and labels, as
    examples/epd-behind-gateway.yaml names Envoy Gateway's): a pod beside the gateway, in its namespace,
    is refused at the router's port and a chat through the Gateway's address is answered; before the
    narrowing that same pod reached the router (so the refusal is the policy's)."""
    policed, address = through_gateway
    m = policed.m
    beside = KubeView(m.cluster, gateway.NAMESPACE, m.kube.kubeconfig)
    if beside.get("v1", "Pod", BESIDE_GATEWAY) is None:
        beside.create(_pod_beside_the_gateway())
    wait_for(lambda: is_ready(beside.get("v1", "Pod", BESIDE_GATEWAY)), 120, "the pod beside the gateway did not start")
    source = (gateway.NAMESPACE, BESIDE_GATEWAY, "client")
    router_url = f"http://{policed.pod_ip('router')}:{ROUTER_PORT}/v1/models"
    wait_for(lambda: policed.probe("http", router_url, source=source).reached, 60, "the router never answered")
    only_gateway = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": gateway.NAMESPACE}},
        "podSelector": {"matchLabels": gateway.LABELS},
    }
    policed.patch({"networkPolicy": {"routerFrom": [only_gateway]}})
    try:
        wait_for(lambda: _router_policy_admits_only_named_peers(m), 60, lambda: f"policies: {policed.policies()}")
        wait_for(lambda: kube_router.synced(m.cluster.real_node()), 60, "the engine did not sync", interval=1)
        wait_for(
            lambda: not policed.probe("http", router_url, source=source).reached,
            60,
            "the pod beside the gateway still reached the router with routerFrom naming the gateway's pods",
            interval=2,
        )
        assert not policed.probe("http", router_url).reached, "a pod of another namespace reached the router"
        status, text = m.in_node(f"{address}/v1/chat/completions", _chat_body(6))
        assert status == 200, text[:500]
        assert json.loads(text)["usage"]["completion_tokens"] == MAX_TOKENS
    finally:
        policed.patch({"networkPolicy": None})
        beside.kubectl("-n", gateway.NAMESPACE, "delete", "pod", BESIDE_GATEWAY, "--ignore-not-found", "--wait=false")


def _scraped(m: Mission, prometheus_ip: str) -> dict[str, float]:
    url = f"http://{prometheus_ip}:{scraper.PORT}/api/v1/query?query=up"
    status, text = m.in_node(url, timeout=10)
    return scraper.up_by_role(json.loads(text)) if status == 200 else {}


@needs_engine
def test_a_prometheus_pod_admitted_by_the_scraper_rule_scrapes_the_router_and_vllm_and_without_it_cannot(
    policed: Policed,
):
    """A Prometheus running as a pod in a namespace of its own, labelled as the Prometheus Operator labels
    its pods (what the default `spec.networkPolicy.scrapers` admits), scrapes the router's metrics port
    and each vLLM pod's API port (vLLM's `/metrics`); with `scrapers: []` a new Prometheus pod's every
    scrape fails."""
    from dev.builds.images import build_prometheus, prometheus_image

    m = policed.m
    m.cluster.real_node().load_image(build_prometheus())
    targets = {"router": f"{policed.pod_ip('router')}:{ROUTER_METRICS_PORT}"}
    targets |= {role: f"{policed.pod_ip(role)}:{VLLM_PORT}" for role in ("encoder", "prefill", "decode")}
    view = KubeView(m.cluster, scraper.NAMESPACE, m.kube.kubeconfig)
    if view.get("v1", "Pod", scraper.NAME) is not None:  # an earlier run's, scraping other pods' addresses
        view.kubectl("-n", scraper.NAMESPACE, "delete", "pod", scraper.NAME, "--wait=true")
    for obj in scraper.objects(prometheus_image(), targets):
        m.cluster.apply(obj)
    try:
        wait_for(
            lambda: is_ready(view.get("v1", "Pod", scraper.NAME)),
            120,
            lambda: f"the Prometheus pod was not Ready: {(view.get('v1', 'Pod', scraper.NAME) or {}).get('status')}",
        )
        ip = str((view.get("v1", "Pod", scraper.NAME) or {})["status"]["podIP"])
        every = dict.fromkeys(targets, 1.0)
        wait_for(lambda: _scraped(m, ip) == every, 60, lambda: f"up by role: {_scraped(m, ip)}", interval=1)
        policed.patch({"networkPolicy": {"scrapers": []}})
        wait_for(lambda: len(_backend_ingress(m)) == 1, 60, lambda: f"policies: {policed.policies()}", interval=1)
        wait_for(lambda: kube_router.synced(m.cluster.real_node()), 60, "the engine did not sync", interval=1)
        # A policy judges new connections: the engine lets established ones go on (conntrack), and
        # Prometheus keeps its scrapes' connections alive. A new Prometheus pod opens new ones.
        view.kubectl("-n", scraper.NAMESPACE, "delete", "pod", scraper.NAME, "--wait=true")
        m.cluster.apply(scraper.objects(prometheus_image(), targets)[-1])
        wait_for(lambda: is_ready(view.get("v1", "Pod", scraper.NAME)), 120, "the new Prometheus pod was not Ready")
        ip = str((view.get("v1", "Pod", scraper.NAME) or {})["status"]["podIP"])
        none = dict.fromkeys(targets, 0.0)
        wait_for(lambda: _scraped(m, ip) == none, 60, lambda: f"up by role: {_scraped(m, ip)}", interval=1)
    finally:
        policed.patch({"networkPolicy": None})
        view.kubectl("-n", scraper.NAMESPACE, "delete", "pod", scraper.NAME, "--ignore-not-found", "--wait=false")


def _backend_ingress(m: Mission) -> list[dict[str, Any]]:
    policy = m.kube.get("networking.k8s.io/v1", "NetworkPolicy", f"{PD_NAME}-backends") or {"spec": {}}
    return list(policy["spec"].get("ingress") or [])


@needs_engine
def test_with_the_policies_turned_off_the_direct_requests_answer_again(policed: Policed):
    """So the refusals above were the engine's, not a pod that was down."""
    m = policed.m
    m.kube.ok(
        "PATCH",
        f"/apis/{EPD_API}/namespaces/{NS}/epddeployments/{PD_NAME}",
        {"spec": {"networkPolicy": {"enabled": False}}},
    )
    wait_for(lambda: not policed.policies(), 120, lambda: f"policies left: {policed.policies()}", interval=1)
    targets = [("http", f"http://{policed.pod_ip(role)}:{VLLM_PORT}/health") for role in ("encoder", "decode")]
    targets += [("tcp", f"{policed.pod_ip(role)}:{policed.side_channel()}") for role in ("prefill", "decode")]

    def all_open() -> bool:
        return all(policed.probe(kind, target).reached for kind, target in targets)

    # the engine follows the deletions through its watch: a few seconds
    wait_for(all_open, 60, lambda: f"still closed: {[(t, policed.probe(k, t)) for k, t in targets]}", interval=2)
    assert policed.probe("http", targets[1][1]).status == 200
