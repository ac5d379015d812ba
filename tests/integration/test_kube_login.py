"""The operator and the router log in the ways a real cluster asks for, against the real API server:
a kubeconfig whose user is an exec plugin (as EKS/GKE/AKS kubeconfigs are), a kubeconfig split over
two `KUBECONFIG` paths, and a pod's service account (its files in a temp dir, the
KUBERNETES_SERVICE_HOST/PORT environment pointed at the test API server).

The tokens are real service-account tokens from the TokenRequest API, for an account bound to
cluster-admin: what authenticates is what the test wrote, never the fixtures' admin token.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from epd_operator.kube import CHILD_RESOURCES, Kube, credentials, load_credentials
from epd_operator.router.config import RouterConfig
from epd_operator.router.server import Router
from tests.support.cluster import KubeView, volumes
from tests.support.operator_run import create, deployed, epd_doc, observed, operator_in_process, wait_until
from tests.support.router_stack import serve_router

EXEC_API = "client.authentication.k8s.io/v1"


def service_account(kube: KubeView, name: str = "epd-login") -> str:
    """A token of a fresh service account that may do anything (the operator's own RBAC is the
    charts' business, tested there)."""
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": kube.ns}})
    kube.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{kube.ns}-{name}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": kube.ns}],
        }
    )
    return kube.cluster.service_account_token(kube.ns, name)


def exec_plugin(folder: Path, *tokens: str) -> tuple[dict, Path]:
    """A kubeconfig `exec` user: a script printing an ExecCredential with the next of `tokens` (the
    last one again once they run out), and the file where each run is counted."""
    runs = folder / "exec-runs"
    script = folder / "credential-plugin"
    script.write_text(f"""#!{sys.executable}
import json, os, pathlib, sys
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])  # what kubectl and client-go also pass
runs = pathlib.Path({str(runs)!r})
n = len(runs.read_text().splitlines()) if runs.exists() else 0
runs.write_text(runs.read_text() + "run\\n" if runs.exists() else "run\\n")
tokens = {list(tokens)!r}
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": {{"token": tokens[min(n, len(tokens) - 1)]}}}}))
""")
    script.chmod(0o755)
    user = {"exec": {"apiVersion": EXEC_API, "command": str(script), "interactiveMode": "Never"}}
    return user, runs


def split_kubeconfig(kube: KubeView, folder: Path, user: dict) -> str:
    """The cluster and context in one file, the user in another: a `KUBECONFIG` of two paths."""
    with open(kube.kubeconfig) as f:
        admin = yaml.safe_load(f)
    clusters = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "current-context": "test",
        "contexts": [
            {
                "name": "test",
                "context": {"cluster": admin["clusters"][0]["name"], "user": "plugin", "namespace": kube.ns},
            }
        ],
    }
    users = {"apiVersion": "v1", "kind": "Config", "users": [{"name": "plugin", "user": user}]}
    (folder / "clusters.yaml").write_text(yaml.safe_dump(clusters))
    (folder / "users.yaml").write_text(yaml.safe_dump(users))
    return f"{folder / 'clusters.yaml'}{os.pathsep}{folder / 'users.yaml'}"


def runs_of(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


async def test_the_client_runs_the_exec_plugin_again_when_its_token_is_refused(kube, tmp_path):
    token = service_account(kube)
    user, runs = exec_plugin(tmp_path, "not-a-token", token)
    paths = split_kubeconfig(kube, tmp_path, user)
    async with Kube(lambda: load_credentials(paths)) as client:
        assert await client.get(CHILD_RESOURCES["ConfigMap"], kube.ns, "absent") is None  # 401, plugin again, 404
        assert runs_of(runs) == 2
        assert (await client.login()).default_namespace == kube.ns


async def test_the_operator_logs_in_through_an_exec_plugin_from_two_kubeconfig_paths(kube, tmp_path, monkeypatch):
    user, runs = exec_plugin(tmp_path, service_account(kube))
    monkeypatch.setenv("KUBECONFIG", split_kubeconfig(kube, tmp_path, user))
    volumes(kube, "ec-cache")
    # The default login (no explicit credentials), with leader election: the Lease goes to the
    # kubeconfig context's namespace.
    async with operator_in_process(load_credentials, "--namespace", kube.ns, "--lease-duration", "3"):
        await create(kube, epd_doc())
        await deployed(kube, "vl-encoder", "vl-decode", "vl-router")
        await observed(kube, 1)
        assert kube.get("coordination.k8s.io/v1", "Lease", "epd-operator") is not None
    assert runs_of(runs) >= 2  # our client and kopf's watches each logged in through the plugin


def endpoint_slice(kube: KubeView, name: str, address: str) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "addressType": "IPv4",
        "metadata": {"name": name, "namespace": kube.ns, "labels": {"test.epd.dev/role": "decode"}},
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": True}, "targetRef": {"kind": "Pod", "name": name}}
        ],
    }


