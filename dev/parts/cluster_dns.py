"""The local cluster's DNS: CoreDNS (``dev/parts/coredns.py``) as a Deployment on the real node, deployed as
kubeadm deploys it: the ``coredns`` ServiceAccount in kube-system, bound to a ClusterRole that lists
and watches Services, EndpointSlices and Namespaces, and the ``kube-dns`` Service at the fixed ClusterIP
the kubelet's ``clusterDNS`` names. Pods (``dnsPolicy: ClusterFirst``) resolve ``<svc>``,
``<svc>.<ns>``, ``<svc>.<ns>.svc`` and ``<svc>.<ns>.svc.cluster.local`` through it.

Nothing outside the node's network namespace is reachable, so there is no upstream: names outside
the cluster's zones are answered NXDOMAIN at once.

CoreDNS runs as a non-root user without capabilities, so it listens on an unprivileged port
(``DNS_PORT``); the Service maps port 53 to it.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from dev.node.kube_config import CLUSTER_DNS_IP, CLUSTER_DOMAIN, REAL_NODE_LABEL

NAMESPACE = "kube-system"
NAME = "coredns"
SERVICE = "kube-dns"
LABELS = {"k8s-app": "kube-dns"}
DNS_PORT = 1053
HEALTH_PORT = 8080
READY_PORT = 8181
COREFILE = f"""{CLUSTER_DOMAIN}:{DNS_PORT} in-addr.arpa:{DNS_PORT} ip6.arpa:{DNS_PORT} {{
    errors
    health :{HEALTH_PORT}
    ready :{READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa
    cache 30
}}
.:{DNS_PORT} {{
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def objects(image: str) -> list[dict[str, Any]]:
    """The objects that run the cluster's DNS from ``image`` (a CoreDNS image, entrypoint the binary)."""
    meta = {"namespace": NAMESPACE, "labels": LABELS}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"system:{NAME}", "labels": LABELS},
            "rules": [
                {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"system:{NAME}", "labels": LABELS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"system:{NAME}"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, **meta}, "data": {"Corefile": COREFILE}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, **meta},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": LABELS},
                "template": {"metadata": {"labels": LABELS}, "spec": _pod_spec(image)},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, **meta},
            "spec": {
                "selector": LABELS,
                "clusterIP": CLUSTER_DNS_IP,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": "dns-tcp"},
                ],
            },
        },
    ]


def _pod_spec(image: str) -> dict[str, Any]:
    return {
        "serviceAccountName": NAME,
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        # CoreDNS must not resolve through itself.
        "dnsPolicy": "Default",
        "terminationGracePeriodSeconds": 1,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
        "containers": [
            {
                "name": "coredns",
                "image": image,
                "imagePullPolicy": "Never",
                "args": ["-conf", "/etc/coredns/Corefile"],
                "ports": [
                    {"name": "dns", "containerPort": DNS_PORT, "protocol": "UDP"},
                    {"name": "dns-tcp", "containerPort": DNS_PORT, "protocol": "TCP"},
                ],
                "readinessProbe": {"httpGet": {"path": "/ready", "port": READY_PORT}, "periodSeconds": 1},
                "livenessProbe": {
                    "httpGet": {"path": "/health", "port": HEALTH_PORT},
                    "periodSeconds": 10,
                    "failureThreshold": 5,
                },
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
            }
        ],
        "volumes": [{"name": "config", "configMap": {"name": NAME}}],
    }


def query_a(name: str, server: str = CLUSTER_DNS_IP, timeout: float = 1.0) -> tuple[int, list[str]]:
    """One DNS query for ``name``'s A records over UDP: the response code and the addresses.
    Run inside the node's network namespace (``python -m dev.parts.cluster_dns NAME``), where the
    ``kube-dns`` Service answers."""
    query_id = 0x4550
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.rstrip(".").split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.sendto(packet, (server, 53))
        reply = sock.recv(4096)
    got_id, flags, _, answers, _, _ = struct.unpack(">HHHHHH", reply[:12])
    if got_id != query_id:
        raise OSError(f"a DNS reply to another query ({got_id:#x})")
    at = 12 + len(question) + 4
    addresses = []
    for _ in range(answers):
        at = _skip_name(reply, at)
        rtype, _, _, length = struct.unpack(">HHIH", reply[at : at + 10])
        at += 10
        if rtype == 1 and length == 4:
            addresses.append(socket.inet_ntoa(reply[at : at + 4]))
        at += length
    return flags & 0xF, addresses


def _skip_name(message: bytes, at: int) -> int:
    while True:
        length = message[at]
        if length == 0:
            return at + 1
        if length & 0xC0 == 0xC0:  # a compression pointer ends the name
            return at + 2
        at += 1 + length


if __name__ == "__main__":
    import sys

    rcode, addresses = query_a(sys.argv[1])
    print(rcode, *addresses)
    sys.exit(0 if rcode == 0 and addresses else 1)
