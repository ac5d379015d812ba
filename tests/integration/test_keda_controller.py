"""An encoder tier scaled by the real KEDA on a REAL control plane: KEDA's operator and metrics server,
built from its Go module and run against the local cluster with its own CRDs (dev/parts/keda.py), the metrics
server registered as the external.metrics.k8s.io APIService. The operator renders the ScaledObject; KEDA
accepts it, creates its HPA, queries the load trigger from a real Prometheus (Debian's package) and serves
the value through the APIService; kube-controller-manager's HPA controller reads it and scales the encoder
Deployment, and KEDA itself takes the tier to zero and back. The EPDDeployment's status carries KEDA's
verdict throughout.

What is not real here: the routers' exposition comes from RouterMetrics (the router's own registry) served
by the test, with the encoder demand it sets, and the pods are kwok's. This local
kube-apiserver calls aggregated APIs anonymously (no front-proxy certificates): dev/parts/keda.py lets the
anonymous user read external.metrics.k8s.io while KEDA runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.cluster.local import LocalCluster
from dev.parts import keda
from dev.ports import free_port
from epd_operator.controller.apply import REFUSED_WHEN_WRITTEN
from epd_operator.router.metrics import RouterMetrics
from tests.support.cluster import KubeView, epd_crd, install_crd, logged_process, new_namespace, volumes
from tests.support.operator_run import (
    condition,
    create,
    deployment,
    epd,
    epd_doc,
    events,
    full_passes,
    observed,
    operator_in_process,
    patch_spec,
    posted,
    wait_until,
)
from tests.support.prom import log_tail, serve_exposition

# KEDA is a late build: `make test` runs this module once `make k8s` has built it (dev/testing/test_streams.py).
pytestmark = [pytest.mark.timeout(600), pytest.mark.late_build]

KEDA_API = "keda.sh/v1alpha1"
ROUTER_POD = "vl-router-6c9d7f8b5-q4w8z"
DEPLOYMENT = "vl"  # epd_doc()'s EPDDeployment: the routers' --deployment, the demand's label
# The encoder demand in items; KEDA hands the sum to its HPA as an AverageValue target of 4 per pod: ceil(12 / 4) = 3.
DEMAND = 12
EXPECTED_REPLICAS = 3


class RouterExposition:
    """A router's /metrics (its own RouterMetrics) with a settable encoder demand of the deployment."""

    def __init__(self) -> None:
        self.metrics = RouterMetrics()
        self.demand = self.metrics.encoder_demand.labels(DEPLOYMENT)

    def set_demand(self, n: int) -> None:
        self.demand.set(n)

    @contextlib.contextmanager
    def serve(self) -> Iterator[int]:
        with serve_exposition(self.metrics) as port:
            yield port


@pytest.fixture(scope="module")
def k8s_keda(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if not keda.Keda().built():
        pytest.skip(
            f"KEDA {keda.VERSION} is not built: `make k8s` (or `python -m dev.parts build keda`, about 9 minutes on 2 idle cores)"
        )
    if shutil.which("prometheus") is None:
        pytest.skip("Prometheus is not installed (Debian/Ubuntu: apt-get install prometheus; `make test-tools`)")
    with LocalCluster(tmp_path_factory.mktemp("k8s-keda"), parts=("keda",)) as cluster:
        install_crd(cluster, epd_crd())
        yield cluster


@pytest.fixture
def ns(k8s_keda: LocalCluster, tmp_path: Path) -> Iterator[KubeView]:
    view = new_namespace(k8s_keda, tmp_path)
    volumes(view, "ec-cache", "models")
    # What the example asks for before it is applied. KEDA reads the Secrets its target's containers take
    # environment from (a trigger may name such a variable), and refuses the ScaledObject while one is missing.
    view.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-token", "namespace": view.ns},
            "stringData": {"token": "hf_not_a_token"},
        }
    )
    yield view
    view.request("DELETE", f"/api/v1/namespaces/{view.ns}")


