"""The local control plane itself: what `make cluster` and the test fixtures rely on."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dev import paths
from dev.builds import k8s_binaries
from dev.cluster.local import NEWEST, LocalCluster
from epd_operator.kube import ApiError

STARTER = """
import json, sys, time
from dev.cluster.local import LocalCluster
c = LocalCluster(apiserver_only=True)
c.start()
print(json.dumps({"port": c.port, "pids": [x.process.pid for x in c.components]}), flush=True)
time.sleep(600)
"""


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def test_a_crashed_owner_leaves_nothing_running_or_listening():
    owner = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    try:
        started = json.loads(owner.stdout.readline())
        assert _listening(started["port"]) and all(_alive(p) for p in started["pids"])
        owner.send_signal(signal.SIGKILL)  # no cleanup code runs
        owner.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (_listening(started["port"]) or any(_alive(p) for p in started["pids"])):
            time.sleep(0.2)
        assert not _listening(started["port"])
        assert not [p for p in started["pids"] if _alive(p)]
    finally:
        owner.kill()
        owner.wait()
        owner.stdout.close()


def test_kubebuilder_assets_are_honoured_for_what_they_hold(tmp_path, monkeypatch):
    # envtest's asset folders hold etcd, kube-apiserver and kubectl; the rest come from our build.
    assets = tmp_path / "assets"
    assets.mkdir()
    for name in ("etcd", "kube-apiserver", "kubectl"):
        (assets / name).write_text("#!/bin/sh\n")
        (assets / name).chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    assert k8s_binaries.binaries(NEWEST, apiserver_only=True) == assets
    ours = tmp_path / "cache" / "k8s" / NEWEST
    ours.mkdir(parents=True)
    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        (ours / name).write_text("#!/bin/sh\n")
        (ours / name).chmod(0o755)
    mixed = k8s_binaries.binaries(NEWEST)
    assert {p.name: p.resolve() for p in mixed.iterdir()} == {
        "etcd": assets / "etcd",
        "kube-apiserver": assets / "kube-apiserver",
        "kubectl": assets / "kubectl",
        "kube-controller-manager": ours / "kube-controller-manager",
        "kube-scheduler": ours / "kube-scheduler",
        "kwok": ours / "kwok",
    }


def test_fake_nodes_carry_gpu_capacity_labels_and_taints_a_test_chooses(k8s: LocalCluster, kube):
    from dev.cluster.local import FakeNode

    node = FakeNode(
        "a100-node",
        gpus=2,
        labels={"gpu": "a100"},
        taints=({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},),
    )
    k8s.add_nodes(node)
    try:
        got = kube.get("v1", "Node", "a100-node")
        assert got["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        assert got["metadata"]["labels"]["gpu"] == "a100"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in got["spec"]["taints"]
    finally:
        k8s.remove_node("a100-node")


def test_requests_go_as_the_admin_unless_they_name_a_service_accounts_token(k8s: LocalCluster, kube):
    # A bound token from a real TokenRequest, then the same read as that account and as the admin:
    # the account has no RBAC grants, so the server refuses it and says who asked.
    kube.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}})
    token = k8s.service_account_token(kube.ns, "nobody")
    path = f"/api/v1/namespaces/{kube.ns}/configmaps"
    status, body = kube.request("GET", path, token=token)
    assert status == 403
    assert body["reason"] == "Forbidden"
    assert f"system:serviceaccount:{kube.ns}:nobody" in body["message"]
    with pytest.raises(ApiError) as refused:
        k8s.request("GET", path, token=token)
    assert refused.value.status == 403 and refused.value.reason == "Forbidden"
    assert k8s.request("GET", path)["kind"] == "ConfigMapList"
