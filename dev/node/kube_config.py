"""The real node's Kubernetes side (``dev/node/real_node.py``): the kubelet's and kube-proxy's configuration,
the kubeconfig they log in with, the cluster's network facts they share with the API server and the
cluster's DNS, and the kernel settings the kubelet checks.

Pure: each function returns what the node writes; the node decides where.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

# The API server's --service-cluster-ip-range (dev/cluster/local.py).
SERVICE_CIDR = "10.96.0.0/16"
# The cluster's DNS (dev/parts/coredns.py): the `kube-dns` Service's ClusterIP, in SERVICE_CIDR.
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
REAL_NODE_LABEL = "epd.dev/real-node"
# What the kubelet checks (and, unprotected, writes) in /proc/sys: its wanted values.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


def kubelet_config(
    *, cgroup_root: str, runtime_socket: Path, pod_logs: Path, resolv_conf: Path, overrides: dict[str, Any]
) -> dict[str, Any]:
    """The KubeletConfiguration: cgroupfs under ``cgroup_root``, containerd at ``runtime_socket``;
    ``overrides`` (a test's, e.g. maxPods) set last."""
    sock = f"unix://{runtime_socket}"
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # From 1.35 the kubelet refuses cgroup v1 unless told otherwise; on cgroup v2 this changes nothing.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        # Only check the kernel settings (they read as wanted inside the node's mount namespace).
        "protectKernelDefaults": True,
        "containerRuntimeEndpoint": sock,
        "imageServiceEndpoint": sock,
        "address": "0.0.0.0",
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        # Reached only inside the node's network namespace (the API server comes through the bridge).
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(pod_logs),
        "resolvConf": str(resolv_conf),
        # ClusterFirst pods: nameserver CLUSTER_DNS_IP, search <ns>.svc.<domain> svc.<domain> <domain>, ndots:5.
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "failSwapOn": False,
        # No registry can give an image back: never collect one, never evict for the shared disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "maxPods": 110,
    }
    config.update(overrides)
    return config


def kube_proxy_config(*, kubeconfig: Path, node_name: str, pod_subnet: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": node_name,
        "clusterCIDR": pod_subnet,
        "bindAddress": "0.0.0.0",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Every Service hop is masqueraded: a pod answering a pod on the same bridge then answers
        # through the node, where the DNAT is undone. No route_localnet (no localhost NodePorts).
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        # Leave the (machine-wide) conntrack table size and timeouts alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def node_kubeconfig(*, api_port: int, ca_path: Path, token: str) -> dict[str, Any]:
    """What the kubelet and kube-proxy log in with: the API server as the node namespace reaches it."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": f"https://127.0.0.1:{api_port}", "certificate-authority": str(ca_path)},
            }
        ],
        "users": [{"name": "node", "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "node"}}],
        "current-context": "local",
    }


def api_endpoint_slice(*, node_ip: str, api_port: int) -> dict[str, Any]:
    """The `kubernetes` Service's endpoints as pods on the node reach them: the bridge's listener
    at the node's address (the API server's own endpoint reconciler is off: it refuses loopback)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "epd-local-cluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}],
    }


def egress_config(egress_socket: Path) -> dict[str, Any]:
    """The API server's egress selector: kubelets (logs, exec, port-forward) through the node bridge."""
    return {
        "apiVersion": "apiserver.k8s.io/v1beta1",
        "kind": "EgressSelectorConfiguration",
        "egressSelections": [
            {
                "name": "cluster",
                "connection": {
                    "proxyProtocol": "HTTPConnect",
                    "transport": {"uds": {"udsName": str(egress_socket)}},
                },
            }
        ],
    }


def read_sysctls() -> dict[str, str]:
    """The machine's values of the kernel settings the kubelet cares about (to show they never change)."""
    out = {}
    for key in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            out[key] = Path("/proc/sys", key).read_text().strip()
    return out