@contextlib.contextmanager
def prometheus(kube: KubeView, router_port: int, tmp: Path) -> Iterator[int]:
    """Prometheus scraping the router exposition every second, labelled as a PodMonitor labels a router pod."""
    port = free_port()
    config = tmp / "prometheus.yml"
    target = {"targets": [f"127.0.0.1:{router_port}"], "labels": {"namespace": kube.ns, "pod": ROUTER_POD}}
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [{"job_name": "epd-routers", "static_configs": [target]}],
            }
        )
    )
    prometheus_bin = shutil.which("prometheus")
    assert prometheus_bin is not None
    argv = [
        prometheus_bin,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with logged_process(argv, tmp / "prometheus.log", die_with_parent=True):
        yield port


async def test_keda_scales_the_encoder_tier_on_its_load_from_prometheus_and_to_zero(ns, tmp_path):
    cluster = ns.cluster
    logs = {name: cluster.dir / f"{name}.log" for name in (keda.OPERATOR, keda.METRICS_SERVER)}

    def keda_logs() -> str:
        return "\n".join(f"{name}:\n{log_tail(path)}" for name, path in logs.items())

    exposition = RouterExposition()
    exposition.set_demand(DEMAND)
    with exposition.serve() as router_port, prometheus(ns, router_port, tmp_path) as prom_port:
        async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "1"):
            doc = epd_doc()
            doc["spec"]["encoder"]["autoscaling"] = keda_from_zero(prom_port)
            await create(ns, doc)

            def scaled_object() -> dict[str, Any]:
                return ns.get(KEDA_API, "ScaledObject", "vl-encoder") or {}

            def hpa() -> dict[str, Any]:
                return ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "keda-hpa-vl-encoder") or {}

            # KEDA accepts the rendered ScaledObject and creates its HPA on an external metric.
            await wait_until(
                lambda: condition(scaled_object(), "Ready").get("status") == "True",
                120,
                lambda: f"ScaledObject not Ready: {scaled_object().get('status')}\n{keda_logs()}",
            )
            await wait_until(lambda: hpa(), 60, lambda: f"KEDA made no HPA\n{keda_logs()}")
            assert scaled_object()["status"]["hpaName"] == "keda-hpa-vl-encoder"
            [metric] = hpa()["spec"]["metrics"]
            assert metric["type"] == "External", metric
            assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "4"}
            name = metric["external"]["metric"]["name"]
            selector = metric["external"]["metric"]["selector"]["matchLabels"]
            assert selector == {"scaledobject.keda.sh/name": "vl-encoder"}

            # The load reaches KEDA from Prometheus: the trigger is active...
            await wait_until(
                lambda: condition(scaled_object(), "Active").get("status") == "True",
                120,
                lambda: f"ScaledObject not Active: {scaled_object().get('status')}\n{keda_logs()}",
            )

            # ...and the external metrics API serves it through the APIService, as the HPA reads it.
            def served() -> list[str]:
                result = ns.kubectl(
                    "get",
                    "--raw",
                    f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns.ns}/{name}"
                    "?labelSelector=scaledobject.keda.sh%2Fname%3Dvl-encoder",
                    check=False,
                )
                if result.returncode != 0:
                    return [result.stderr.strip()]
                return [item["value"] for item in yaml.safe_load(result.stdout).get("items") or []]

            await wait_until(lambda: served() == [str(DEMAND)], 60, lambda: f"served {served()}\n{keda_logs()}")

            # kube-controller-manager's HPA scales the encoders to the load: ceil(12 / 4) = 3.
            await wait_until(
                lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == EXPECTED_REPLICAS,
                120,
                lambda: f"HPA: {hpa().get('status')}\n{keda_logs()}",
            )
            conditions = {c["type"]: c for c in hpa()["status"]["conditions"]}
            assert conditions["ScalingActive"]["status"] == "True", conditions
            assert conditions["ScalingActive"]["reason"] == "ValidMetricFound", conditions

            # The EPDDeployment carries KEDA's verdict.
            def keda_says() -> list[tuple[str, str]]:
                scaling = epd(ns)["status"]["tiers"]["encoder"].get("autoscaling") or {}
                return [(c["type"], c["status"]) for c in scaling.get("conditions") or []][:2]

            await wait_until(
                lambda: keda_says() == [("Ready", "True"), ("Active", "True")], 60, lambda: epd(ns)["status"]
            )
            encoder = epd(ns)["status"]["tiers"]["encoder"]
            assert encoder["autoscaling"]["engine"] == "KEDA"
            await wait_until(
                lambda: condition(epd(ns), "AutoscalingActive").get("status") == "True", 60, lambda: epd(ns)["status"]
            )

            # No load: after its cooldown KEDA takes the tier to zero, and the status says so.
            exposition.set_demand(0)
            await wait_until(
                lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 0,
                120,
                lambda: f"not at zero: {scaled_object().get('status')}\n{keda_logs()}",
            )
            await wait_until(
                lambda: (
                    epd(ns)["status"]["tiers"]["encoder"].get("reason") == "ScaledToZero"
                    and epd(ns)["status"]["tiers"]["encoder"]["ready"] == "0/0"
                ),
                120,
                lambda: f"encoder tier not reported at zero: {epd(ns)['status']}",
            )
            await wait_until(lambda: keda_says() == [("Ready", "True"), ("Active", "False")], 60, lambda: epd(ns))
            status = epd(ns)["status"]
            assert status["phase"] == "Ready", status
            await posted(ns, "Normal", "ScaledToZero", "encoder scaled to zero")

            # Load again: KEDA wakes the tier (its activation), and the HPA takes it back to the load's size.
            exposition.set_demand(DEMAND)
            await wait_until(
                lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == EXPECTED_REPLICAS,
                120,
                lambda: f"not woken: {scaled_object().get('status')}, HPA {hpa().get('status')}\n{keda_logs()}",
            )


