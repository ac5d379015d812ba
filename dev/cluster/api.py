"""The admin side of a local cluster: its API requests, the waits that tell it is ready, and what
bootstraps it (fake nodes and their capacity, TokenRequests for service accounts).

Requests go through the project's Kubernetes library (`dev/cluster/kube_blocking.py`), as the admin user of the
cluster's static token file unless a request names another token.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from dev.cluster.fake_nodes import FakeNode
from dev.cluster.kube_blocking import BlockingKube
from epd_operator.kube import ApiError, Credentials

# No answer at all: the server is not listening yet, or not answering in time.
UNREACHABLE = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


def readyz_argv(url: str) -> list[str]:
    """A command that exits 0 when `url` answers 200 within 2 s (a readiness probe run where the
    component listens, behind a namespace-entering prefix)."""
    code = "import sys, urllib.request; sys.exit(urllib.request.urlopen(sys.argv[1], timeout=2).status != 200)"
    return [sys.executable, "-c", code, url]


class ClusterError(RuntimeError):
    pass


class ClusterApi:
    """One cluster's API as its admin. Every wait calls `check_alive()`, which a subclass that runs
    the cluster's processes overrides so that a crashed server fails the wait at once."""

    def __init__(self, server: str, ca_path: Path, admin_token: str):
        self.server = server
        self.ca_path = ca_path
        self.admin_token = admin_token
        self._api: BlockingKube | None = None

    def check_alive(self) -> None:
        """Nothing to check for a server we do not run."""

    def close_api(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None

    def _client(self) -> BlockingKube:
        if self._api is None:
            self._api = BlockingKube(Credentials.from_token(self.server, self.admin_token, ca_path=str(self.ca_path)))
        return self._api

    def request(self, method: str, path: str, body: Any = None, **options: Any) -> Any:
        """:meth:`BlockingKube.request` as this cluster's admin (``content_type``, ``token``, ``timeout``: its
        options): the decoded answer to one request on a raw API path, or ApiError (status, decoded body)."""
        return self._client().request(method, path, body, **options)

    # -------------------------------------------------------------- readiness

    def _wait_ready(self, path: str, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                status, answer = self._client().call("GET", path, timeout=5)
                if status == 200:
                    return
                last = f"HTTP {status}: {str(answer)[:500]}"
            except UNREACHABLE as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise ClusterError(f"{what} not ready after {timeout:.0f} s: {last}")

    def wait_established(self, names: Iterable[str], timeout: float) -> None:
        """Until every CRD is served (a controller gives up on a kind that is not when its caches sync)."""
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conditions = (crd.get("status") or {}).get("conditions") or []
                if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"CRD {name} not established after {timeout:.0f} s")
                time.sleep(0.2)

    def wait_component_ready(
        self, health_port: int, what: str, timeout: float, *, enter: Sequence[str] = (), path: str = "/readyz"
    ) -> None:
        """Until a component this cluster runs answers its readiness probe (`path` on 127.0.0.1):
        on the host, or, with `enter` (a prefix that runs a command in another network namespace, a
        real node's ``netns_argv()``), on that namespace's loopback."""
        url = f"http://127.0.0.1:{health_port}{path}"
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if enter:
                probe = subprocess.run([*enter, *readyz_argv(url)], capture_output=True, timeout=30, check=False)
                if probe.returncode == 0:
                    return
            else:
                try:
                    with urllib.request.urlopen(url, timeout=2) as answer:
                        if answer.status == 200:
                            return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} was not ready after {timeout:.0f} s")
            time.sleep(0.5)

    def _wait_for_service_account(self, namespace: str, name: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(ApiError):
                self.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}")
                return
            time.sleep(0.2)
        raise ClusterError(f"the serviceaccount controller did not create {namespace}/{name} in {timeout:.0f} s")

    def _wait_for_schedulable_nodes(self, names: Iterable[str], timeout: float) -> None:
        """Nodes are created with the not-ready taint; the node lifecycle controller lifts it once
        kwok reports them Ready."""
        deadline = time.monotonic() + timeout
        wanted = set(names)
        while time.monotonic() < deadline:
            self.check_alive()
            nodes = [n for n in self.request("GET", "/api/v1/nodes")["items"] if n["metadata"]["name"] in wanted]
            if len(nodes) == len(wanted) and not any(
                t["key"].startswith("node.kubernetes.io/") for n in nodes for t in n["spec"].get("taints") or []
            ):
                return
            time.sleep(0.2)
        raise ClusterError(f"the fake nodes were not Ready and untainted after {timeout:.0f} s")

    # -------------------------------------------------------------- objects

    def apply(self, obj: dict[str, Any], *, field_manager: str = "epd-local-cluster") -> Any:
        """Server-side apply of a cluster-scoped or namespaced core/apps object (admin)."""
        api = obj["apiVersion"]
        prefix = f"/api/{api}" if "/" not in api else f"/apis/{api}"
        plural = {"Node": "nodes", "Namespace": "namespaces", "GatewayClass": "gatewayclasses"}.get(obj["kind"]) or (
            obj["kind"].lower() + "s"
        )
        ns = obj["metadata"].get("namespace")
        path = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        return self.request(
            "PATCH",
            f"{path}/{obj['metadata']['name']}?fieldManager={field_manager}&force=true",
            obj,
            content_type="application/apply-patch+yaml",
        )

    def add_nodes(self, *nodes: FakeNode) -> None:
        for node in nodes:
            self.apply(node.manifest())
            # Capacity is status: a node's own status is set by its kubelet (here: kwok keeps it, we seed it).
            self.request(
                "PATCH",
                f"/api/v1/nodes/{node.name}/status",
                {"status": node.manifest()["status"]},
                content_type="application/merge-patch+json",
            )

    def remove_node(self, name: str) -> None:
        with contextlib.suppress(ApiError):
            self.request("DELETE", f"/api/v1/nodes/{name}")

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token for a ServiceAccount (TokenRequest), as a pod would mount it."""
        review = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        return str(review["status"]["token"])
