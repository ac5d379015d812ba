"""The local cluster's NetworkPolicy engine: kube-router's firewall (``dev/parts/kube_router.py``), run on the
real node the way a kube-router DaemonSet runs it with ``--run-firewall`` alone, as a process inside the
node's network and mount namespaces and cgroup, with the cluster's kubeconfig. The bridge CNI the node
uses enforces nothing by itself; with this, NetworkPolicies hold between the node's pods.

Why kube-router: it enforces with iptables and ipsets (the ``xt_set`` match), which this kernel has;
sigs.k8s.io/kube-network-policies decides in user space through nftables' ``queue`` statement, which
this kernel lacks (CONFIG_NFT_QUEUE off). The published kube-router advisory for its release
(GHSA-phqm-jgc3-qf8g) concerns its service proxy, which is not run here.

Its chains and ipsets live in the node's network namespace only and vanish with it; the machine's own
netfilter rules are never touched. Its health and metrics listeners stay inside that namespace too.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dev.cluster.api import ClusterError
from dev.parts import kube_router

if TYPE_CHECKING:
    from dev.node.real_node import RealNode

# The filter chain kube-router hooks into FORWARD once its first sync is done.
READY_CHAIN = "KUBE-ROUTER-FORWARD"
HEALTH_PORT = 20244  # kube-router's own default, in the node's namespace


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


def start(node: RealNode, service_cidr: str, timeout: float = 60) -> None:
    """Start the engine on `node` (registered with the API server) and wait for its first sync."""
    binary = kube_router.ensure()
    node.start_in_node(
        "kube-router-" + node.name,
        argv(binary, kubeconfig=node.kubeconfig(), node_name=node.name, service_cidr=service_cidr),
    )
    deadline = time.monotonic() + timeout
    while not synced(node):
        node.check_alive()
        if time.monotonic() > deadline:
            raise ClusterError(f"kube-router did not set up its {READY_CHAIN} chain on {node.name} in {timeout:.0f} s")
        time.sleep(0.5)


def synced(node: RealNode) -> bool:
    """Whether kube-router's chains are in the node's filter table."""
    check = subprocess.run([*node.enter_argv(), "iptables", "-S", READY_CHAIN], capture_output=True, check=False)
    return check.returncode == 0
