"""The mission on the local cluster's real node, as the node tier and the autoscaling benchmark drive it:
a LocalCluster with a real node, the operator image and vLLM for CPU loaded into it, the operator chart
`helm install`ed, and a :class:`Mission` to reach pods (their IPs answer only inside the node's network
namespace), read their own /metrics and wait for an EPDDeployment to be Ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dev.builds.images import build_vllm_cpu
from dev.cluster.local import LocalCluster, RealNodeSpec
from dev.lifetimes import kill_with_parent
from tests.support.cluster import EPD_API, KubeView, wait_for
from tests.support.real_node import install_operator_chart, is_ready

REPO = Path(__file__).resolve().parents[2]
NS = "epd-local"  # the namespace examples/epd-local-cpu*.yaml apply into


@dataclass
class Mission:
    cluster: LocalCluster
    kube: KubeView  # the example's namespace
    system: KubeView  # the operator's
    name: str = "tiny-vl"  # the EPDDeployment under test

    def in_node(
        self, url: str, body: dict[str, Any] | None = None, timeout: float = 120, headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """An HTTP request from inside the node's network namespace (where pod and Service IPs answer)."""
        code = (
            "import json,sys,urllib.request,urllib.error\n"
            "url, body, timeout, headers = json.loads(sys.stdin.read())\n"
            "data = json.dumps(body).encode() if body is not None else None\n"
            "req = urllib.request.Request(url, data=data, headers={'Content-Type': 'application/json', **headers})\n"
            "try:\n"
            "    r = urllib.request.urlopen(req, timeout=timeout); status, text = r.status, r.read().decode()\n"
            "except urllib.error.HTTPError as e:\n"
            "    status, text = e.code, e.read().decode()\n"
            "sys.stdout.write(json.dumps([status, text]))\n"
        )
        out = subprocess.run(
            self.cluster.real_node().netns_argv(sys.executable, "-c", code),
            input=json.dumps([url, body, timeout, headers or {}]),
            capture_output=True,
            text=True,
            timeout=timeout + 30,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        status, text = json.loads(out.stdout)
        return int(status), str(text)

    def pods(self, role: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.kube.pods(**{"app.kubernetes.io/instance": self.name, "serving.epd.dev/role": role})
            if not p["metadata"].get("deletionTimestamp")
        ]

    def pod_metric(self, pod: dict[str, Any], name: str, port: int = 8000, **labels: str) -> float:
        """The sum of one metric's samples (with these labels) in one pod's own /metrics."""
        from tests.support.prom import metric_value

        status, text = self.in_node(f"http://{pod['status']['podIP']}:{port}/metrics", timeout=10)
        assert status == 200, f"{pod['metadata']['name']} /metrics: {status} {text[:300]}"
        return metric_value(text, name, **labels)

    def metric(self, role: str, name: str, port: int = 8000, **labels: str) -> float:
        """The sum of one metric over a tier's pods, read from each pod's own /metrics."""
        return sum(self.pod_metric(pod, name, port, **labels) for pod in self.pods(role))


def describe(m: Mission) -> str:
    epd = m.kube.get(EPD_API, "EPDDeployment", m.name) or {}
    pods = [
        (
            p["metadata"]["name"],
            p["status"].get("phase"),
            [c.get("state") for c in p["status"].get("containerStatuses") or []],
        )
        for p in m.kube.pods()
    ]
    return f"status: {json.dumps(epd.get('status'), indent=1)[:3000]}\npods: {pods}"


def all_ready(m: Mission, roles: tuple[str, ...] = ("encoder", "decode", "router")) -> bool:
    """The operator has reported on the EPDDeployment's current spec (its status and Ready condition
    of the current generation) that it is Ready, and each of these tiers has a Ready pod."""
    epd = m.kube.get(EPD_API, "EPDDeployment", m.name) or {}
    generation = epd.get("metadata", {}).get("generation")
    status = epd.get("status") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    current = generation is not None and status.get("observedGeneration") == generation
    pods = m.kube.pods(**{"app.kubernetes.io/instance": m.name})
    up = {p["metadata"]["labels"].get("serving.epd.dev/role") for p in pods if is_ready(p)}
    return (
        current and ready.get("status") == "True" and ready.get("observedGeneration") == generation and set(roles) <= up
    )


@contextlib.contextmanager
def port_forward(m: Mission, target: str | None = None) -> Iterator[int]:
    """`kubectl port-forward` to port 8000 of a pod, or of the router Service; yields the local port."""
    argv = [str(m.cluster.kubectl_path), "--kubeconfig", str(m.kube.kubeconfig), "-n", m.kube.ns]
    with subprocess.Popen(
        [*argv, "port-forward", target or f"svc/{m.name}", ":8000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            found = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert found, f"kubectl port-forward said {line!r}: {proc.stderr.read() if proc.poll() is not None else ''}"
            yield int(found.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.contextmanager
def mission_cluster(tmp: Path, name: str = "tiny-vl") -> Iterator[Mission]:
    """A cluster with a real node, vLLM for CPU loaded into it (built first when its archive is
    missing), the Gateway API CRDs (so the operator watches HTTPRoutes from its start; the gateway itself,
    `cluster.start_part("gateway")`, only for the tests that use it) and the operator chart installed and
    running (tests/support/real_node.py); stopped on exit."""
    from dev.builds import tiny_model
    from dev.parts import gateway

    vllm = build_vllm_cpu()
    tiny_model.ensure()
    with LocalCluster(tmp / "k8s", real_nodes=(RealNodeSpec(),)) as cluster:
        cluster.real_node().load_image(vllm)
        gateway.install_crds(cluster)
        installed = install_operator_chart(cluster, tmp)
        yield Mission(cluster, KubeView(cluster, NS, installed.system.kubeconfig), installed.system, name)


def remove(m: Mission, *names: str, timeout: float = 300) -> None:
    """Delete these EPDDeployments (those that exist) and wait until they and their pods are gone, so
    that the next test of the shared cluster may apply the same names."""
    for name in names:
        m.kube.kubectl("-n", m.kube.ns, "delete", "epddeployment", name, "--ignore-not-found", "--wait=false")

    def gone() -> bool:
        return all(
            m.kube.get(EPD_API, "EPDDeployment", name) is None
            and not m.kube.pods(**{"app.kubernetes.io/instance": name})
            for name in names
        )

    wait_for(gone, timeout, lambda: f"left: {[p['metadata']['name'] for p in m.kube.pods()]}", interval=2)


@contextlib.contextmanager
def load_clients(m: Mission, records: Path, log: Path, model: str = "tiny-vl") -> Iterator[subprocess.Popen[str]]:
    """tests/support/load_client.py in the node's network namespace, calling the router Service's
    ClusterIP for `model` (the examples' served model name); yields the process, whose stdin takes
    the phases. On exit it is told to stop and its clients finish the requests they are in (each is
    bounded by the client's timeout)."""
    service = m.kube.get("v1", "Service", m.name)
    assert service is not None
    url = f"http://{service['spec']['clusterIP']}:8000"
    argv = m.cluster.real_node().netns_argv(sys.executable, "-m", "tests.support.load_client", url, str(records), model)
    with log.open("wb") as out:
        client = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            preexec_fn=kill_with_parent,
        )
    try:
        yield client
    finally:
        assert client.stdin is not None
        with contextlib.suppress(OSError):
            client.stdin.write("stop\n")
            client.stdin.close()
        try:
            client.wait(timeout=330)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait()