@asynccontextmanager
async def discovering(kubeconfig: str | None, namespace: str | None) -> AsyncIterator[Router]:
    cfg = RouterConfig(
        discovery="kubernetes",
        kubeconfig=kubeconfig,
        namespace=namespace,
        encoder_selector="test.epd.dev/role=encoder",
        decode_selector="test.epd.dev/role=decode",
        health_interval=0,
    )
    router = Router(cfg)
    runner, _url = await serve_router(router)
    try:
        yield router
    finally:
        await runner.cleanup()


def decode_urls(router: Router) -> set[str]:
    return {ep.url for ep in router.decodes.endpoints.values()}


async def test_the_router_discovers_through_an_exec_plugin_from_two_kubeconfig_paths(kube, tmp_path):
    user, runs = exec_plugin(tmp_path, service_account(kube))
    kube.create(endpoint_slice(kube, "decode-a", "10.9.0.1"))
    # --kubeconfig takes several paths like KUBECONFIG; no --namespace: the context's.
    async with discovering(split_kubeconfig(kube, tmp_path, user), None) as router:
        assert decode_urls(router) == {"http://10.9.0.1:8000"}  # listed before it serves
        kube.create(endpoint_slice(kube, "decode-b", "10.9.0.2"))  # then watched
        await wait_until(
            lambda: decode_urls(router) == {"http://10.9.0.1:8000", "http://10.9.0.2:8000"},
            20,
            lambda: decode_urls(router),
        )
    assert runs_of(runs) == 1


@pytest.fixture
def in_a_pod(kube: KubeView, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubeView:
    """What a pod has: the service-account files and the API server's address in its environment."""
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text(service_account(kube))
    (folder / "ca.crt").write_bytes((kube.cluster.pki / "ca.crt").read_bytes())
    (folder / "namespace").write_text(kube.ns)
    for name in ("token", "ca.crt", "namespace"):
        constant = {
            "token": "SERVICE_ACCOUNT_TOKEN",
            "ca.crt": "SERVICE_ACCOUNT_CA",
            "namespace": "SERVICE_ACCOUNT_NAMESPACE",
        }
        monkeypatch.setattr(credentials, constant[name], str(folder / name))
    server = urlsplit(kube.cluster.server)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", server.hostname or "")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
    # A kubeconfig in the environment must not win over the pod's own account.
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))
    return kube


async def test_in_a_pod_the_service_account_is_used(in_a_pod: KubeView):
    kube = in_a_pod
    login = await load_credentials()
    assert (login.source, login.default_namespace) == ("in-cluster service account", kube.ns)
    assert login.authorization() == ("Bearer", (Path(credentials.SERVICE_ACCOUNT_TOKEN).read_text()))
    kube.create(endpoint_slice(kube, "decode-a", "10.9.0.3"))
    async with discovering(None, None) as router:  # namespace: the pod's
        assert decode_urls(router) == {"http://10.9.0.3:8000"}
    volumes(kube, "ec-cache")
    async with operator_in_process(load_credentials, "--namespace", kube.ns, "--lease-duration", "3"):
        await create(kube, epd_doc())
        await observed(kube, 1)
        lease = kube.get("coordination.k8s.io/v1", "Lease", "epd-operator")  # in the pod's namespace
        assert lease is not None and lease["spec"]["holderIdentity"], lease
