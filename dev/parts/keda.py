"""KEDA (github.com/kedacore/keda/v2) as its Go module ships it: the one pinned release the operator
renders ScaledObjects for, its CRDs, and its operator and metrics server built from it.

The module is fetched with ``go mod download`` from the Go module proxy into Go's module cache (read-only,
shared, fetched once), as the LeaderWorkerSet and Gateway API CRDs are. Its ScaledObject CRD is where
`dev/generate/kube_schemas.py` takes the schemas of the KEDA types an EPDDeployment passes through
(triggers, fallback), and what the integration tests install and check rendered ScaledObjects against.

KEDA's operator (``./cmd/operator``), metrics server (``./cmd/adapter``) and admission webhooks
(``./cmd/webhooks``) build once from the module, against its own go.mod and go.sum (``dev/builds/go_module.py``),
into ``~/.cache/epd-operator/keda/<version>/``; run the build at ``nice -n 10`` beside other work: it
compiles client-go, controller-runtime and every scaler's SDK (about 9 minutes on 2 idle cores; the
webhooks share most of the operator's packages).

On the local control plane it is the part ``keda`` (``make cluster PARTS="lws keda"``,
``LocalCluster(parts=("keda",))`` or ``cluster.start_part("keda")`` in tests): its three processes run as
KEDA's own manifests run them in a cluster (``config/manager``, ``config/metrics-server``), with what a pod
would have given them passed explicitly. They listen on 127.0.0.1 where the cluster's components are reached
(:func:`processes`' `enter`): the host's, or with a real node the node's network namespace, where the API server
dials aggregated APIs through the node bridge and where pod and Service IPs (and a Prometheus scraping them)
answer. It is configured with:

- its CRDs, the module's own (``config/crd/bases``), and its namespace (``keda``: where KEDA looks for the
  Secrets of cluster-wide trigger authentications);
- one key pair signed by the cluster's CA, for 127.0.0.1 and the metrics server's Service name, with the
  CA beside it (``ca.crt``, ``tls.crt``, ``tls.key``: the layout of KEDA's ``kedaorg-certs`` Secret): the
  operator serves its gRPC metrics service with it and requires it of its client, the metrics server
  presents it to the operator and serves the external metrics API with it. KEDA's own certificate
  rotation (which writes that Secret and patches the APIService) stays off;
- the cluster's admin kubeconfig, as every controller of the local cluster has (no leader election);
- its validating admission webhooks, as KEDA's chart installs them by default: the module's own
  ValidatingWebhookConfiguration (``config/webhooks/validation_webhooks.yaml``, failurePolicy as shipped),
  each webhook called at 127.0.0.1 on the webhook server's port instead of its in-cluster Service and
  trusting the cluster's CA; the server presents the same key pair;
- the metrics server registered as ``v1beta1.external.metrics.k8s.io``, through an ExternalName Service to
  localhost (the API server dials it on 127.0.0.1 of its egress: the node's namespace when there is a
  real node) and trusted through the cluster's CA. The local API
  server has no front-proxy certificates and calls aggregated APIs anonymously, so the anonymous user may
  read ``external.metrics.k8s.io`` while KEDA runs.

It is started (the operator, once it is ready the metrics server, then the webhooks) and ready once the API
server serves the external metrics group through the metrics server and a ScaledObject dry run is judged by
the webhooks.

    python -m dev.parts.keda             # print where the module's source lies
    python -m dev.parts build keda       # build (or find) the operator, metrics server and webhooks
"""

from __future__ import annotations

import base64
import dataclasses
import os
import time
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from dev.builds import go_module
from dev.cluster.api import ClusterApi
from dev.cluster.components import ClusterComponents
from dev.cluster.pki import sign_serving_cert
from dev.parts.part import GoPart
from dev.ports import free_port
from epd_operator.api.kube_schemas import KEDA_VERSION
from epd_operator.kube import ApiError

MODULE = "github.com/kedacore/keda/v2"
VERSION = KEDA_VERSION  # the release the operator renders ScaledObjects for
SCALED_OBJECTS_CRD = "config/crd/bases/keda.sh_scaledobjects.yaml"
VALIDATING_WEBHOOKS = "config/webhooks/validation_webhooks.yaml"
# KEDA's operator, metrics server and admission webhooks, named as KEDA's Makefile names them, with its
# version stamped in
_FLAGS = ("-trimpath", f"-ldflags=-s -w -X={MODULE}/version.Version={VERSION}")
BINARIES = tuple(
    go_module.GoBinary("keda", MODULE, VERSION, package, name, flags=_FLAGS)
    for name, package in (
        ("keda", "./cmd/operator"),
        ("keda-adapter", "./cmd/adapter"),
        ("keda-admission-webhooks", "./cmd/webhooks"),
    )
)
# Their processes on the local cluster, named as KEDA's manifests name its Deployments.
OPERATOR, METRICS_SERVER, WEBHOOKS = "keda-operator", "keda-metrics-apiserver", "keda-admission-webhooks"


