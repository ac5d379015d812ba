"""pytest fixtures around a REAL Kubernetes control plane (``dev.cluster.local``).

- ``k8s`` (session): etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok fake GPU
  nodes, started once per test session, with the EPDDeployment CRD from ``crds/`` installed.
- ``kube``: a fresh namespace on it per test, and a :class:`KubeView` to act and assert through.

The first use builds the binaries (minutes, once; cached in ``~/.cache/epd-operator/k8s``).
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.cluster.local import LocalCluster
from dev.lifetimes import kill_with_parent
from dev.parts import gateway, keda, lws
from epd_operator.kube import ApiError, Credentials, load_credentials

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "serving.epd.dev_epddeployments.yaml"
EPD_API = "serving.epd.dev/v1alpha1"

PLURALS = {
    "EPDDeployment": "epddeployments",
    "HTTPRoute": "httproutes",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies",
    "EndpointSlice": "endpointslices",
    "CustomResourceDefinition": "customresourcedefinitions",
    "Lease": "leases",
    "ScaledObject": "scaledobjects",
}
CLUSTER_SCOPED = {
    "Node",
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
}
_namespaces = itertools.count(1)


def plural(kind: str) -> str:
    return PLURALS.get(kind) or kind.lower() + ("es" if kind.endswith("s") else "s")


def api_path(api_version: str, kind: str, namespace: str | None, name: str | None = None, sub: str = "") -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace and kind not in CLUSTER_SCOPED:
        base += f"/namespaces/{namespace}"
    base += f"/{plural(kind)}"
    if name:
        base += f"/{name}"
    return base + (f"/{sub}" if sub else "")


class KubeView:
    """One namespace of the real cluster, as the tests see it (admin credentials, blocking calls).

    Blocking is fine: an operator under test runs in its own thread or process."""

    def __init__(self, cluster: LocalCluster, namespace: str, kubeconfig: Path):
        self.cluster = cluster
        self.ns = namespace
        self.url = cluster.server
        self.kubeconfig = kubeconfig

    # -------------------------------------------------------------- raw access

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/merge-patch+json",
        token: str | None = None,
    ) -> tuple[int, Any]:
        """One request; returns (HTTP status, decoded body) whatever the status."""
        try:
            return 200, self.cluster.request(method, path, body, content_type=content_type, token=token)
        except ApiError as exc:
            return exc.status, exc.body

    def ok(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        status, answer = self.request(method, path, body, **kw)
        assert status < 300, f"{method} {path} -> {status}: {answer}"
        return answer

    async def credentials(self) -> Credentials:
        """What the operator logs in with when run in-process: the admin identity, through the
        real kubeconfig loader."""
        return await load_credentials(str(self.kubeconfig))

    def env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cluster.kubectl_path), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        result = subprocess.run(argv, input=input, text=True, capture_output=True, timeout=60)
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
        return result

    # -------------------------------------------------------------- objects

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        status, body = self.request("GET", api_path(api_version, kind, namespace or self.ns, name))
        if status == 404:
            return None
        assert status == 200, body
        return dict(body)

    def list(
        self, api_version: str, kind: str, *, labels: dict[str, str] | None = None, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        path = api_path(api_version, kind, namespace or self.ns)
        if labels:
            path += "?labelSelector=" + ",".join(f"{k}%3D{v}" for k, v in labels.items())
        items = self.ok("GET", path)["items"]
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return list(items)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ns = None if obj["kind"] in CLUSTER_SCOPED else obj.get("metadata", {}).get("namespace") or self.ns
        return dict(self.ok("POST", api_path(obj["apiVersion"], obj["kind"], ns), obj, content_type="application/json"))

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        self.ok("DELETE", api_path(api_version, kind, namespace or self.ns, name))

    def events(self, *, kind: str | None = None, name: str | None = None) -> builtins.list[dict[str, Any]]:
        return [
            e
            for e in self.list("v1", "Event")
            if (kind is None or e["involvedObject"].get("kind") == kind)
            and (name is None or e["involvedObject"].get("name") == name)
        ]

    def pods(self, **labels: str) -> builtins.list[dict[str, Any]]:
        return self.list("v1", "Pod", labels=labels or None)

    def set_pod_ready(self, name: str, ready: bool) -> None:
        """Take a pod's readiness over from kwok (which leaves alone a pod annotated so) and set it.

        kwok may still be acting on an event from before the annotation (a new pod it is making ready), so
        the readiness is set again until five reads 0.2 s apart agree with it."""
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}"
        self.ok("PATCH", path, {"metadata": {"annotations": {"kwok.x-k8s.io/status": "custom"}}})
        value = "True" if ready else "False"
        deadline, agreeing = time.monotonic() + 15, 0
        while agreeing < 5:
            pod = self.ok("GET", path)
            conditions = pod["status"].get("conditions") or []
            if all(c["status"] == value for c in conditions if c["type"] in ("Ready", "ContainersReady")):
                agreeing += 1
            else:
                agreeing = 0
                assert time.monotonic() < deadline, f"pod {name}'s readiness does not stay {value}: {conditions}"
                self.ok(
                    "PATCH",
                    path + "/status",
                    {
                        "status": {
                            "conditions": [
                                {**c, "status": value} if c["type"] in ("Ready", "ContainersReady") else c
                                for c in conditions
                            ]
                        }
                    },
                    content_type="application/strategic-merge-patch+json",
                )
            time.sleep(0.2)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the test (admin), into this namespace unless the object names one."""
        obj = {**obj, "metadata": {**obj["metadata"], "namespace": obj["metadata"].get("namespace") or self.ns}}
        path = api_path(obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        return dict(
            self.ok(
                "PATCH", path + "?fieldManager=epd-tests&force=true", obj, content_type="application/apply-patch+yaml"
            )
        )


def volumes(kube: KubeView, *claims: str) -> None:
    """What the examples expect to exist: RWX claims, bound to pre-made volumes (pods that name a
    claim are not scheduled before it is bound)."""
    for claim in claims:
        pv = f"{kube.ns}-{claim}"
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "100Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "hostPath": {"path": f"/tmp/{pv}"},
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": kube.ns, "name": claim},
                },
            }
        )
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": kube.ns},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "100Gi"}},
                },
            }
        )


