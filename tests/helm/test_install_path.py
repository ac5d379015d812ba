"""The install path end to end on a REAL control plane, as a user runs it: `helm install` of the
operator chart (its CRD included), the operator running with the chart's ServiceAccount token (so
the chart's RBAC is what the API server enforces), `helm install` / `helm upgrade` / `helm uninstall`
of an EPDDeployment from the epd-deployment chart, with helm 3 and helm 4.

The chart's operator Deployment is scheduled on a fake node and runs nothing there (kwok); the
operator under test is the same console script with the same arguments, run here as a process.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dev.cluster.local import LocalCluster
from tests.support.cluster import KubeView, volumes, wait_for
from tests.support.operator_run import OperatorProcess, wait_until

from .charts import DEPLOYMENT_CHART, OPERATOR_CHART, Helm

pytestmark = [pytest.mark.helm, pytest.mark.timeout(300)]

OPERATOR_NAMESPACE = "epd-system"
WORKLOAD_NAMESPACE = "ml"
SCENARIO = DEPLOYMENT_CHART / "ci" / "epd-shared-storage-values.yaml"
CRD_NAME = "epddeployments.serving.epd.dev"


@pytest.fixture(scope="module")
def cluster(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster per helm major: `helm install` must be the one that creates the CRD. (Helm 4
    installs CRDs with server-side apply and conflicts on `.spec.versions` with a CRD helm 3
    created; docs/helm.md's CRD upgrade notes say how to take it over.)"""
    with LocalCluster(tmp_path_factory.mktemp(f"helm{helm.major}-k8s")) as c:
        yield c


def helm_on(helm: Helm, cluster: LocalCluster, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path)}
    proc = subprocess.run([str(helm.binary), *args], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return proc.stdout


def view(cluster: LocalCluster, namespace: str, tmp_path: Path) -> KubeView:
    kubeconfig = cluster.write_kubeconfig(
        tmp_path / f"admin-{namespace}", cluster.admin_token, user="epd-admin", namespace=namespace
    )
    return KubeView(cluster, namespace, kubeconfig)


def operator_args(deployment: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The operator container's arguments and literal env, as installed by the chart."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["epd-operator"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env.update(POD_NAMESPACE=deployment["metadata"]["namespace"], POD_NAME=f"{deployment['metadata']['name']}-test")
    return list(container.get("args", [])), env


def epd_status(kube: KubeView, name: str) -> dict[str, Any]:
    obj = kube.get("serving.epd.dev/v1alpha1", "EPDDeployment", name) or {}
    return obj.get("status") or {}


async def test_helm_install_upgrade_uninstall_with_the_charts_rbac(helm: Helm, cluster: LocalCluster, tmp_path: Path):
    release = f"epd-h{helm.major}"
    # A namespaced install binds the operator's Role in each watched namespace: they must exist first.
    ml = view(cluster, WORKLOAD_NAMESPACE, tmp_path)
    if ml.get("v1", "Namespace", WORKLOAD_NAMESPACE) is None:
        ml.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOAD_NAMESPACE}})
        volumes(ml, "ec-cache")
    helm_on(
        helm,
        cluster,
        "install",
        release,
        str(OPERATOR_CHART),
        "-n",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        "--set",
        f"watchNamespaces={{{WORKLOAD_NAMESPACE}}}",
    )
    system = view(cluster, OPERATOR_NAMESPACE, tmp_path)
    crd = system.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", CRD_NAME)
    assert crd is not None, "helm install did not create the CRD from crds/"
    wait_for(
        lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (system.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", CRD_NAME) or {})
            .get("status", {})
            .get("conditions")
            or []
        ),
        30,
        "the CRD was not established",
    )

    [deployment] = system.list("apps/v1", "Deployment", labels={"app.kubernetes.io/instance": release})
    args, env = operator_args(deployment)
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = cluster.service_account_token(OPERATOR_NAMESPACE, account)
    sa_kubeconfig = cluster.write_kubeconfig(tmp_path / "operator-kubeconfig", token, user=account)

    # The chart's own Lease timing (15 s), not the short one process tests use.
    async with OperatorProcess(sa_kubeconfig, *args, env={**os.environ, **env}, lease_duration=15.0) as op:
        await op.wait_for_role("leader")
        helm_on(
            helm,
            cluster,
            "install",
            "my-vl",
            str(DEPLOYMENT_CHART),
            "-n",
            WORKLOAD_NAMESPACE,
            "-f",
            str(SCENARIO),
            "--set",
            "fullnameOverride=my-vl",
        )
        await wait_until(
            lambda: epd_status(ml, "my-vl").get("phase") == "Ready",
            90,
            lambda: f"{epd_status(ml, 'my-vl')}\n{op.output[-4000:]}",
        )
        tiers = {
            d["metadata"]["labels"]["serving.epd.dev/role"]: d
            for d in ml.list("apps/v1", "Deployment")
            if d["metadata"]["labels"].get("app.kubernetes.io/instance") == "my-vl"
        }
        assert set(tiers) == {"encoder", "decode", "router"}

        helm_on(
            helm,
            cluster,
            "upgrade",
            "my-vl",
            str(DEPLOYMENT_CHART),
            "-n",
            WORKLOAD_NAMESPACE,
            "-f",
            str(SCENARIO),
            "--set",
            "fullnameOverride=my-vl",
            "--set",
            "decode.replicas=3",
        )
        await wait_until(
            lambda: (
                epd_status(ml, "my-vl").get("tiers", {}).get("decode", {}).get("ready") == "3/3"
                and epd_status(ml, "my-vl").get("phase") == "Ready"
            ),
            90,
            lambda: epd_status(ml, "my-vl"),
        )

        helm_on(helm, cluster, "uninstall", "my-vl", "-n", WORKLOAD_NAMESPACE)
        await wait_until(
            lambda: (
                not [
                    d
                    for d in ml.list("apps/v1", "Deployment")
                    if d["metadata"]["labels"].get("app.kubernetes.io/instance") == "my-vl"
                ]
            ),
            60,
            "the tiers were not garbage-collected after helm uninstall",
        )
        await wait_until(lambda: not ml.pods(**{"app.kubernetes.io/instance": "my-vl"}), 60, "pods left behind")
        assert await op.stop() == 0, op.output
    # The chart's RBAC covered everything the operator did.
    assert "Forbidden" not in op.output and "forbidden" not in op.output, op.output[-4000:]

    helm_on(helm, cluster, "uninstall", release, "-n", OPERATOR_NAMESPACE)
    assert not system.list("apps/v1", "Deployment", labels={"app.kubernetes.io/instance": release})
    # Helm never deletes CRDs it installed from crds/ (documented in docs/helm.md, "CRD upgrades").
    assert system.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", CRD_NAME) is not None
    listing = json.loads(helm_on(helm, cluster, "list", "-A", "-o", "json"))
    assert [r["name"] for r in listing] == []


