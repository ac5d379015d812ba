"""What the real-node tests (tests/node) share: whether a real node can run here, and the operator
installed from its chart the way the README says, from the locally built image."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, NamedTuple

from dev.cluster.local import LocalCluster
from dev.node import real_node
from tests.support.cluster import KubeView, epd_crd, install_crd, wait_for

CHART = Path(__file__).resolve().parents[2] / "charts" / "epd-operator"


def unavailable() -> str | None:
    """Why a real node cannot run here (root, the runtime packages, the cgroup layout), or None."""
    return real_node.unavailable()


def is_ready(pod: dict[str, Any] | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class InstalledOperator(NamedTuple):
    system: KubeView  # the chart's namespace, epd-system
    pod: dict[str, Any]  # the operator's pod, ready

    def logs(self) -> str:
        return self.system.kubectl("-n", self.system.ns, "logs", self.pod["metadata"]["name"], check=False).stdout[
            -2000:
        ]


def install_operator_chart(
    cluster: LocalCluster, workdir: Path, *extra: str, load_image: bool = True
) -> InstalledOperator:
    """The README's plain `helm install epd-operator charts/epd-operator`: the chart's default image
    name, loaded into the node from the local build (unless `load_image` is False: loaded already);
    returns once the operator pod is ready."""
    from dev.builds.images import build_operator
    from tests.support.helm import ensure_helm

    if load_image:
        cluster.real_node().load_image(build_operator())
    install_crd(cluster, epd_crd())
    kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig", cluster.admin_token, user="epd-admin")
    system = KubeView(cluster, "epd-system", kubeconfig)
    installed = subprocess.run(
        [str(ensure_helm(3)), "install", "epd-operator", str(CHART), "-n", "epd-system", "--create-namespace", *extra],
        capture_output=True,
        text=True,
        env=system.env(),
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    pods = lambda: system.list("v1", "Pod", labels={"app.kubernetes.io/name": "epd-operator"})  # noqa: E731
    pod = wait_for(
        lambda: next((p for p in pods() if is_ready(p)), None),
        300,
        lambda: f"the operator pod is not ready: {system.pods()}",
        interval=1,
    )
    return InstalledOperator(system, pod)
