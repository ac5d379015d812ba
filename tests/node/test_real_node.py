"""The local cluster's real node (``dev/node/real_node.py``): a kubelet, containerd, runc, CNI and
kube-proxy that run pods for real beside the fake GPU nodes, without changing this machine.

Needs root, the Debian packages runc, containerd and containernetworking-plugins, and the kubelet
and kube-proxy (built with the control plane on first use); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.builds.images import ECHO_IMAGE, VLLM_STUB_IMAGE, build_echo, build_vllm_stub
from dev.cluster.local import ClusterError, LocalCluster, RealNodeSpec
from dev.node import cgroups
from dev.node.kube_config import KUBELET_SYSCTLS, REAL_NODE_LABEL, read_sysctls
from epd_operator.api.labels import INSTANCE_LABEL, ROLE_LABEL
from tests.support.cluster import KubeView, new_namespace, wait_for
from tests.support.real_node import InstalledOperator, install_operator_chart, is_ready, unavailable

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


def host_state() -> dict[str, Any]:
    """What a node must never change on this machine: kernel settings, interfaces, iptables rules."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    return {
        "sysctls": read_sysctls(),
        "links": sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines()),
        "rules": sorted(line for line in rules.splitlines() if line.startswith("-A")),
    }


@pytest.fixture(scope="module")
def machine_before() -> dict[str, Any]:
    return host_state()


@pytest.fixture(scope="module")
def real_k8s(tmp_path_factory: pytest.TempPathFactory, machine_before: dict[str, Any]) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("real"), real_nodes=(RealNodeSpec(),)) as cluster:
        cluster.real_node().load_image(build_echo())
        yield cluster


@pytest.fixture
def node_ns(real_k8s: LocalCluster, tmp_path: Path) -> Iterator[KubeView]:
    view = new_namespace(real_k8s, tmp_path, prefix="rn")
    yield view
    view.request("DELETE", f"/api/v1/namespaces/{view.ns}")


