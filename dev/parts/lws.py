"""The LeaderWorkerSet controller (sigs.k8s.io/lws) on the local control plane: its manager built once
from the Go module proxy into ``~/.cache/epd-operator/lws/<version>/manager`` and run from the host,
the way its docs run it outside a cluster (``go run ./cmd/main.go`` against a kubeconfig).

Its webhooks stay on: the pod webhook is what gives every pod of a group its worker index label and
the ``LWS_LEADER_ADDRESS`` / ``LWS_WORKER_INDEX`` environment that multi-node vLLM reads, and the
LeaderWorkerSet webhook defaults and validates the objects. Its internal certificate management is
off (it wants an in-cluster Service and Secret): the webhook serves on 127.0.0.1 with a certificate
the cluster's CA signs, and the module's own webhook configurations (``config/webhook``, with its
kustomize patches: pods only when they belong to a LeaderWorkerSet) point at that address instead
of a Service. The CRDs are the module's own (``config/crd/bases``).

On the local cluster it is the part ``lws`` (``make cluster`` runs it; ``LocalCluster(parts=("lws",))`` or
``cluster.start_part("lws")`` in tests): configured (CRDs, the webhook's certificate and the manager's
configuration), started (the manager, from the host, with the cluster's admin kubeconfig), ready once a
LeaderWorkerSet dry run is defaulted by its webhook.

    python -m dev.parts build lws      # build (or find) the manager
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import Any

import yaml

from dev.builds import go_module
from dev.cluster.api import ClusterApi
from dev.cluster.components import ClusterComponents
from dev.cluster.pki import sign_serving_cert
from dev.parts.part import GoPart
from dev.ports import free_port

# The manager, built once when absent (12 minutes on 2 busy cores).
MANAGER = go_module.GoBinary("lws", "sigs.k8s.io/lws", "v0.9.0", "./cmd", "manager")
COMPONENT = "lws-controller-manager"
# The webhook paths of the pods the LWS webhooks must see only when they belong to a LeaderWorkerSet.
_CONFIG_KINDS = {"MutatingWebhookConfiguration": "mutating", "ValidatingWebhookConfiguration": "validating"}


class LeaderWorkerSet(GoPart):
    name = "lws"
    summary = "the LeaderWorkerSet controller with its CRDs and webhooks (multi-node tiers)"
    BINARIES = (MANAGER,)

    def configure(self, cluster: ClusterComponents) -> None:
        """Its CRDs, the webhook's certificate and the manager's configuration (free ports on 127.0.0.1)."""
        self.webhook_port, self.health_port = free_port(), free_port()
        self.argv = prepare(
            cluster, cluster.pki, cluster.dir / "lws", webhook_port=self.webhook_port, health_port=self.health_port
        )

    def start(self, cluster: ClusterComponents) -> None:
        """The manager, from the host, with the cluster's admin kubeconfig."""
        self.start_component(
            cluster, COMPONENT, self.argv, env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)}
        )

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        register_webhooks(
            cluster, cluster.pki, webhook_port=self.webhook_port, health_port=self.health_port, timeout=timeout
        )


def source() -> Path:
    """The module's source at its version (the Go module cache; downloaded when absent)."""
    return go_module.module_source(f"{MANAGER.module}@{MANAGER.version}", "the LeaderWorkerSet CRDs", timeout=300)


def crds() -> list[dict[str, Any]]:
    """The module's CRDs (LeaderWorkerSet and DisaggregatedSet: the manager watches both)."""
    bases = source() / "config" / "crd" / "bases"
    return [dict(yaml.safe_load(path.read_text())) for path in sorted(bases.glob("*.yaml"))]


def leader_worker_set_crd() -> dict[str, Any]:
    return next(crd for crd in crds() if crd["spec"]["names"]["kind"] == "LeaderWorkerSet")


def webhook_configurations(url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The module's webhook configurations with its kustomize patches applied, each webhook called at
    `url` + its path (instead of its in-cluster Service) and trusting `ca_bundle`."""
    folder = source() / "config" / "webhook"
    out = []
    for doc in yaml.safe_load_all((folder / "manifests.yaml").read_text()):
        if not doc:
            continue
        patch = folder / f"{_CONFIG_KINDS[doc['kind']]}-patch.yaml"
        for op in yaml.safe_load(patch.read_text()) if patch.exists() else []:
            assert op["op"] == "replace" and op["path"].startswith("/webhooks/"), op
            doc["webhooks"][int(op["path"].rsplit("/", 1)[1])] = op["value"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca_bundle).decode()}
        doc["metadata"]["name"] = f"lws-{doc['metadata']['name']}"
        out.append(doc)
    return out


def manager_config(folder: Path, *, webhook_port: int, health_port: int) -> Path:
    """The manager's configuration file (config.lws.x-k8s.io/v1alpha1): no leader election, no
    metrics server, its own certificate management off, the webhook on 127.0.0.1 from `folder`."""
    config = {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(folder)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def prepare(cluster: ClusterApi, pki: Path, folder: Path, *, webhook_port: int, health_port: int) -> list[str]:
    """Install the CRDs, write the webhook's certificate (signed by the cluster's CA in `pki`) and the
    manager's configuration into `folder`; returns the manager's command line."""
    installed = [cluster.apply(crd)["metadata"]["name"] for crd in crds()]
    cluster.wait_established(installed, 60)
    folder.mkdir(parents=True, exist_ok=True)
    sign_serving_cert(pki, folder / "tls", "lws-webhook")
    return [
        str(go_module.ensure(MANAGER)),
        "--config",
        str(manager_config(folder, webhook_port=webhook_port, health_port=health_port)),
    ]


def register_webhooks(cluster: ClusterApi, pki: Path, *, webhook_port: int, health_port: int, timeout: float) -> None:
    """Wait for the manager's readiness, then point the API server at its webhooks and wait until a
    LeaderWorkerSet dry run passes through them."""
    cluster.wait_component_ready(health_port, "the LWS controller manager", timeout)
    deadline = time.monotonic() + timeout
    for config in webhook_configurations(f"https://127.0.0.1:{webhook_port}", (pki / "ca.crt").read_bytes()):
        cluster.apply(config)
    probe = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {
            "leaderWorkerTemplate": {
                "size": 2,
                "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "probe"}]}},
            }
        },
    }
    while True:
        try:
            answer = cluster.request(
                "POST", "/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets?dryRun=All", probe
            )
            if (answer.get("spec") or {}).get("networkConfig"):  # defaulted by the mutating webhook only
                return
        except Exception as error:  # the webhook not answering yet: the API server refuses the call
            last = error
        else:
            last = RuntimeError(f"not defaulted by the webhook: {answer}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the LWS webhooks did not answer after {timeout:.0f} s: {last}")
        time.sleep(0.5)
