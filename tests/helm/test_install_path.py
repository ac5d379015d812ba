"""The install path end to end: `helm template | kubectl apply` of both charts into the API
emulator, with the real `epd-operator` running as the chart's Deployment would run it, until the
EPDDeployment from the epd-deployment chart is reconciled into its tiers.

`helm install` itself cannot target the emulator (releases are stored as protobuf Secrets), so the
charts are rendered with `helm template` and applied with kubectl, as GitOps tools do.
"""
from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support.kubectl import kubectl

from .charts import DEPLOYMENT_CHART, OPERATOR_CHART, Helm, by_kind, ci_values, one

pytestmark = [
    pytest.mark.helm,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

OPERATOR_NAMESPACE = "epd-system"
WORKLOAD_NAMESPACE = "ml"
SCENARIO = DEPLOYMENT_CHART / "ci" / "epd-shared-storage-values.yaml"
RECONCILE_WAIT_S = 60


async def kubectl_apply(kube_env: dict[str, str], objects: list[dict[str, Any]]) -> str:
    return await kubectl(kube_env, "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(objects))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def operator_command(deployment: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The operator container's command line and literal env, as the chart renders them."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    exe = str(Path(sys.executable).with_name(container["command"][0]))
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env.update(POD_NAMESPACE=deployment["metadata"]["namespace"], POD_NAME=f"{deployment['metadata']['name']}-test")
    return [exe, *container.get("args", [])], env


async def wait_for(condition, what: str, process: asyncio.subprocess.Process, log: Path):
    """Poll until `condition()` is truthy; fail with the operator's log when it never is."""
    for _ in range(RECONCILE_WAIT_S * 10):
        result = condition()
        if result:
            return result
        if process.returncode is not None:
            break
        await asyncio.sleep(0.1)
    pytest.fail(f"{what} did not happen (operator exit code {process.returncode}); its log:\n"
                f"{log.read_text(errors='replace')[-4000:]}")


@pytest.fixture
def helm4() -> Helm:
    from tests.support.helm import HelmUnavailable, ensure_helm
    try:
        return Helm(ensure_helm(4))
    except HelmUnavailable as exc:
        pytest.skip(f"helm 4 unavailable: {exc}")


async def install_operator_chart(helm: Helm, kube_env: dict[str, str], *sets: str) -> list[dict[str, Any]]:
    """`helm template epd-operator | kubectl apply`; returns what was applied."""
    objects = [o for o in helm.template(OPERATOR_CHART, None, f"watchNamespaces={{{WORKLOAD_NAMESPACE}}}", *sets,
                                        namespace=OPERATOR_NAMESPACE)
               if o["kind"] != "Pod"]  # the `helm test` hook runs only under `helm test`
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                  for n in (OPERATOR_NAMESPACE, WORKLOAD_NAMESPACE)]
    # CRDs first, as `helm install` does with crds/: the custom type must exist before its objects.
    crds = by_kind(objects, "CustomResourceDefinition")
    await kubectl_apply(kube_env, namespaces + crds)
    await kubectl_apply(kube_env, [o for o in objects if o not in crds])
    return objects


async def test_both_charts_apply_into_the_api(helm4: Helm, apiserver, kube_env: dict[str, str]):
    """Every scenario's EPDDeployment passes the served CRD's schema and CEL rules on apply."""
    objects = await install_operator_chart(helm4, kube_env)
    for obj in objects:
        meta = obj["metadata"]
        assert apiserver.get_object(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace")), meta["name"]
    for values in [None, *ci_values(DEPLOYMENT_CHART)]:
        (epd,) = helm4.template(DEPLOYMENT_CHART, values, release="defaults", namespace=WORKLOAD_NAMESPACE)
        out = await kubectl_apply(kube_env, [epd])
        assert f"epddeployment.serving.epd.dev/{epd['metadata']['name']} created" in out


@pytest.mark.timeout(180)
async def test_helm_template_kubectl_apply_reconciles(helm4: Helm, apiserver,
                                                      kube_env: dict[str, str], tmp_path: Path):
    # Loopback ports picked now, passed through the chart's own values into the operator's flags.
    health_port, metrics_port = free_port(), free_port()
    operator_objects = await install_operator_chart(helm4, kube_env, f"health.port={health_port}",
                                                    f"metrics.port={metrics_port}",
                                                    "extraArgs={--bind-address=127.0.0.1}")
    deployment = one(operator_objects, "Deployment")
    argv, env = operator_command(deployment)
    log = tmp_path / "operator.log"
    with log.open("wb") as log_file:  # a file, not a pipe: nobody must have to drain it
        operator = await asyncio.create_subprocess_exec(
            *argv, env={**kube_env, **env}, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        (epd,) = helm4.template(DEPLOYMENT_CHART, SCENARIO, "fullnameOverride=my-vl", namespace=WORKLOAD_NAMESPACE)
        out = await kubectl_apply(kube_env, [epd])
        assert "epddeployment.serving.epd.dev/my-vl created" in out

        def tier_deployments() -> dict[str, dict[str, Any]]:
            found = {d["metadata"]["labels"].get("serving.epd.dev/role"): d
                     for d in apiserver.list_objects("apps/v1", "Deployment", WORKLOAD_NAMESPACE)}
            return found if {"encoder", "decode", "router"} <= set(found) else {}

        tiers = await wait_for(tier_deployments, "encoder, decode and router Deployments", operator, log)
        assert "prefill" not in tiers, "E+PD must not get a prefill tier"
        cr = apiserver.get_object("serving.epd.dev/v1alpha1", "EPDDeployment", "my-vl", WORKLOAD_NAMESPACE)
        for tier in tiers.values():
            (owner,) = tier["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("EPDDeployment", "my-vl", cr["metadata"]["uid"])

        def reported_status() -> dict[str, Any] | None:
            obj = apiserver.get_object("serving.epd.dev/v1alpha1", "EPDDeployment", "my-vl", WORKLOAD_NAMESPACE)
            status = obj.get("status") or {}
            return status if status.get("observedGeneration") == obj["metadata"]["generation"] else None

        status = await wait_for(reported_status, "status.observedGeneration catching up", operator, log)
        assert status["topology"] == "E+PD"

        # What the kubelet and Prometheus would see on the ports the chart declares.
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        probe = container["livenessProbe"]["httpGet"]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{health_port}{probe['path']}") as response:
                assert response.status == 200
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as response:
                assert response.status == 200 and "# TYPE" in await response.text()

        # The `helm test` hook's own script, pointed at loopback instead of the in-cluster Service.
        (hook,) = by_kind(helm4.template(OPERATOR_CHART, None, f"metrics.service.port={metrics_port}",
                                         namespace=OPERATOR_NAMESPACE), "Pod")
        script = hook["spec"]["containers"][0]["command"][-1]
        service_url = f"http://{one(operator_objects, 'Service')['metadata']['name']}.{OPERATOR_NAMESPACE}.svc"
        assert service_url in script
        check = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script.replace(service_url, "http://127.0.0.1"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = await check.communicate()
        assert check.returncode == 0, out.decode()
    finally:
        if operator.returncode is None:
            operator.terminate()
            try:
                await asyncio.wait_for(operator.wait(), timeout=15)
            except asyncio.TimeoutError:
                operator.kill()
                await operator.wait()
