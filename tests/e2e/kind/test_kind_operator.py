"""The operator on a real kind cluster: image built and loaded, chart installed with helm, then the
lifecycle of tests/support/operator_e2e.py (the same body runs on the local cluster's real node,
tests/node/test_operator_on_real_node.py).

Runs where `kind` and a working Docker are available (CI, laptops); skipped with the reason
otherwise. `EPD_KIND_CLUSTER=<name>` reuses an existing kind cluster instead of creating (and
deleting) a throwaway one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.support.helm import HelmUnavailable, ensure_helm
from tests.support.operator_e2e import (
    NAMESPACE,
    REPO,
    an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete,
    sh,
)

IMAGE = "epd-operator:kind-e2e"


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


def test_an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(operator_installed):
    an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(operator_installed)
