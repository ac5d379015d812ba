"""The operator on a real kind cluster: image built and loaded, chart installed with helm, an
example EPDDeployment applied, its objects and status checked, then deleted and collected.

Runs where `kind` and a working Docker are available (CI, laptops); skipped with the reason
otherwise. `EPD_KIND_CLUSTER=<name>` reuses an existing kind cluster instead of creating (and
deleting) a throwaway one. vLLM pods cannot become ready without GPUs and model weights, so the
checks stop at what the operator controls: objects, owner references, status and events.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.helm import HelmUnavailable, ensure_helm

REPO = Path(__file__).resolve().parents[3]
IMAGE = "epd-operator:kind-e2e"
EXAMPLE = REPO / "examples" / "epd-nixl-autoscaled.yaml"
NAMESPACE = "epd-e2e"


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def _missing() -> str | None:
    if shutil.which("kind") is None:
        return "kind is not installed"
    if shutil.which("kubectl") is None:
        return "kubectl is not installed"
    if not _docker_works():
        return "no working Docker daemon (kind needs one)"
    return None


pytestmark = [
    pytest.mark.kind,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(_missing() is not None, reason=_missing() or ""),
]


def sh(*cmd: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 600) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, input=stdin, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def kube_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    existing = os.environ.get("EPD_KIND_CLUSTER")
    name = existing or f"epd-e2e-{uuid.uuid4().hex[:6]}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    if not existing:
        sh("kind", "create", "cluster", "--name", name, "--wait", "120s", "--kubeconfig", str(kubeconfig), timeout=900)
    else:
        kubeconfig.write_text(sh("kind", "get", "kubeconfig", "--name", name))
    try:
        yield {**os.environ, "KUBECONFIG": str(kubeconfig), "_KIND_CLUSTER": name}
    finally:
        if not existing:
            subprocess.run(["kind", "delete", "cluster", "--name", name], capture_output=True, timeout=600)


@pytest.fixture(scope="module")
def operator_installed(kube_env: dict[str, str]) -> Iterator[dict[str, str]]:
    try:
        helm = str(ensure_helm(3))
    except HelmUnavailable as exc:
        pytest.skip(f"no helm: {exc}")
    sh("docker", "build", "-t", IMAGE, "-f", "images/operator/Dockerfile", str(REPO), timeout=1200)
    sh("kind", "load", "docker-image", IMAGE, "--name", kube_env["_KIND_CLUSTER"], timeout=600)
    repository, tag = IMAGE.split(":")
    sh(
        helm,
        "install",
        "epd-operator",
        str(REPO / "charts" / "epd-operator"),
        "--namespace",
        "epd-system",
        "--create-namespace",
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
        "--wait",
        "--timeout",
        "5m",
        env=kube_env,
    )
    sh("kubectl", "create", "namespace", NAMESPACE, env=kube_env)
    yield kube_env
    subprocess.run([helm, "uninstall", "epd-operator", "--namespace", "epd-system"], env=kube_env, capture_output=True)


def get_json(env: dict[str, str], *args: str) -> dict:
    return json.loads(sh("kubectl", "get", *args, "-n", NAMESPACE, "-o", "json", env=env))


def wait_for(check, timeout: float = 180, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(2)


def test_an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(operator_installed):
    env = operator_installed
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["namespace"] = NAMESPACE
    sh("kubectl", "apply", "-f", "-", stdin=yaml.safe_dump(doc), env=env)
    name = doc["metadata"]["name"]

    def status() -> dict:
        return get_json(env, "epd", name).get("status", {})

    wait_for(lambda: status().get("observedGeneration") == 1, what="the operator to reconcile the example")
    epd = get_json(env, "epd", name)
    assert status()["topology"] == "E/P/D"
    # AutoscalingActive: the example autoscales its encoders
    assert {c["type"] for c in status()["conditions"]} == {
        "Ready",
        "Progressing",
        "Degraded",
        "SpecValid",
        "AutoscalingActive",
    }

    deployments = get_json(env, "deployments", "-l", f"app.kubernetes.io/instance={name}")["items"]
    assert {d["metadata"]["name"] for d in deployments} == {
        f"{name}-{t}" for t in ("encoder", "prefill", "decode", "router")
    }
    for dep in deployments:
        assert dep["metadata"]["ownerReferences"][0]["uid"] == epd["metadata"]["uid"]
    hpa = get_json(env, "hpa", f"{name}-encoder")
    assert hpa["spec"]["minReplicas"] == 2
    table = sh("kubectl", "get", "epd", "-n", NAMESPACE, env=env)
    assert table.split()[:6] == ["NAME", "TOPOLOGY", "ENCODER", "PREFILL", "DECODE", "PHASE"]

    sh("kubectl", "delete", "epd", name, "-n", NAMESPACE, "--wait=true", env=env)
    wait_for(
        lambda: not get_json(env, "deployments", "-l", f"app.kubernetes.io/instance={name}")["items"],
        what="garbage collection of the tiers",
    )