async def test_kedas_metrics_server_away_is_named_and_the_tier_held_then_active_again(ns, tmp_path):
    """KEDA's metrics server stopped under load: the ScaledObject stays Ready (KEDA's operator still reaches
    Prometheus), KEDA's HPA cannot read its external metric and keeps the tier's replicas, and the EPDDeployment
    names what is missing from the ScaledObject's HPAActive (controller/status_keda.py); started again, autoscaling
    is active again on its own."""
    cluster = ns.cluster
    exposition = RouterExposition()
    exposition.set_demand(DEMAND)
    with exposition.serve() as router_port, prometheus(ns, router_port, tmp_path) as prom_port:
        async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "1"):
            doc = epd_doc()
            doc["spec"]["encoder"]["autoscaling"] = {**keda_from_zero(prom_port), "minReplicas": 1}
            await create(ns, doc)

            def replicas() -> int | None:
                return ((ns.get("apps/v1", "Deployment", "vl-encoder") or {}).get("spec") or {}).get("replicas")

            await wait_until(
                lambda: (
                    replicas() == EXPECTED_REPLICAS and condition(epd(ns), "AutoscalingActive").get("status") == "True"
                ),
                180,
                lambda: f"not scaled to the load: {epd(ns).get('status')}",
            )
            server = next(c for c in cluster.parts["keda"].components if c.name == keda.METRICS_SERVER)
            server.stop()
            try:

                def inactive() -> dict[str, Any]:
                    said = condition(epd(ns), "AutoscalingActive")
                    return said if said.get("status") == "False" else {}

                await wait_until(inactive, 120, lambda: f"still active: {epd(ns).get('status')}")
                said = inactive()
                assert said["reason"] == "FailedGetExternalMetric", said
                assert said["message"] == (
                    "encoder autoscaling inactive: KEDA's HPA cannot read its metric from the external metrics API: "
                    "its APIService's server, KEDA's metrics server, does not answer; the HPA holds the tier at its "
                    "replicas until it reads it again; FailedGetExternalMetric, in the HPA's words in "
                    "status.tiers.encoder.autoscaling.conditions (HPAActive)"
                ), said
                so = ns.get(KEDA_API, "ScaledObject", "vl-encoder") or {}
                assert condition(so, "Ready").get("status") == "True", so  # KEDA itself still reaches Prometheus
                assert deployment(ns, "vl-encoder")["spec"].get("replicas") == EXPECTED_REPLICAS
                await posted(ns, "Warning", "AutoscalingInactive", "KEDA's metrics server, does not answer")
            finally:
                server.start({**os.environ, **keda.environment(cluster.kubeconfig_path)})
            await wait_until(
                lambda: condition(epd(ns), "AutoscalingActive").get("status") == "True",
                180,
                lambda: f"not active again: {epd(ns).get('status')}",
            )
            assert deployment(ns, "vl-encoder")["spec"].get("replicas") == EXPECTED_REPLICAS


def keda_from_zero(prom_port: int) -> dict:
    """The encoder tier on KEDA from zero, its load read from the test's Prometheus every second."""
    return {
        "engine": "KEDA",
        "minReplicas": 0,
        "maxReplicas": 4,
        "load": {"targetPerPod": 4},
        "keda": {"prometheusAddress": f"http://127.0.0.1:{prom_port}", "pollingInterval": 1, "cooldownPeriod": 5},
    }


def test_keda_s_webhook_refuses_a_scaled_object_for_a_workload_an_hpa_manages(ns):
    """The webhooks run (dev/parts/keda.py registers the module's own configuration): what every standard KEDA
    install does to a ScaledObject whose target an HPA of someone else's scales."""
    ns.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "web", "image": "web:1"}]},
                },
            },
        }
    )
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}
    ns.create(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": target, "minReplicas": 1, "maxReplicas": 2},
        }
    )
    cron = {
        "type": "cron",
        "metadata": {"timezone": "UTC", "start": "0 8 * * *", "end": "0 9 * * *", "desiredReplicas": "2"},
    }
    status, answer = ns.request(
        "POST",
        f"/apis/{KEDA_API}/namespaces/{ns.ns}/scaledobjects",
        {
            "apiVersion": KEDA_API,
            "kind": "ScaledObject",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"name": "web"}, "triggers": [cron]},
        },
        content_type="application/json",
    )
    assert status == 403, answer
    assert answer["message"] == (
        "admission webhook \"vscaledobject.kb.io\" denied the request: the workload 'web' of type "
        "'apps/v1.Deployment' is already managed by the hpa 'web'"
    )