def cached_source() -> Path | None:
    """The release's source where Go's module cache keeps it, without running `go`; None when absent.
    (GOMODCACHE, else the first GOPATH entry's pkg/mod, else ~/go/pkg/mod; the module path has no
    upper-case letters, so it needs no escaping.)"""
    cache_dir = os.environ.get("GOMODCACHE")
    if not cache_dir:
        gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
        cache_dir = str(Path(gopath) / "pkg" / "mod")
    path = Path(cache_dir) / f"{MODULE}@{VERSION}"
    return path if (path / SCALED_OBJECTS_CRD).is_file() else None


@cache
def source() -> Path:
    """The release's source in Go's module cache (downloaded when absent)."""
    cached = cached_source()
    if cached is not None:
        return cached
    return go_module.module_source(f"{MODULE}@{VERSION}", "KEDA's CRDs")


def crd(path: str = SCALED_OBJECTS_CRD) -> dict[str, Any]:
    """One of KEDA's CRDs (by its path in the module), as the release ships it."""
    return dict(yaml.safe_load((source() / path).read_text(encoding="utf-8")))


# ---------------------------------------------------------------- KEDA on the local control plane

NAMESPACE = "keda"  # KEDA's own: the pod namespace and cluster-object namespace its deployment gives it
METRICS_SERVICE = "keda-metrics-apiserver"  # the Service the APIService names, as KEDA's manifests name it
# The name the API server checks the metrics server's certificate against: its Service's.
METRICS_SERVICE_DNS_NAME = f"{METRICS_SERVICE}.{NAMESPACE}.svc"
EXTERNAL_METRICS = "external.metrics.k8s.io"
API_SERVICE = f"v1beta1.{EXTERNAL_METRICS}"
ANONYMOUS_READER = "epd-keda-external-metrics-anonymous-reader"
# What the API server reads of an aggregated API before (and besides) serving it: the anonymous user may.
_DISCOVERY = (
    "/healthz", "/readyz", "/livez", f"/apis/{EXTERNAL_METRICS}", f"/apis/{EXTERNAL_METRICS}/v1beta1",
    "/openapi/v2", "/openapi/v3",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Ports:
    """Where KEDA listens on 127.0.0.1: the operator's gRPC metrics service and health probes, the metrics
    server's API (HTTPS) and its own /metrics (HTTP; KEDA binds that one on every address), the webhook
    server (HTTPS; bound on every address too: KEDA's binary takes no host) and its health probes."""

    grpc: int
    health: int
    api: int
    metrics: int
    webhooks: int
    webhooks_health: int


def crds() -> list[dict[str, Any]]:
    """Every CRD KEDA's operator watches, as the release ships them (``config/crd/bases``)."""
    bases = source() / "config" / "crd" / "bases"
    return [dict(yaml.safe_load(path.read_text(encoding="utf-8"))) for path in sorted(bases.glob("*.yaml"))]


def environment(kubeconfig: Path) -> dict[str, str]:
    """What KEDA's pods get from their Deployment (the downward API's namespace, every namespace
    watched) and from their service account (the API, here the admin kubeconfig)."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
        "WATCH_NAMESPACE": "",
    }


def operator_argv(binary: Path, certs: Path, ports: Ports) -> list[str]:
    """KEDA's operator: its gRPC metrics service on 127.0.0.1 with the certificates in `certs`, no
    certificate rotation, no leader election, no Prometheus endpoint of its own."""
    return [
        str(binary),
        f"--metrics-service-bind-address=127.0.0.1:{ports.grpc}",
        f"--health-probe-bind-address=127.0.0.1:{ports.health}",
        "--metrics-bind-address=0",
        f"--cert-dir={certs}",
        "--enable-cert-rotation=false",
        "--leader-elect=false",
        "--zap-log-level=info",
        "--zap-encoder=console",
    ]


def metrics_server_argv(binary: Path, certs: Path, kubeconfig: Path, ports: Ports) -> list[str]:
    """KEDA's metrics server: the external metrics API on 127.0.0.1 with the certificates in `certs`
    (also its client's to the operator's gRPC service), delegating authentication and authorisation
    to the API server through `kubeconfig`."""
    return [
        str(binary),
        f"--secure-port={ports.api}",
        "--bind-address=127.0.0.1",
        f"--tls-cert-file={certs / 'tls.crt'}",
        f"--tls-private-key-file={certs / 'tls.key'}",
        f"--cert-dir={certs}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--authentication-tolerate-lookup-failure",
        "--authorization-always-allow-paths=" + ",".join(_DISCOVERY),
        f"--metrics-service-address=127.0.0.1:{ports.grpc}",
        f"--port={ports.metrics}",
        "--zap-log-level=info",
    ]


def webhooks_argv(binary: Path, certs: Path, ports: Ports) -> list[str]:
    """KEDA's admission webhooks: served with the certificates in `certs` (tls.crt, tls.key), no metrics
    endpoint of their own."""
    return [
        str(binary),
        f"--port={ports.webhooks}",
        f"--cert-dir={certs}",
        f"--health-probe-bind-address=127.0.0.1:{ports.webhooks_health}",
        "--metrics-bind-address=0",
        "--zap-log-level=info",
        "--zap-encoder=console",
    ]


class Processes(NamedTuple):
    """KEDA's three command lines, in start order: the metrics server dials the operator's gRPC service."""

    operator: list[str]
    metrics_server: list[str]
    webhooks: list[str]


def processes(
    binaries: dict[str, Path], certs: Path, kubeconfig: Path, ports: Ports, enter: Sequence[str] = ()
) -> Processes:
    """The command lines (`binaries` by their names) behind `enter`, the prefix that puts a process where the cluster's components
    listen (empty: the host; a real node's ``netns_argv()``: its network namespace). All go to the same
    place: the metrics server reaches the operator on 127.0.0.1, and the API server reaches the metrics
    server and the webhooks on 127.0.0.1 of its egress."""
    return Processes(
        [*enter, *operator_argv(binaries["keda"], certs, ports)],
        [*enter, *metrics_server_argv(binaries["keda-adapter"], certs, kubeconfig, ports)],
        [*enter, *webhooks_argv(binaries["keda-admission-webhooks"], certs, ports)],
    )


def validating_webhooks(port: int, ca_bundle: bytes) -> dict[str, Any]:
    """The module's ValidatingWebhookConfiguration, each webhook called at 127.0.0.1:`port` + its path
    (instead of KEDA's in-cluster Service) and trusting `ca_bundle`; everything else as KEDA ships it."""
    config = dict(yaml.safe_load((source() / VALIDATING_WEBHOOKS).read_text(encoding="utf-8")))
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca_bundle).decode(),
        }
    return config


# A ScaledObject KEDA's webhook refuses and the CRD's schema accepts (a fallback with only a cpu trigger,
# KEDA's CheckFallbackValid): a dry run of it is denied only once the webhook answers (its failurePolicy,
# Ignore as shipped, lets it through while the server is not up).
WEBHOOK_PROBE = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "webhook-probe", "namespace": NAMESPACE},
    "spec": {
        "scaleTargetRef": {"name": "webhook-probe"},
        "fallback": {"failureThreshold": 3, "replicas": 1},
        "triggers": [{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "50"}}],
    },
}
WEBHOOK_PROBE_DENIAL = "has to have the `AverageValue` type for the fallback to be enabled"


