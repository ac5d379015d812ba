"""A real Kubernetes control plane on this machine: no Docker, no VM.

etcd + kube-apiserver (RBAC enforced, service-account tokens) + kube-controller-manager (deployment,
replicaset, endpointslice, garbage collector, HPA, ...) + kube-scheduler, all built from the official Go
modules by ``dev/builds/k8s-binaries.sh`` and cached in ``~/.cache/epd-operator/k8s/<version>/``, plus
kwok, SIG Scheduling's fake kubelet, for nodes with ``nvidia.com/gpu`` capacity on which pods are
scheduled for real and become Running/Ready (they run nothing: their IPs are for reading only).
With ``real_nodes``, real worker nodes join them (``dev/node/real_node.py``: containerd, runc, CNI, kubelet,
kube-proxy in namespaces of their own, and the cluster's DNS, ``dev/parts/cluster_dns.py``) and run pods for
real; the fake GPU nodes then carry the ``nvidia.com/gpu`` NoSchedule taint, which pods asking for GPUs
tolerate (the ExtendedResourceToleration admission plugin, as on clouds' GPU pools), so only GPU pods
land on them.

    python -m dev.cluster.cli up [--detach]   # prints the kubeconfig path and how to stop (dev/cluster/cli.py)
    python -m dev.cluster.cli down

The tests use :class:`LocalCluster` directly (``tests/support/cluster.py``). Every process it starts
is tied to it: they get SIGKILL when the supervising Python process dies (``dev/lifetimes.py``), so
a crashed run leaves nothing listening.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from dev.builds.k8s_binaries import NEWEST, OLDEST, binaries, log
from dev.cluster.api import ClusterApi, ClusterError
from dev.cluster.fake_nodes import DEFAULT_NODES, FAKE_NODE_LABEL, GPU, FakeNode
from dev.cluster.pki import ADMIN_TOKEN_USER, kubeconfig, make_pki
from dev.lifetimes import die_with_parent
from dev.node.kube_config import CLUSTER_DNS_IP, CLUSTER_DOMAIN, REAL_NODE_LABEL, SERVICE_CIDR
from dev.node.real_node import RealNode, RealNodeSpec, unavailable
from dev.parts import kube_router, network_policy_engine
from dev.ports import free_port
from epd_operator.kube import ApiError

# What the tests and the benchmarks import from here.
__all__ = [
    "NEWEST",
    "OLDEST",
    "ClusterError",
    "FakeNode",
    "LocalCluster",
    "RealNode",
    "RealNodeSpec",
    "binaries",
]
# Fake GPU nodes beside a real node: only pods that ask for GPUs (and so tolerate this) land on them.
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}

# The controllers a test cluster needs; the rest (node lifecycle, cloud, certificates...) only slow it
# down or act on things that do not exist here.
CONTROLLERS = tuple(
    f"{name}-controller"
    for name in (
        "deployment",
        "replicaset",
        "endpointslice",
        "endpointslice-mirroring",
        "garbage-collector",
        "horizontal-pod-autoscaler",
        "namespace",
        "serviceaccount",
        "serviceaccount-token",
        "root-ca-certificate-publisher",
        "persistentvolume-binder",
        "persistentvolume-protection",
        "persistentvolumeclaim-protection",
        "disruption",
        "statefulset",
        "job",
        "pod-garbage-collector",
        "resourcequota",
        "clusterrole-aggregation",
        "node-lifecycle",
        "taint-eviction",
    )
)


@dataclasses.dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        out = self.log.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            env=env,
        )
        out.close()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise ClusterError(f"{self.name} exited with status {self.process.returncode}; its log ends:\n{tail}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


LWS_COMPONENT = "lws-controller-manager"
KEDA_OPERATOR, KEDA_METRICS_SERVER, KEDA_WEBHOOKS = "keda-operator", "keda-metrics-apiserver", "keda-admission-webhooks"


def components_network(real_nodes: Sequence[RealNode]) -> list[str]:
    """The prefix that runs a cluster-side component (one the API server calls as an aggregated API, or
    one that reads what pods serve) where it must listen: inside the real node's network namespace when
    the cluster has one, since the API server dials aggregated APIs there (its egress goes through the
    node bridge) and pod and Service IPs answer only there; else nothing (the host's loopback)."""
    return real_nodes[0].netns_argv() if real_nodes else []


class LocalCluster(ClusterApi):
    """Start, use and stop one local control plane. Use as a context manager."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        version: str = NEWEST,
        apiserver_only: bool = False,
        nodes: Sequence[FakeNode] = DEFAULT_NODES,
        real_nodes: Sequence[RealNodeSpec] = (),
        hpa_sync_seconds: float = 1.0,
        lws: bool = False,
        keda: bool = False,
    ):
        if len(real_nodes) > 1:
            raise ValueError("one real node at most: the API server reaches kubelets through one node bridge")
        self.version = version
        self.apiserver_only = apiserver_only
        self.real_node_specs = tuple(real_nodes)
        self.nodes = tuple(dataclasses.replace(n, taints=(*n.taints, GPU_TAINT)) if real_nodes else n for n in nodes)
        self.real_nodes: list[RealNode] = []
        self.hpa_sync_seconds = hpa_sync_seconds
        self.lws = lws  # run the LeaderWorkerSet controller (dev/parts/lws.py) with its CRDs and webhooks
        self.keda = keda  # run KEDA's operator and metrics server (dev/parts/keda.py) with its CRDs and APIService
        self._owned_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="epd-cluster-"))
        self.pki = self.dir / "pki"
        self.port = free_port()
        admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
        super().__init__(f"https://127.0.0.1:{self.port}", self.pki / "ca.crt", admin_token)
        self.kubeconfig_path = self.dir / "kubeconfig"
        self.components: list[Component] = []
        self.bin: Path | None = None

    # -------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        started = time.monotonic()
        if self.real_node_specs and (why := unavailable()) is not None:
            raise ClusterError(why)  # before anything starts
        self.bin = binaries(self.version, apiserver_only=self.apiserver_only, node=bool(self.real_node_specs))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.real_nodes = [self._real_node(spec) for spec in self.real_node_specs]
        make_pki(self.pki)
        (self.pki / "tokens.csv").write_text(f'{self.admin_token},{ADMIN_TOKEN_USER},epd-admin-uid,"system:masters"\n')
        self.kubeconfig_path.write_text(yaml.safe_dump(kubeconfig(self.server, self.pki / "ca.crt", self.admin_token)))
        self._start_etcd()
        self._start_apiserver()
        self._wait_ready("/readyz", "kube-apiserver", 180)
        if not self.apiserver_only:
            self._start_controllers()
            self.add_nodes(*self.nodes)
            self._wait_for_service_account("default", "default", 30)
            self._wait_for_schedulable_nodes((n.name for n in self.nodes), 30)
            for node in self.real_nodes:
                self._start_real_node(node)
            if self.lws:
                self.start_lws()
            if self.keda:
                self.start_keda()
        log(f"Kubernetes {self.version} ready in {time.monotonic() - started:.1f} s at {self.server}")

    def stop(self) -> None:
        self.close_api()
        for node in self.real_nodes:
            node.stop()
        for component in reversed(self.components):
            component.stop()
        self.components.clear()
        if self._owned_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def check_alive(self) -> None:
        for component in self.components:
            component.check_alive()
        for node in self.real_nodes:
            node.check_alive()

    def restart_control_plane(self, timeout: float = 180) -> float:
        """Stop kube-apiserver and etcd, start them again on the same data and flags (etcd first),
        and wait for /readyz; returns the seconds the API was unavailable. Everything else keeps
        running and must find its way back, as it would after a control-plane upgrade or crash."""
        by_name = {c.name: c for c in self.components}
        apiserver, etcd = by_name["kube-apiserver"], by_name["etcd"]
        stopped = time.monotonic()
        apiserver.stop()
        etcd.stop()
        etcd.start()
        apiserver.start()
        self._wait_ready("/readyz", "kube-apiserver", timeout)
        return time.monotonic() - stopped

    # -------------------------------------------------------------- real nodes

    def _real_node(self, spec: RealNodeSpec) -> RealNode:
        def start(name: str, argv: list[str]) -> Component:
            component = Component(name, argv, self.dir / f"{name}.log")
            component.start()
            return component

        assert self.bin is not None
        return RealNode(
            spec,
            workdir=self.dir / f"node-{spec.name}",
            api_port=self.port,
            ca_path=self.pki / "ca.crt",
            admin_token=self.admin_token,
            bin_dir=self.bin,
            start_component=start,
        )

    def _start_real_node(self, node: RealNode, timeout: float = 120) -> None:
        from dev.builds.images import build_coredns, build_pause

        node.start()
        node.load_image(build_pause())
        node.load_image(build_coredns())
        self.apply(node.api_endpoint_slice())
        node.start_kubelet()
        deadline = time.monotonic() + timeout
        while not self._node_ready(node.name):
            self.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"real node {node.name} was not Ready after {timeout:.0f} s; the kubelet says:\n"
                    + node.kubelet_log_errors()
                )
            time.sleep(0.5)
        self._wait_for_schedulable_nodes([node.name], 30)
        if kube_router.KUBE_ROUTER.built():
            network_policy_engine.start(node, SERVICE_CIDR)
        else:
            print(
                f"[cluster] real node {node.name}: NetworkPolicies are not enforced: kube-router is not built"
                " (make k8s-node, or python -m dev.parts.kube_router)",
                flush=True,
            )
        self._start_cluster_dns(node)

    def _start_cluster_dns(self, node: RealNode, timeout: float = 60) -> None:
        """CoreDNS on the real node; ready when the `kubernetes` Service's name resolves through the
        `kube-dns` Service from inside the node's network namespace, as a pod's lookup does."""
        from dev.builds.images import COREDNS_IMAGE
        from dev.parts.cluster_dns import objects

        started = time.monotonic()
        for obj in objects(COREDNS_IMAGE):
            self.apply(obj)
        probe = node.netns_argv(
            sys.executable, "-m", "dev.parts.cluster_dns", f"kubernetes.default.svc.{CLUSTER_DOMAIN}"
        )
        repo = Path(__file__).resolve().parents[2]
        deadline = started + timeout
        while True:
            answer = subprocess.run(probe, capture_output=True, text=True, cwd=repo, timeout=30)
            if answer.returncode == 0:
                break
            self.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the cluster's DNS did not answer in {timeout:.0f} s: {(answer.stdout + answer.stderr).strip()[-500:]}"
                )
            time.sleep(0.5)
        log(f"cluster DNS ({CLUSTER_DNS_IP}) answers, {time.monotonic() - started:.1f} s after the node was Ready")

    def _node_ready(self, name: str) -> bool:
        try:
            got = self.request("GET", f"/api/v1/nodes/{name}")
        except ApiError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in got["status"].get("conditions") or [])

    def real_node(self, name: str | None = None) -> RealNode:
        """The real node (by name when there could be several)."""
        for node in self.real_nodes:
            if name is None or node.name == name:
                return node
        raise ClusterError(f"no real node {name or ''} in this cluster")

    def _component(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Component:
        component = Component(name, argv, self.dir / f"{name}.log")
        component.start(env)
        self.components.append(component)
        return component

    def _exe(self, name: str) -> str:
        assert self.bin is not None
        return str(self.bin / name)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._component(
            "etcd",
            [
                self._exe("etcd"),
                "--data-dir",
                str(self.dir / "etcd"),
                "--name",
                "epd-local",
                "--listen-client-urls",
                self.etcd_url,
                "--advertise-client-urls",
                self.etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"epd-local=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
                "--quota-backend-bytes",
                str(2 << 30),
            ],
        )

    def _start_apiserver(self) -> None:
        p = self.pki
        self._component(
            "kube-apiserver",
            [
                self._exe("kube-apiserver"),
                "--etcd-servers",
                self.etcd_url,
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(self.port),
                "--advertise-address",
                "127.0.0.1",
                # Its endpoint reconciler refuses a loopback advertise address; nothing here needs the
                # `kubernetes` Service's endpoints.
                "--endpoint-reconciler-type",
                "none",
                "--tls-cert-file",
                str(p / "apiserver.crt"),
                "--tls-private-key-file",
                str(p / "apiserver.key"),
                "--client-ca-file",
                str(p / "ca.crt"),
                "--token-auth-file",
                str(p / "tokens.csv"),
                "--authorization-mode",
                "RBAC",
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file",
                str(p / "sa.pub"),
                "--service-account-signing-key-file",
                str(p / "sa.key"),
                "--api-audiences",
                "https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range",
                SERVICE_CIDR,
                "--allow-privileged=true",
                "--cert-dir",
                str(self.dir / "apiserver-certs"),
                "--storage-media-type",
                "application/json",
                *self._real_node_apiserver_flags(),
                "-v",
                "1",
            ],
        )

    def _real_node_apiserver_flags(self) -> list[str]:
        if not self.real_nodes:
            return []
        egress = self.dir / "egress-selector.yaml"
        egress.write_text(json.dumps(self.real_nodes[0].egress_config()))
        return [
            "--egress-selector-config-file",
            str(egress),
            "--enable-admission-plugins",
            "ExtendedResourceToleration",
            # The node bridge dials addresses inside the node's namespace; node names resolve nowhere.
            "--kubelet-preferred-address-types",
            "InternalIP",
        ]

    def _kubeconfig_for_components(self) -> Path:
        return self.kubeconfig_path

    def _start_controllers(self) -> None:
        kc = str(self._kubeconfig_for_components())
        self._component(
            "kube-controller-manager",
            [
                self._exe("kube-controller-manager"),
                *_component_flags(kc),
                "--controllers",
                ",".join(CONTROLLERS),
                "--service-account-private-key-file",
                str(self.pki / "sa.key"),
                "--root-ca-file",
                str(self.pki / "ca.crt"),
                "--use-service-account-credentials=false",
                "--horizontal-pod-autoscaler-sync-period",
                f"{self.hpa_sync_seconds}s",
                "--concurrent-deployment-syncs",
                "10",
                "--concurrent-replicaset-syncs",
                "10",
                "--cluster-signing-cert-file",
                str(self.pki / "ca.crt"),
                "--cluster-signing-key-file",
                str(self.pki / "ca.key"),
                "-v",
                "1",
            ],
        )
        self._component(
            "kube-scheduler",
            [
                self._exe("kube-scheduler"),
                *_component_flags(kc),
                "-v",
                "1",
            ],
        )
        self._component(
            "kwok",
            [
                self._exe("kwok"),
                "--kubeconfig",
                kc,
                "--manage-all-nodes=false",
                f"--manage-nodes-with-label-selector={FAKE_NODE_LABEL}=true",
                "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
                "--node-ip",
                "10.244.0.1",
                "--cidr",
                "10.244.0.0/16",
                "--node-lease-duration-seconds",
                "40",
                "--server-address",
                f"127.0.0.1:{free_port()}",
            ],
        )

    def start_lws(self, timeout: float = 60) -> None:
        """Run the LeaderWorkerSet controller (dev/parts/lws.py), with its CRDs and webhooks; once: a
        cluster started without it may start it later (a test that needs it, on a shared cluster)."""
        from dev.parts import lws

        if any(c.name == LWS_COMPONENT for c in self.components):
            return
        webhook, health = free_port(), free_port()
        argv = lws.prepare(self, self.pki, self.dir / "lws", webhook_port=webhook, health_port=health)
        self._component(LWS_COMPONENT, argv, env={**os.environ, "KUBECONFIG": str(self.kubeconfig_path)})
        lws.register_webhooks(self, self.pki, webhook_port=webhook, health_port=health, timeout=timeout)

    def start_keda(self, timeout: float = 120) -> None:
        """Run KEDA's operator, metrics server and admission webhooks (dev/parts/keda.py), with its CRDs, the
        gRPC link between the first two, the external metrics APIService and the ValidatingWebhookConfiguration;
        once, like :meth:`start_lws`. With a real node they run in its network namespace
        (:func:`components_network`): their Prometheus triggers then reach what listens there, a
        Prometheus scraping the pods."""
        from dev.parts import keda

        if any(c.name == KEDA_OPERATOR for c in self.components):
            return
        binaries = keda.binaries()
        certs = keda.prepare(self, self.pki, self.dir / "keda")
        ports = keda.Ports(
            grpc=free_port(),
            health=free_port(),
            api=free_port(),
            metrics=free_port(),
            webhooks=free_port(),
            webhooks_health=free_port(),
        )
        env = {**os.environ, **keda.environment(self.kubeconfig_path)}
        enter = components_network(self.real_nodes)
        argv = keda.processes(binaries, certs, self.kubeconfig_path, ports, enter)
        self._component(KEDA_OPERATOR, argv.operator, env=env)
        keda.wait_operator_ready(self, ports.health, timeout, enter)
        self._component(KEDA_METRICS_SERVER, argv.metrics_server, env=env)
        keda.register(self, self.pki, ports.api, timeout)
        self._component(KEDA_WEBHOOKS, argv.webhooks, env=env)
        keda.register_webhooks(self, self.pki, ports.webhooks, ports.webhooks_health, timeout, enter)

    def start_gateway(self, timeout: float = 120) -> str:
        """Run Traefik as the cluster's Gateway API gateway (dev/parts/gateway.py): its GatewayClass and Gateway,
        and Traefik as a Deployment on the real node behind its Service; once (again: nothing changes).
        Returns the Gateway's address (``http://<Service ClusterIP>:<port>``), which answers where pods do."""
        from dev.builds.images import build_traefik
        from dev.parts import gateway

        node = self.real_node()
        node.load_image(build_traefik())
        gateway.install_crds(self)
        for obj in gateway.objects():
            self.apply(obj)
        ip = self.request("GET", f"/api/v1/namespaces/{gateway.NAMESPACE}/services/{gateway.GATEWAY}")["spec"][
            "clusterIP"
        ]
        self.apply(gateway.deployment(ip, {REAL_NODE_LABEL: "true"}))
        path = f"/apis/apps/v1/namespaces/{gateway.NAMESPACE}/deployments/{gateway.NAME}"
        deadline = time.monotonic() + timeout
        while not (self.request("GET", path).get("status") or {}).get("availableReplicas"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(f"Traefik's pod was not Ready after {timeout:.0f} s")
            time.sleep(0.5)
        return f"http://{ip}:{gateway.PORT}"

    def write_kubeconfig(self, path: Path, token: str, *, user: str, namespace: str | None = None) -> Path:
        path.write_text(
            yaml.safe_dump(kubeconfig(self.server, self.pki / "ca.crt", token, user=user, namespace=namespace))
        )
        return path

    @property
    def kubectl_path(self) -> Path:
        """This version's kubectl; an apiserver-only older version borrows the newest one (built
        with every full cluster), which is how users meet old servers too."""
        assert self.bin is not None
        own = self.bin / "kubectl"
        return own if own.exists() else binaries(NEWEST) / "kubectl"

    def kubectl_argv(self, *args: str) -> list[str]:
        return [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig_path), *args]

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.kubectl_argv(*args), input=input, text=True, capture_output=True, check=check)


def _component_flags(kubeconfig: str) -> list[str]:
    """What kube-controller-manager and kube-scheduler both take here: one kubeconfig for the API and
    for delegated authn/authz, no leader election (one of each), a free loopback port for /healthz."""
    return [
        "--kubeconfig",
        kubeconfig,
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--leader-elect=false",
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(free_port()),
    ]
