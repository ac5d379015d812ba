"""The cluster's DNS: CoreDNS (github.com/coredns/coredns) on the real node, built from the Go module proxy and
deployed as kubeadm deploys it.

**Build.** The release's own ``main`` compiles in every plugin (cloud DNS providers' SDKs included). The binary
built here is CoreDNS's ``coremain`` with the plugins the cluster's Corefile uses (``PLUGINS``): a ``main``
package importing those plugins, built static (``CGO_ENABLED=0``) in the release's module against its own
go.mod and go.sum (``dev/builds/go_module.py``), into ``~/.cache/epd-operator/coredns/<version>/``. Cold (empty Go
build cache, dependencies downloaded): 21.5 minutes on a 2-core machine at a load average of 14-20, 5.7
CPU-minutes. Its image (:data:`IMAGE`, ``dev/builds/images.py``) is that binary alone.

**Run.** A Deployment on the real node: the ``coredns`` ServiceAccount in kube-system, bound to a ClusterRole
that lists and watches Services, EndpointSlices and Namespaces, and the ``kube-dns`` Service at the fixed
ClusterIP the kubelet's ``clusterDNS`` names. Pods (``dnsPolicy: ClusterFirst``) resolve ``<svc>``,
``<svc>.<ns>``, ``<svc>.<ns>.svc`` and ``<svc>.<ns>.svc.cluster.local`` through it. Nothing outside the node's
network namespace is reachable, so there is no upstream: names outside the cluster's zones are answered
NXDOMAIN at once. CoreDNS runs as a non-root user without capabilities, so it listens on an unprivileged port
(``DNS_PORT``); the Service maps port 53 to it.

**Ready** when the ``kubernetes`` Service's name resolves through the ``kube-dns`` Service from inside the
node's network namespace, as a pod's lookup does (:func:`query_a`).

    python -m dev.parts build coredns                                 # build (or find) it
    python -m dev.parts.coredns kubernetes.default.svc.cluster.local  # one lookup, inside the node's namespace
"""

from __future__ import annotations

import hashlib
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from dev.builds import go_module
from dev.builds.k8s_binaries import log
from dev.cluster.api import ClusterError
from dev.cluster.components import ClusterComponents
from dev.node.kube_config import CLUSTER_DNS_IP, CLUSTER_DOMAIN, REAL_NODE_LABEL
from dev.parts.part import WITH_REAL_NODE, GoPart
from dev.paths import REPO

MODULE = "github.com/coredns/coredns"
VERSION = "v1.15.0"
# The plugins the Corefile below names; the rest of CoreDNS's directives stay known to the Corefile parser but
# are not compiled in.
PLUGINS = ("errors", "health", "ready", "kubernetes", "cache", "template")
IMAGE = f"localhost/epd-coredns:{VERSION}"

_MAIN = """package main

import (
\t"github.com/coredns/coredns/coremain"
{imports}
)

func main() {{
\tcoremain.Run()
}}
"""

# Keyed by the version and the plugin set.
COREDNS = go_module.GoBinary(
    "coredns",
    MODULE,
    VERSION,
    "./cmd/epd-coredns",
    f"coredns-{hashlib.sha256(' '.join(PLUGINS).encode()).hexdigest()[:8]}",
    files={"cmd/epd-coredns/main.go": _MAIN.format(imports="\n".join(f'\t_ "{MODULE}/plugin/{p}"' for p in PLUGINS))},
)


class CoreDNS(GoPart):
    name = "coredns"
    summary = "the cluster's DNS: CoreDNS behind the kube-dns Service, on the real node"
    starts = WITH_REAL_NODE
    needs_real_node = True
    BINARIES = (COREDNS,)
    images = ("coredns",)

    def configure(self, cluster: ClusterComponents) -> None:
        """Its ServiceAccount, RBAC, Corefile and the kube-dns Service."""
        self.since = time.monotonic()
        for obj in objects(IMAGE):
            if obj["kind"] != "Deployment":
                cluster.apply(obj)

    def start(self, cluster: ClusterComponents) -> None:
        """The Deployment (its image is already in the node's containerd)."""
        for obj in objects(IMAGE):
            if obj["kind"] == "Deployment":
                cluster.apply(obj)

    def ready(self, cluster: ClusterComponents, timeout: float) -> None:
        """Until the `kubernetes` Service's name resolves through `kube-dns` inside the node's namespace."""
        node = cluster.real_node()
        probe = node.netns_argv(sys.executable, "-m", "dev.parts.coredns", f"kubernetes.default.svc.{CLUSTER_DOMAIN}")
        deadline = time.monotonic() + timeout
        while True:
            answer = subprocess.run(probe, capture_output=True, text=True, cwd=REPO, timeout=30)
            if answer.returncode == 0:
                break
            cluster.check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the cluster's DNS did not answer in {timeout:.0f} s: {(answer.stdout + answer.stderr).strip()[-500:]}"
                )
            time.sleep(0.5)
        log(f"cluster DNS ({CLUSTER_DNS_IP}) answers, {time.monotonic() - self.since:.1f} s after the node was Ready")


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
    Run inside the node's network namespace (``python -m dev.parts.coredns NAME``), where the
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
    rcode, addresses = query_a(sys.argv[1])
    print(rcode, *addresses)
    sys.exit(0 if rcode == 0 and addresses else 1)