def register_webhooks(
    cluster: ClusterApi, pki: Path, port: int, health_port: int, timeout: float, enter: Sequence[str] = ()
) -> None:
    """Wait for the webhook server's readiness, point the API server at its webhooks and wait until a
    ScaledObject dry run is judged by them."""
    cluster.wait_component_ready(health_port, "KEDA's admission webhooks", timeout, enter=enter)
    cluster.apply(validating_webhooks(port, (pki / "ca.crt").read_bytes()))
    path = f"/apis/keda.sh/v1alpha1/namespaces/{NAMESPACE}/scaledobjects?dryRun=All"
    deadline = time.monotonic() + timeout
    while True:
        cluster.check_alive()
        try:
            cluster.request("POST", path, WEBHOOK_PROBE)
            last = "the probe was let through"
        except ApiError as error:
            if WEBHOOK_PROBE_DENIAL in str(error):
                return
            last = str(error)
        if time.monotonic() > deadline:
            raise TimeoutError(f"KEDA's admission webhooks did not answer after {timeout:.0f} s: {last}")
        time.sleep(0.5)


def external_metrics_api(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The metrics server on the API server's localhost `port` as ``v1beta1.external.metrics.k8s.io``:
    KEDA's namespace, an ExternalName Service to localhost, the APIService trusting `ca_bundle`, and
    read access to the group for the anonymous user the local API server calls it as."""
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": ANONYMOUS_READER},
            "rules": [{"apiGroups": [EXTERNAL_METRICS], "resources": ["*"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": ANONYMOUS_READER},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": ANONYMOUS_READER},
            "subjects": [{"apiGroup": rbac, "kind": "User", "name": "system:anonymous"}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": API_SERVICE},
            "spec": {
                "group": EXTERNAL_METRICS,
                "version": "v1beta1",
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                "caBundle": base64.b64encode(ca_bundle).decode(),
                "service": {"namespace": NAMESPACE, "name": METRICS_SERVICE, "port": port},
            },
        },
    ]


def prepare(cluster: ClusterApi, pki: Path, folder: Path) -> Path:
    """Install KEDA's CRDs and namespace and write its certificates (signed by the cluster's CA in
    `pki`) into `folder`/certs, which it returns."""
    installed = [cluster.apply(crd)["metadata"]["name"] for crd in crds()]
    cluster.wait_established(installed, 60)
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    certs = folder / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    sign_serving_cert(pki, certs / "tls", "keda", dns_names=(METRICS_SERVICE_DNS_NAME,), client=True)
    (certs / "ca.crt").write_bytes((pki / "ca.crt").read_bytes())
    for leftover in ("tls.csr", "tls.cnf"):  # KEDA reads the folder: only what its Secret would hold
        (certs / leftover).unlink()
    return certs


def wait_operator_ready(cluster: ClusterApi, health_port: int, timeout: float, enter: Sequence[str] = ()) -> None:
    """Until the operator's readiness probe answers, where :func:`processes` put it (`enter`)."""
    cluster.wait_component_ready(health_port, "KEDA's operator", timeout, enter=enter)