async def test_switching_engines_on_keda_with_its_webhooks_converges_both_ways_at_one_replica_and_at_zero(ns, tmp_path):
    """HPA -> KEDA (the webhook would refuse the ScaledObject beside the HPA), KEDA -> HPA at one replica
    or more, and at zero (KEDA took the idle tier there): each pass converges, nothing is refused or
    retried, and the tier is never left at zero by the switch."""
    exposition = RouterExposition()
    exposition.set_demand(4)  # one encoder's worth: KEDA holds one replica
    with exposition.serve() as router_port, prometheus(ns, router_port, tmp_path) as prom_port:
        async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "1"):
            on_keda = keda_from_zero(prom_port)
            on_hpa = {"engine": "HPA", "minReplicas": 2, "maxReplicas": 4, "load": {"targetPerPod": 4}, "keda": None}
            doc = epd_doc()
            doc["spec"]["encoder"]["autoscaling"] = {k: v for k, v in on_hpa.items() if v is not None}
            await create(ns, doc)
            await observed(ns, 1)
            await wait_until(lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 2, 90)

            def scaled_object() -> dict[str, Any]:
                return ns.get(KEDA_API, "ScaledObject", "vl-encoder") or {}

            def keda_ready() -> bool:
                return condition(scaled_object(), "Ready").get("status") == "True"

            def failures() -> list[str]:
                return [m for t, r, m in events(ns) if r == "ReconcileFailed" or "refused" in m]

            # HPA -> KEDA
            await patch_spec(ns, {"encoder": {"autoscaling": on_keda}})
            await wait_until(keda_ready, 120, lambda: f"{scaled_object().get('status')} {events(ns)}")
            assert ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is None
            await wait_until(lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 1, 120, lambda: events(ns))
            assert failures() == []

            # KEDA -> HPA at one replica
            await patch_spec(ns, {"encoder": {"autoscaling": on_hpa}})
            await observed(ns, 3)
            await wait_until(lambda: not scaled_object(), 60, lambda: scaled_object())
            await wait_until(lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 2, 90)
            assert failures() == []

            # back to KEDA, which takes the idle tier to zero; then KEDA -> HPA at zero
            await patch_spec(ns, {"encoder": {"autoscaling": on_keda}})
            await wait_until(keda_ready, 120, lambda: f"{scaled_object().get('status')} {events(ns)}")
            exposition.set_demand(0)
            await wait_until(lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 0, 120, scaled_object)
            await patch_spec(ns, {"encoder": {"autoscaling": on_hpa}})
            await observed(ns, 5)
            assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 2  # woken to minReplicas by the switch
            await wait_until(lambda: not scaled_object(), 60, lambda: scaled_object())
            await asyncio.sleep(10)  # KEDA's HPA goes with its ScaledObject; nothing takes the tier down again
            assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 2
            assert failures() == []


async def test_an_admission_webhooks_denial_is_shown_as_a_refusal_in_its_own_words_not_retried(ns):
    """A decode tier on KEDA's cpu trigger without a CPU request: the API accepts it (it names a trigger),
    KEDA's webhook refuses its ScaledObject, and only when it is written (KEDA skips that check on a dry
    run). The denial is the status' refusal and one Event, with the webhook's words; the operator does not
    retry it as a failure."""
    cpu = {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", "1"
    ) as metrics:
        doc = epd_doc()
        doc["spec"]["decode"]["resources"] = {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi"}}  # no CPU request
        doc["spec"]["decode"]["autoscaling"] = {"engine": "KEDA", "maxReplicas": 2, "keda": {"triggers": [cpu]}}
        await create(ns, doc)
        await wait_until(
            lambda: condition(epd(ns), "SpecValid").get("status") == "False", 60, lambda: (epd(ns), events(ns))
        )
        refused = condition(epd(ns), "SpecValid")
        assert refused["reason"] == "RefusedByAPIServer", refused
        assert refused["message"] == (
            'ScaledObject vl-decode: admission webhook "vscaledobject.kb.io" denied the request: the scaledobject '
            "has a cpu trigger but the container vllm doesn't have the cpu request defined "
            f"({REFUSED_WHEN_WRITTEN})"
        )
        said = await posted(ns, "Warning", "RefusedByAPIServer", "vscaledobject.kb.io")
        assert said == f"spec refused: {refused['message']}"
        passes = full_passes(metrics)
        await asyncio.sleep(5)  # resyncs a second apart: one pass each, no retry loop between them
        assert full_passes(metrics) - passes <= 6
        assert [r for t, r, m in events(ns) if r == "ReconcileFailed"] == []
        assert [m for t, r, m in events(ns) if r == "RefusedByAPIServer"] == [said]