async def test_an_umbrella_chart_installs_and_tenants_get_edit_and_view_rights(
    helm: Helm, cluster: LocalCluster, tmp_path: Path
):
    """Both charts as subcharts of a platform team's chart, installed for real; the chart's aggregated
    ClusterRoles reach the built-in edit/view roles through the real aggregation controller."""
    import yaml

    chart = tmp_path / "platform"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "type": "application",
                "dependencies": [
                    {"name": "epd-operator", "version": "0.1.0", "repository": f"file://{OPERATOR_CHART}"},
                    {"name": "epd-deployment", "version": "0.1.0", "repository": f"file://{DEPLOYMENT_CHART}"},
                ],
            }
        )
    )
    (chart / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {"labels": {"team": "ml-platform"}},
                "epd-operator": {"watchNamespaces": ["platform"]},
                "epd-deployment": {"fullnameOverride": "qwen-vl"},
            }
        )
    )
    helm_on(helm, cluster, "dependency", "build", str(chart))
    platform = view(cluster, "platform", tmp_path)
    if platform.get("v1", "Namespace", "platform") is None:
        platform.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "platform"}})
    helm_on(helm, cluster, "install", f"platform-h{helm.major}", str(chart), "-n", "platform")
    try:
        epd = platform.get("serving.epd.dev/v1alpha1", "EPDDeployment", "qwen-vl")
        assert epd is not None and epd["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "Helm"

        def grants(role: str) -> set[str]:
            rules = (platform.get("rbac.authorization.k8s.io/v1", "ClusterRole", role) or {}).get("rules") or []
            return {
                verb
                for r in rules
                if "serving.epd.dev" in r.get("apiGroups", []) and "epddeployments" in r.get("resources", [])
                for verb in r.get("verbs", [])
            }

        wait_for(lambda: {"create", "update", "delete"} <= grants("edit"), 30, lambda: grants("edit"))
        wait_for(lambda: {"get", "list", "watch"} <= grants("view"), 30, lambda: grants("view"))
        assert not {"create", "update", "patch", "delete"} & grants("view")
    finally:
        helm_on(helm, cluster, "uninstall", f"platform-h{helm.major}", "-n", "platform")