def register(cluster: ClusterApi, pki: Path, api_port: int, timeout: float) -> None:
    """Register the metrics server as the external metrics API and wait until the API server serves
    the group through it."""
    for obj in external_metrics_api(api_port, (pki / "ca.crt").read_bytes()):
        cluster.apply(obj)
    deadline = time.monotonic() + timeout
    while True:
        cluster.check_alive()
        try:
            got = cluster.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}")
            conditions = (got.get("status") or {}).get("conditions") or []
            available = [c for c in conditions if c["type"] == "Available"]
            if available and available[0]["status"] == "True":
                cluster.request("GET", f"/apis/{EXTERNAL_METRICS}/v1beta1")
                return
            last = str(available)
        except ApiError as error:
            last = str(error)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the external metrics API was not served after {timeout:.0f} s: {last}")
        time.sleep(0.5)


class Keda(GoPart):
    name = "keda"
    summary = "KEDA's operator, metrics server and admission webhooks, with its CRDs and the external metrics API"
    BINARIES = BINARIES
    timeout = 120.0

    def configure(self, cluster: ClusterComponents) -> None:
        """Its CRDs, namespace and certificates, and free ports where it runs (:func:`processes`)."""
        self.certs = prepare(cluster, cluster.pki, cluster.dir / "keda")
        self.ports = Ports(
            grpc=free_port(),
            health=free_port(),
            api=free_port(),
            metrics=free_port(),
            webhooks=free_port(),
            webhooks_health=free_port(),
        )
        self.enter = cluster.components_network()

    def start(self, cluster: ClusterComponents) -> None:
        """The operator, then (once it is ready: the metrics server dials it) the metrics server, and the webhooks."""
        binaries = {binary.binary: go_module.ensure(binary) for binary in self.BINARIES}
        argv = processes(binaries, self.certs, cluster.kubeconfig_path, self.ports, self.enter)
        env = {**os.environ, **environment(cluster.kubeconfig_path)}
        self.start_component(cluster, OPERATOR, argv.operator, env=env)
        wait_operator_ready(cluster, self.ports.health, self.timeout, self.enter)
        self.start_component(cluster, METRICS_SERVER, argv.metrics_server, env=env)
        self.start_component(cluster, WEBHOOKS, argv.webhooks, env=env)

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        """The external metrics API registered and served, the webhooks registered and judging."""
        register(cluster, cluster.pki, self.ports.api, timeout)
        register_webhooks(cluster, cluster.pki, self.ports.webhooks, self.ports.webhooks_health, timeout, self.enter)

    def running(self, cluster: ClusterComponents) -> str:
        where = "the real node's network namespace" if cluster.real_nodes else "the host"
        return f"KEDA serves {EXTERNAL_METRICS} (its operator, metrics server and webhooks in {where})"


if __name__ == "__main__":
    print(source())