def echo_pod(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "echo", **labels}},
        "spec": {
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "echo",
                    "image": ECHO_IMAGE,
                    "imagePullPolicy": "Never",
                    "ports": [{"containerPort": 8080, "name": "http"}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 1},
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def ready(kube: KubeView, name: str) -> dict[str, Any] | None:
    pod = kube.get("v1", "Pod", name)
    return pod if is_ready(pod) else None


def get_in_node(cluster: LocalCluster, url: str) -> dict[str, Any]:
    """An HTTP GET from inside the node's network namespace (the only place pods answer)."""
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
    out = subprocess.run(
        cluster.real_node().netns_argv(sys.executable, "-c", code), capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_the_real_node_registers_beside_the_fake_gpu_nodes(real_k8s: LocalCluster, node_ns: KubeView):
    node = node_ns.get("v1", "Node", "cpu-node-1")
    assert node is not None
    assert node["metadata"]["labels"][REAL_NODE_LABEL] == "true"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert node["status"]["nodeInfo"]["kubeletVersion"] == real_k8s.version
    assert not node["spec"].get("taints")
    # The fake GPU nodes take GPU pods only.
    fake = node_ns.get("v1", "Node", real_k8s.nodes[0].name)
    assert (
        fake is not None
        and {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in fake["spec"]["taints"]
    )


def test_a_pod_runs_passes_its_probe_and_answers_through_its_service(real_k8s: LocalCluster, node_ns: KubeView):
    node_ns.create(echo_pod("echo-1"))
    node_ns.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": "http"}]},
        }
    )
    pod = wait_for(
        lambda: ready(node_ns, "echo-1"), 120, lambda: f"echo-1 not ready: {node_ns.get('v1', 'Pod', 'echo-1')}"
    )
    assert pod["spec"]["nodeName"] == "cpu-node-1"
    assert pod["status"]["podIP"].startswith("10.245.0.")
    assert get_in_node(real_k8s, f"http://{pod['status']['podIP']}:8080/direct")["hostname"] == "echo-1"
    cluster_ip = node_ns.get("v1", "Service", "echo")["spec"]["clusterIP"]  # type: ignore[index]
    answer = wait_for(lambda: _try(lambda: get_in_node(real_k8s, f"http://{cluster_ip}/via-service")), 60)
    assert answer["hostname"] == "echo-1" and answer["path"] == "/via-service"
    # The API server reaches the kubelet (logs) through the node bridge.
    logs = node_ns.kubectl("logs", "echo-1")
    assert "echo-server echo-1 listening on :8080" in logs.stderr + logs.stdout


def _try(fn: Any) -> Any:
    try:
        return fn()
    except AssertionError:
        return None


def test_the_kubelet_sees_the_kernel_settings_it_wants_and_the_machine_keeps_its_own(
    real_k8s: LocalCluster, machine_before: dict[str, Any], node_ns: KubeView
):
    # A pod of its own, whatever ran before: its containers, interface and rules are what must stay in the node.
    node_ns.create(echo_pod("echo-host"))
    wait_for(lambda: ready(node_ns, "echo-host"), 120, lambda: f"not ready: {node_ns.get('v1', 'Pod', 'echo-host')}")
    node = real_k8s.real_node()
    inside = subprocess.run(
        [*node.enter_argv(), "cat", *(f"/proc/sys/{k}" for k in KUBELET_SYSCTLS)], capture_output=True, text=True
    )
    assert inside.stdout.split() == list(KUBELET_SYSCTLS.values())
    assert read_sysctls() == machine_before["sysctls"]
    now = host_state()
    assert not {"cni0"} & set(now["links"]) and not [n for n in now["links"] if n.startswith("veth")]
    assert not [r for r in now["rules"] if "KUBE-" in r or "10.245." in r or "CNI-" in r]
    # The kubelet's links to container logs stay in the node's own /var/log.
    containers = node.ctr("containers", "list", "--quiet").stdout.split()
    assert containers, "the node runs containers"
    host_logs = os.listdir("/var/log/containers") if os.path.isdir("/var/log/containers") else []
    assert not [name for name in host_logs if any(c in name for c in containers)]


STARTER = """
import json, sys, time
from dev.cluster.local import ClusterError, LocalCluster, RealNodeSpec
from dev.builds.images import build_echo
c = LocalCluster(__import__("pathlib").Path(sys.argv[1]), real_nodes=(RealNodeSpec(),), nodes=())
c.start()
node = c.real_node()
node.load_image(build_echo())
c.kubectl("run", "echo", "--image", "localhost/epd-echo:dev", "--image-pull-policy", "Never",
          "--overrides", '{"spec": {"nodeSelector": {"epd.dev/real-node": "true"}}}')
while "Running" not in c.kubectl("get", "pod", "echo", "-o", "jsonpath={.status.phase}", check=False).stdout:
    time.sleep(0.5)
print(json.dumps({"dir": str(node.dir), "cgroup": node.cgroup, "holder": node._holder.process.pid,
                  "netns": __import__("os").readlink(node.netns), "root": str(node.containerd_root),
                  "lock": str(node.slot.lock) if node.slot else None}), flush=True)
time.sleep(600)
"""


def test_a_crashed_owner_leaves_no_process_mount_namespace_cgroup_or_interface(
    machine_before: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
):
    # The cluster's own folder (etcd's data, logs) is pytest's to remove; the node's folder is the reaper's.
    workdir = tmp_path_factory.mktemp("crash")
    owner = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(workdir)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    try:
        line = owner.stdout.readline()  # type: ignore[union-attr]
        assert line, "the cluster with a real node did not start"
        started = json.loads(line)
        node_cgroups = [m / started["cgroup"].lstrip("/") for m in cgroups.hierarchies()]
        in_node = cgroups.pids(node_cgroups)
        assert len(in_node) >= 4  # holder, containerd, kubelet, kube-proxy, a shim, the pod's processes
        owner.send_signal(signal.SIGKILL)  # no clean-up code of the owner runs
        owner.wait(10)

        def gone() -> bool:
            return not any(cg.exists() for cg in node_cgroups) and not Path(started["dir"]).exists()

        wait_for(gone, 60, lambda: f"left behind: {[c for c in node_cgroups if c.exists()]}, {started['dir']}")
        assert not [p for p in in_node if _alive(p)]
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        assert not [m for m in mounts if started["dir"] in m or started["root"] in m]
        # The image store's slot (a cache, like the image archives) stays; its lock went with the node's
        # processes (another cluster may take it at once: only this owner's lock is looked for).
        if started["lock"] is not None:
            wait_for(lambda: not _flock_held_by(owner.pid, Path(started["lock"])), 30, "the slot's lock is still held")
        namespaces = set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    namespaces.add(os.readlink(proc / "ns" / "net"))
        assert started["netns"] not in namespaces
        now = host_state()
        assert now["sysctls"] == machine_before["sysctls"]
        assert "cni0" not in now["links"]
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()  # type: ignore[union-attr]


def _flock_held_by(pid: int, path: Path) -> bool:
    """Whether a flock taken by ``pid`` on ``path`` is still held (by it or by a process it handed it to)."""
    st = path.stat()
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "FLOCK" in fields and str(pid) in fields and where in fields:
            return True
    return False


def _alive(pid: int) -> bool:
    """Running (a zombie waits for a parent that may never reap it: it runs nothing)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


# Run by a client pod (the operator image's Python, glibc's resolver as users' clients have it): the
# pod's resolv.conf, then for each name either the echo server's answer through it or how the
# lookup failed, and how long it took (printed by the test).
DNS_CLIENT = """
import json, socket, sys, time, urllib.request
out = {"resolv.conf": open("/etc/resolv.conf").read(), "names": {}}
for name in sys.argv[1:]:
    started = time.monotonic()
    try:
        answer = json.load(urllib.request.urlopen(f"http://{name}/by-name", timeout=5))
        out["names"][name] = {"hostname": answer["hostname"]}
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        out["names"][name] = {"error": type(reason).__name__, "errno": getattr(reason, "errno", None)}
    out["names"][name]["seconds"] = round(time.monotonic() - started, 3)
print(json.dumps(out))
"""


def test_pods_resolve_services_by_name_through_the_cluster_dns(
    real_k8s: LocalCluster, node_ns: KubeView, loaded_operator_image: str
):
    """CoreDNS on the node answers for `<svc>`, `<svc>.<ns>`, `<svc>.<ns>.svc` and the full name (the
        forms rendered objects and users' clients use), through the `kube-dns` Service the kubelet
        writes into pods' resolv.conf; a name that does not exist fails as such (NXDOMAIN, not a lost query that
    times out); each lookup's time is printed."""
    from dev.parts.coredns import NAMESPACE, SERVICE

    dns_service = node_ns.get("v1", "Service", SERVICE, namespace=NAMESPACE)
    assert dns_service is not None and dns_service["spec"]["clusterIP"] == "10.96.0.10"
    node_ns.create(echo_pod("echo-dns"))
    node_ns.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo-by-name"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": "http"}]},
        }
    )
    wait_for(
        lambda: ready(node_ns, "echo-dns"), 120, lambda: f"echo-dns not ready: {node_ns.get('v1', 'Pod', 'echo-dns')}"
    )
    ns = node_ns.ns
    found = ["echo-by-name", f"echo-by-name.{ns}", f"echo-by-name.{ns}.svc", f"echo-by-name.{ns}.svc.cluster.local"]
    missing = ["no-such-service", f"no-such-service.{ns}.svc.cluster.local", "example.com"]
    node_ns.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "dns-client"},
            "spec": {
                "nodeSelector": {REAL_NODE_LABEL: "true"},
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "client",
                        "image": loaded_operator_image,
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", DNS_CLIENT, *found, *missing],
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                    }
                ],
            },
        }
    )

    def finished() -> dict[str, Any] | None:
        pod = node_ns.get("v1", "Pod", "dns-client")
        return pod if (pod or {}).get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    pod = wait_for(finished, 120, lambda: f"dns-client did not finish: {node_ns.get('v1', 'Pod', 'dns-client')}")
    logs = node_ns.kubectl("logs", "dns-client").stdout
    assert pod["status"]["phase"] == "Succeeded", logs
    report = json.loads(logs.strip().splitlines()[-1])
    resolv = report["resolv.conf"].split("\n")
    assert "nameserver 10.96.0.10" in resolv
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in resolv
    assert "options ndots:5" in resolv
    names = report["names"]
    for name in found:
        assert names[name].get("hostname") == "echo-dns", (name, names[name])
    for name in missing:
        # EAI_NONAME: the name does not exist (a lost query would be EAI_AGAIN after resolv.conf's 5 s timeout).
        assert names[name]["error"] == "gaierror" and names[name]["errno"] == socket.EAI_NONAME, (name, names[name])
    print(
        "lookups: " + ", ".join(f"{name} {names[name]['seconds']:.3f} s" for name in [*found, *missing]),
        file=sys.stderr,
    )


