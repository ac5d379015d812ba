"""A real Kubernetes control plane on this machine: no Docker, no VM.

etcd + kube-apiserver (RBAC enforced, service-account tokens) + kube-controller-manager (deployment,
replicaset, endpointslice, garbage collector, HPA, ...) + kube-scheduler, all built from the official Go
modules (``dev/builds/k8s_binaries.py``) and cached in ``~/.cache/epd-operator/k8s/<version>/``, plus
kwok, SIG Scheduling's fake kubelet, for nodes with ``nvidia.com/gpu`` capacity on which pods are
scheduled for real and become Running/Ready (they run nothing: their IPs are for reading only).
With ``real_nodes``, real worker nodes join them (``dev/node/real_node.py``: containerd, runc, CNI, kubelet,
kube-proxy in namespaces of their own) and run pods for real; the fake GPU nodes then carry the
``nvidia.com/gpu`` NoSchedule taint, which pods asking for GPUs tolerate (the ExtendedResourceToleration
admission plugin, as on clouds' GPU pools), so only GPU pods land on them.

Beside them run the cluster's parts (``dev/parts/``, listed in ``dev/parts/registry.py``): those that start with
every real node (its NetworkPolicy engine, its DNS) and those asked for, at the start (``parts``) or later on a
running cluster (:meth:`LocalCluster.start_part`): the LeaderWorkerSet controller, KEDA, a Gateway API gateway.

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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from dev.builds.k8s_binaries import NEWEST, OLDEST, binaries, log
from dev.cluster.api import ClusterError
from dev.cluster.components import ClusterComponents, Component
from dev.cluster.fake_nodes import DEFAULT_NODES, FAKE_NODE_LABEL, GPU, FakeNode
from dev.cluster.pki import ADMIN_TOKEN_USER, kubeconfig, make_pki
from dev.node.kube_config import SERVICE_CIDR
from dev.node.real_node import RealNode, RealNodeSpec, unavailable
from dev.parts import registry
from dev.parts.part import WITH_REAL_NODE, Part
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


class LocalCluster(ClusterComponents):
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
        parts: Sequence[str] = (),
    ):
        if len(real_nodes) > 1:
            raise ValueError("one real node at most: the API server reaches kubelets through one node bridge")
        self.version = version
        self.apiserver_only = apiserver_only
        self.real_node_specs = tuple(real_nodes)
        self.nodes = tuple(dataclasses.replace(n, taints=(*n.taints, GPU_TAINT)) if real_nodes else n for n in nodes)
        self.hpa_sync_seconds = hpa_sync_seconds
        # The parts asked for (dev/parts/registry.py's names), started once the nodes are; every part running.
        self.part_names = tuple(registry.part(name).name for name in parts)
        self.parts: dict[str, Part] = {}
        self._owned_dir = workdir is None
        self.port = free_port()
        admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
        workdir = workdir or Path(tempfile.mkdtemp(prefix="epd-cluster-"))
        super().__init__(f"https://127.0.0.1:{self.port}", workdir, admin_token)
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
            for name in self.part_names:
                self.start_part(name)
        log(f"Kubernetes {self.version} ready in {time.monotonic() - started:.1f} s at {self.server}")

    def stop(self) -> None:
        self.close_api()
        for node in self.real_nodes:
            node.stop()
        for part in reversed(self.parts.values()):
            part.stop(self)
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
        """The node, its images, its kubelet once the API server knows where pods reach it, then the parts every
        real node starts with (dev/parts/registry.py) once it is Ready; a part that cannot run here says why."""
        from dev.builds import images

        parts = []
        for kind in registry.with_real_node():
            part = kind()
            if (why := part.unavailable(self)) is not None:
                print(f"[cluster] real node {node.name}: {why}", flush=True)
            else:
                parts.append(part)
        node.start()
        for image in ("pause", *(name for part in parts for name in part.images)):
            node.load_image(images.BUILDERS[image]())
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
        for part in parts:
            self._run_part(part)

    # -------------------------------------------------------------- parts

    def start_part(self, name: str, timeout: float | None = None) -> Part:
        """Run the part registered as `name` (dev/parts/registry.py) on this cluster, once: built when absent,
        configured, started, and ready (`timeout`: the part's own by default). A cluster started without it may
        start it later (a test that needs it, on a shared cluster); ClusterError says why it cannot run here."""
        if name in self.parts:
            return self.parts[name]
        part = registry.part(name)()
        if (why := part.unavailable(self)) is not None:
            raise ClusterError(why)
        self._run_part(part, timeout)
        return part

    def _run_part(self, part: Part, timeout: float | None = None) -> None:
        self.parts[part.name] = part  # stopped with the cluster from here on, even if it never gets ready
        part.build()
        if part.images and part.starts != WITH_REAL_NODE:  # those are loaded before the node's kubelet starts
            from dev.builds import images

            for image in part.images:
                self.real_node().load_image(images.BUILDERS[image]())
        part.configure(self)
        part.start(self)
        part.ready(self, part.timeout if timeout is None else timeout)

    def _node_ready(self, name: str) -> bool:
        try:
            got = self.request("GET", f"/api/v1/nodes/{name}")
        except ApiError:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in got["status"].get("conditions") or [])

    def _exe(self, name: str) -> str:
        assert self.bin is not None
        return str(self.bin / name)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.start_component(
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
        self.start_component(
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
        self.start_component(
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
        self.start_component(
            "kube-scheduler",
            [
                self._exe("kube-scheduler"),
                *_component_flags(kc),
                "-v",
                "1",
            ],
        )
        self.start_component(
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