def wait_for(
    condition: Callable[[], Any], timeout: float = 30.0, message: Any = "condition not met", interval: float = 0.1
) -> Any:
    """Blocking poll; returns the first truthy value of `condition`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(interval)


@contextlib.contextmanager
def logged_process(argv: list[str], log: Path, *, die_with_parent: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """A process writing stdout and stderr to `log` for the duration of the block: SIGTERM at the end,
    SIGKILL if it is still there 20 s later. With `die_with_parent`, it also dies with this process."""
    with log.open("wb") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=kill_with_parent if die_with_parent else None
        )
    try:
        yield proc
    finally:
        end_process(proc)


def end_process(proc: subprocess.Popen[bytes], grace: float = 20) -> None:
    """SIGTERM, then SIGKILL if it is still there `grace` seconds later."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def cluster_objects(kube: KubeView, objects: list[tuple[str, dict[str, Any]]]) -> Iterator[None]:
    """Cluster-scoped objects (API path of the collection, body) for the duration of the block, deleted
    in reverse order at its end (the session's cluster is shared)."""
    made = []
    try:
        for path, body in objects:
            kube.ok("POST", path, body, content_type="application/json")
            made.append(f"{path}/{body['metadata']['name']}")
        yield
    finally:
        for path in reversed(made):
            kube.request("DELETE", path)


CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"


def custom_metrics_api(reader: str, namespace: str, service: str, port: int) -> list[tuple[str, dict[str, Any]]]:
    """For :func:`cluster_objects`: prometheus-adapter listening on `port` of the API server's localhost,
    registered as custom.metrics.k8s.io v1beta2 through an ExternalName Service `namespace/service`.
    The local API server has no front-proxy certificates and calls aggregated APIs anonymously, so the
    anonymous user may read the group (ClusterRole and ClusterRoleBinding named `reader`)."""
    group, rbac = CUSTOM_METRICS_GROUP, "/apis/rbac.authorization.k8s.io/v1"
    return [
        (
            f"{rbac}/clusterroles",
            {
                "metadata": {"name": reader},
                "rules": [{"apiGroups": [group], "resources": ["*"], "verbs": ["get", "list"]}],
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": reader},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:anonymous"}],
            },
        ),
        (
            f"/api/v1/namespaces/{namespace}/services",
            {"metadata": {"name": service}, "spec": {"type": "ExternalName", "externalName": "localhost"}},
        ),
        (
            "/apis/apiregistration.k8s.io/v1/apiservices",
            {
                "metadata": {"name": f"v1beta2.{group}"},
                "spec": {
                    "group": group,
                    "version": "v1beta2",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 200,
                    "insecureSkipTLSVerify": True,  # the adapter's self-signed serving certificate
                    "service": {"namespace": namespace, "name": service, "port": port},
                },
            },
        ),
    ]


def install_crd(cluster: LocalCluster, crd: dict[str, Any]) -> None:
    """Server-side apply a CRD and wait until it is Established (served)."""
    name = crd["metadata"]["name"]
    cluster.request(
        "PATCH",
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?fieldManager=epd-tests&force=true",
        crd,
        content_type="application/apply-patch+yaml",
    )

    def established() -> bool:
        got = cluster.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (got.get("status") or {}).get("conditions") or []
        )

    wait_for(established, 30, f"CRD {name} not established")


def gateway_api_crd(kind_plural: str = "httproutes") -> dict[str, Any]:
    """A Gateway API CRD (standard channel) as that project ships it in its Go module (dev/parts/gateway.py)."""
    return gateway.crd(kind_plural)


# LeaderWorkerSet (multi-node tiers): the newest release the Go module proxy serves.
def lws_crd() -> dict[str, Any]:
    """The LeaderWorkerSet CRD as that project ships it in its Go module (the version dev/parts/lws.py runs)."""
    return lws.leader_worker_set_crd()


def keda_crd() -> dict[str, Any]:
    """KEDA's ScaledObject CRD as that project ships it in its Go module (dev/parts/keda.py)."""
    return keda.crd()


def epd_crd() -> dict[str, Any]:
    return dict(yaml.load(CRD_FILE.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader))  # libyaml: 0.5 MB


@pytest.fixture(scope="session")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("k8s")) as cluster:
        install_crd(cluster, epd_crd())
        yield cluster


def new_namespace(cluster: LocalCluster, tmp_path: Path, prefix: str = "t") -> KubeView:
    name = f"{prefix}-{next(_namespaces)}-{os.urandom(2).hex()}"
    cluster.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    kubeconfig = cluster.write_kubeconfig(
        tmp_path / "kubeconfig", cluster.admin_token, user="epd-admin", namespace=name
    )
    return KubeView(cluster, name, kubeconfig)


@pytest.fixture
def kube(k8s: LocalCluster, tmp_path: Path) -> Iterator[KubeView]:
    view = new_namespace(k8s, tmp_path)
    yield view
    # Background deletion: the namespace controller empties it while later tests run.
    view.request("DELETE", f"/api/v1/namespaces/{view.ns}")