def test_a_missing_image_archive_is_named(real_k8s: LocalCluster, tmp_path: Path):
    with pytest.raises(ClusterError, match=r"no image archive at .*missing\.tar: build it with `make images`"):
        real_k8s.real_node().load_image(tmp_path / "missing.tar")


@pytest.fixture(scope="module")
def loaded_operator_image(real_k8s: LocalCluster) -> str:
    """The operator image (the router's too, and a Python for client pods), loaded into the node
    once per module: the import takes a minute."""
    from dev.builds.images import build_operator, operator_image

    real_k8s.real_node().load_image(build_operator())
    return operator_image()


@pytest.fixture(scope="module")
def operator_chart(
    real_k8s: LocalCluster, loaded_operator_image: str, tmp_path_factory: pytest.TempPathFactory
) -> InstalledOperator:
    """The operator installed from its chart, once per module."""
    return install_operator_chart(real_k8s, tmp_path_factory.mktemp("system"), load_image=False)


@pytest.fixture
def workload(real_k8s: LocalCluster, tmp_path: Path) -> Iterator[KubeView]:
    view = new_namespace(real_k8s, tmp_path, prefix="rn-op")
    yield view
    view.request("DELETE", f"/api/v1/namespaces/{view.ns}")


def test_the_operator_chart_runs_the_operator_from_the_local_image_under_its_service_account(
    operator_chart: InstalledOperator, workload: KubeView
):
    """The operator reaches the API server through the `kubernetes` Service with its own token,
    reconciles an EPDDeployment, and the router it renders (the same image) runs on the node."""
    from dev.builds.images import operator_image
    from tests.support.cluster import volumes
    from tests.support.epd_specs import minimal

    pod = operator_chart.pod
    assert pod["spec"]["nodeName"] == "cpu-node-1"
    assert pod["spec"]["serviceAccountName"] == "epd-operator"
    assert pod["spec"]["containers"][0]["image"] == operator_image()

    volumes(workload, "ec-cache")
    doc = minimal()
    doc["metadata"]["namespace"] = workload.ns
    workload.create(doc)

    def reconciled() -> dict[str, Any] | None:
        got = workload.get("serving.epd.dev/v1alpha1", "EPDDeployment", "qwen-vl")
        return got if (got or {}).get("status", {}).get("conditions") else None

    wait_for(reconciled, 120, lambda: f"no status from the in-cluster operator: {operator_chart.logs()}")
    routers = lambda: [  # noqa: E731
        p
        for p in workload.pods()
        if p["spec"].get("nodeName") == "cpu-node-1" and p["status"].get("phase") == "Running"
    ]
    router = wait_for(routers, 180, lambda: f"no router running on the real node: {workload.pods()}")[0]
    assert router["spec"]["containers"][0]["image"] == operator_image()


