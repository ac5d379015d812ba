"""The cluster's NetworkPolicy engine: kube-router's firewall (github.com/cloudnativelabs/kube-router), run on
the real node the way a kube-router DaemonSet runs it with ``--run-firewall`` alone, as a process inside the
node's network and mount namespaces and cgroup, with the cluster's kubeconfig. The bridge CNI the node uses
enforces nothing by itself; with this, NetworkPolicies hold between the node's pods.

**Build.** Once from the Go module proxy into ``~/.cache/epd-operator/kube-router/<version>/kube-router``, static,
as its own release build is, against the release's go.mod and go.sum (``dev/builds/go_module.py``), by
``make k8s-node`` with the node's other parts. A cluster started before it is built runs without it and says so
(NetworkPolicies are then not enforced).

**Why kube-router**: it enforces with iptables and ipsets (the ``xt_set`` match), which this kernel has;
sigs.k8s.io/kube-network-policies decides in user space through nftables' ``queue`` statement, which this kernel
lacks (CONFIG_NFT_QUEUE off). The published kube-router advisory for its release (GHSA-phqm-jgc3-qf8g) concerns
its service proxy, which is not run here (no router, no service proxy).

Its chains and ipsets live in the node's network namespace only and vanish with it; the machine's own netfilter
rules are never touched. Its health and metrics listeners stay inside that namespace too. **Ready** once its
first sync has hooked its chain into the node's filter table.

    python -m dev.parts build kube-router      # build (or find) it
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dev.builds import go_module
from dev.cluster.api import ClusterError
from dev.cluster.components import ClusterComponents
from dev.node.kube_config import SERVICE_CIDR
from dev.parts.part import WITH_REAL_NODE, GoPart

if TYPE_CHECKING:
    from dev.node.real_node import RealNode

KUBE_ROUTER = go_module.GoBinary(
    "kube-router", "github.com/cloudnativelabs/kube-router/v2", "v2.1.0", "./cmd/kube-router", "kube-router"
)
# The filter chain kube-router hooks into FORWARD once its first sync is done.
READY_CHAIN = "KUBE-ROUTER-FORWARD"
HEALTH_PORT = 20244  # kube-router's own default, in the node's namespace


class KubeRouter(GoPart):
    name = "kube-router"
    summary = "the cluster's NetworkPolicy engine: kube-router's firewall on the real node"
    starts = WITH_REAL_NODE
    needs_real_node = True
    BINARIES = (KUBE_ROUTER,)

    def unavailable(self, cluster: ClusterComponents) -> str | None:
        if not self.built():
            return (
                "NetworkPolicies are not enforced: kube-router is not built"
                " (make k8s-node, or python -m dev.parts build kube-router)"
            )
        return super().unavailable(cluster)

    def start(self, cluster: ClusterComponents) -> None:
        """The firewall on the node (registered with the API server); it stops with the node."""
        node = cluster.real_node()
        node.start_in_node(
            "kube-router-" + node.name,
            argv(
                go_module.ensure(KUBE_ROUTER),
                kubeconfig=node.kubeconfig(),
                node_name=node.name,
                service_cidr=SERVICE_CIDR,
            ),
        )

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        """Until its first sync is done."""
        node = cluster.real_node()
        deadline = time.monotonic() + timeout
        while not synced(node):
            node.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"kube-router did not set up its {READY_CHAIN} chain on {node.name} in {timeout:.0f} s"
                )
            time.sleep(0.5)


def argv(binary: Path, *, kubeconfig: Path, node_name: str, service_cidr: str) -> list[str]:
    """kube-router's command line: the firewall only (no routing, no service proxy, no CNI config),
    IPv4, on the node named `node_name`."""
    return [
        str(binary),
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--enable-cni=false",
        "--enable-ipv4=true",
        "--enable-ipv6=false",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}",
        f"--service-cluster-ip-range={service_cidr}",
        f"--health-port={HEALTH_PORT}",
        "--metrics-port=0",
        "-v=1",
    ]


def synced(node: RealNode) -> bool:
    """Whether kube-router's chains are in the node's filter table."""
    check = subprocess.run([*node.enter_argv(), "iptables", "-S", READY_CHAIN], capture_output=True, check=False)
    return check.returncode == 0
