"""The local cluster's NetworkPolicy engine: kube-router with its firewall alone, inside the node."""

from __future__ import annotations

from pathlib import Path

from dev.node import real_node
from dev.parts import kube_router


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:] if arg.startswith("--"))


def test_only_the_firewall_runs():
    argv = kube_router.argv(
        Path("/cache/kube-router"),
        kubeconfig=Path("/node/kubeconfig"),
        node_name="cpu-node-1",
        service_cidr="10.96.0.0/16",
    )
    flags = _flags(argv)
    assert argv[0] == "/cache/kube-router"
    assert flags["run-firewall"] == "true"
    # no routes, no IPVS service proxy (the subject of the release's advisory), no CNI config written
    assert flags["run-router"] == flags["run-service-proxy"] == flags["enable-cni"] == "false"
    assert flags["kubeconfig"] == "/node/kubeconfig"
    assert flags["hostname-override"] == "cpu-node-1"
    assert flags["service-cluster-ip-range"] == "10.96.0.0/16"


def test_the_node_needs_ipset_and_says_how_to_get_it():
    assert "ipset" in real_node.RUNTIME_BINARIES
    assert "ipset" in real_node.APT_PACKAGES.split()


def test_readiness_is_read_inside_the_node(monkeypatch):
    calls = []

    class Node:
        def enter_argv(self):
            return ["nsenter", "--net=/proc/1/ns/net", "--mount=/proc/1/ns/mnt", "--"]

    class Done:
        returncode = 0

    def run(argv, **_):
        calls.append(argv)
        return Done()

    monkeypatch.setattr(kube_router.subprocess, "run", run)
    assert kube_router.synced(Node())  # type: ignore[arg-type]
    assert calls == [
        ["nsenter", "--net=/proc/1/ns/net", "--mount=/proc/1/ns/mnt", "--", "iptables", "-S", "KUBE-ROUTER-FORWARD"]
    ]