MISSING_IMAGE = "localhost/epd-missing:never"  # no registry answers on the node: the pull fails at once
EXEC_ERROR = 'exec: "vllm": executable file not found in $PATH'  # the echo image has no vllm to run


def failing_encoder(name: str, namespace: str, encoder_image: str) -> dict[str, Any]:
    """E+PD whose encoder cannot run `encoder_image`; decode runs the vLLM stub (ready on its port),
    so the router, which needs a decode instance, can be ready. No claim (CPU EC connector)."""
    from tests.support.epd_specs import minimal

    doc = minimal()
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["ecTransfer"] = {"connector": "CPU", "cpu": {"bytes": "64Mi"}}
    doc["spec"]["encoder"] = {"image": encoder_image}
    doc["spec"]["decode"] = {"image": VLLM_STUB_IMAGE}
    # One small router: the node's CPU holds the routers of both EPDDeployments beside the operator.
    doc["spec"]["router"] = {"replicas": 1, "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}}}
    return doc


def test_pods_the_kubelet_cannot_run_are_named_in_their_tiers_status_once_and_the_other_tiers_stay_ready(
    real_k8s: LocalCluster, operator_chart: InstalledOperator, workload: KubeView
):
    """An encoder image that does not exist (ErrImagePull) and one without the command the tier
    runs (CrashLoopBackOff): each EPDDeployment's status and one Warning Event name the kubelet's
    reason and words; decode and the router become ready; the kubelet's retry loops post nothing more."""
    real_k8s.real_node().load_image(build_vllm_stub())
    workload.create(failing_encoder("no-image", workload.ns, MISSING_IMAGE))
    workload.create(failing_encoder("no-start", workload.ns, ECHO_IMAGE))

    def status(name: str) -> dict[str, Any]:
        got = workload.get("serving.epd.dev/v1alpha1", "EPDDeployment", name) or {}
        return dict(got.get("status") or {})

    def explained() -> bool:
        return all(
            status(name).get("tiers", {}).get("encoder", {}).get("reason") == reason
            and all(status(name).get("tiers", {}).get(t, {}).get("ready") == "1/1" for t in ("decode", "router"))
            for name, reason in (("no-image", "ErrImagePull"), ("no-start", "CrashLoopBackOff"))
        )

    wait_for(
        explained,
        240,
        lambda: (
            f"no-image: {status('no-image')}\nno-start: {status('no-start')}\npods: "
            f"{[(p['metadata']['name'], p['status'].get('containerStatuses')) for p in workload.pods()]}\n"
            f"operator: {operator_chart.logs()}"
        ),
        interval=1,
    )
    for name, reason, words in (
        ("no-image", "ErrImagePull", MISSING_IMAGE),
        ("no-start", "CrashLoopBackOff", EXEC_ERROR),
    ):
        st = status(name)
        encoder = st["tiers"]["encoder"]
        assert encoder["message"].startswith(f"pod {name}-encoder-") and words in encoder["message"], encoder
        assert all("reason" not in st["tiers"][t] for t in ("decode", "router")), st["tiers"]
        ready = next(c for c in st["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "PodsFailing"), ready
        assert ready["message"].startswith(f"not ready: encoder 0/1; encoder {reason}: pod {name}-encoder-"), ready
        assert st["phase"] == "Progressing"

    # Let the kubelet go round both loops again (a second pull, a second start) ...
    def kubelet_retried() -> bool:
        pods = {
            p["metadata"]["labels"][INSTANCE_LABEL]: p
            for p in workload.pods()
            if p["metadata"]["labels"].get(ROLE_LABEL) == "encoder"
        }
        restarts = max((c.get("restartCount", 0) for c in pods["no-start"]["status"]["containerStatuses"]), default=0)
        pulls = sum(
            e.get("count", 1)
            for e in workload.events(kind="Pod", name=pods["no-image"]["metadata"]["name"])
            if e["reason"] == "Failed" and MISSING_IMAGE in e["message"] and "Failed to pull" in e["message"]
        )
        return restarts >= 2 and pulls >= 2

    wait_for(kubelet_retried, 120, lambda: f"the kubelet did not retry: {workload.pods()}", interval=1)
    # ... and the operator has said each reason once.
    for name, reason, words in (
        ("no-image", "ErrImagePull", MISSING_IMAGE),
        ("no-start", "CrashLoopBackOff", EXEC_ERROR),
    ):
        warnings = [
            (e["reason"], e["message"], e.get("count", 1))
            for e in workload.events(kind="EPDDeployment", name=name)
            if e["type"] == "Warning"
        ]
        assert len(warnings) == 1, warnings
        [(said, message, count)] = warnings
        assert (said, count) == (reason, 1) and message.startswith(f"encoder {reason}: pod {name}-encoder-")
        assert words in message
        described = workload.kubectl("describe", "epd", name).stdout
        assert reason in described and words in described and "PodsFailing" in described


def test_a_kubelet_that_cannot_start_is_reported_in_its_own_words(tmp_path: Path):
    # This machine has cgroup v1; a kubelet told to refuse it exits at once and says why.
    refusing = RealNodeSpec(kubelet_config=(("failCgroupV1", True),))
    cluster = LocalCluster(tmp_path / "k8s", real_nodes=(refusing,), nodes=())
    with pytest.raises(ClusterError) as failed:
        cluster.__enter__()
    message = str(failed.value)
    assert "kubelet-cpu-node-1 exited" in message
    assert "cgroup v1" in message
