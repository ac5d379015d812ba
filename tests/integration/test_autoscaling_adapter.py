"""The encoder HPA reads its load through a real metrics pipeline on a REAL control plane: Prometheus
(Debian's package) scrapes a router's /metrics exposition, prometheus-adapter (built from the Go module
proxy, dev/parts/prometheus_adapter.py) serves it with the rules the operator chart ships, registered as the
custom.metrics.k8s.io APIService, and kube-controller-manager's own HPA controller reads it and scales
the encoder Deployment. The EPDDeployment goes from "autoscaling inactive" to active as that happens.
Then the metric's source goes away and comes back, Prometheus first, the adapter next: the EPDDeployment
names what is missing in its status and one Warning Event, the HPA holds the tier at its replicas, and
autoscaling is active again on its own once each is back.

What is not real here: the router's exposition comes from RouterMetrics with work put in flight by the
test (the router's own code and registry, not a router process under load), and the pods are kwok's.
This local kube-apiserver has no front-proxy (requestheader) certificates, so it calls aggregated APIs
anonymously: the test grants the anonymous user read access to custom.metrics.k8s.io while it runs.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.ports import free_port
from epd_operator.api.spec import GROUP as EPD_GROUP
from epd_operator.api.spec import PLURAL
from epd_operator.controller.metrics import Metrics
from epd_operator.router.contract import ENCODER_DEMAND_METRIC
from epd_operator.router.metrics import RouterMetrics
from tests.support.cluster import CUSTOM_METRICS_GROUP as GROUP
from tests.support.cluster import KubeView, cluster_objects, custom_metrics_api, volumes
from tests.support.metric_processes import Processes, adapter_argv
from tests.support.operator_run import (
    condition,
    create,
    deployment,
    epd,
    epd_doc,
    operator_in_process,
    posted,
    wait_until,
)
from tests.support.prom import serve_exposition

LOAD = ENCODER_DEMAND_METRIC
DEPLOYMENT = "vl"  # epd_doc()'s EPDDeployment
# The deployment's encoder demand, in items; with the default target (4 per pod) 2 encoders ask for ceil(20/4) = 5.
DEMAND = 20
# prometheus-adapter is a late build: `make test` runs this module once `make k8s` has built it (dev/testing/test_streams.py).
pytestmark = [pytest.mark.timeout(600), pytest.mark.late_build]


@contextlib.contextmanager
def router_exposition() -> Iterator[int]:
    """A router's /metrics (its own RouterMetrics) holding DEMAND items of the deployment's encoder demand."""
    metrics = RouterMetrics()
    metrics.encoder_demand.labels(DEPLOYMENT).inc(DEMAND)
    with serve_exposition(metrics) as port:
        yield port


@pytest.fixture
async def operator(kube: KubeView) -> AsyncIterator[Metrics]:
    volumes(kube, "ec-cache", "models")
    async with operator_in_process(kube, "--namespace", kube.ns, "--no-leader-election", "--resync-seconds", "1") as m:
        yield m


@contextlib.contextmanager
def metrics_pipeline(kube: KubeView, tmp_path: Path, router_port: int) -> Iterator[Processes]:
    """Prometheus and prometheus-adapter running, the adapter registered as custom.metrics.k8s.io."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("Prometheus is not installed (Debian/Ubuntu: apt-get install prometheus; `make test-tools`)")
    prom_port, adapter_port = free_port(), free_port()
    prom_config = tmp_path / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "epd-routers",
                        # the target labels Prometheus Operator's PodMonitor gives a router pod
                        "static_configs": [
                            {
                                "targets": [f"127.0.0.1:{router_port}"],
                                "labels": {"namespace": kube.ns, "pod": "vl-router-0"},
                            }
                        ],
                    }
                ],
            }
        )
    )
    pipeline = Processes(
        argv={
            "prometheus": [
                prometheus,
                f"--config.file={prom_config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            "adapter": adapter_argv(
                tmp_path,
                kubeconfig=kube.cluster.kubeconfig_path,
                port=adapter_port,
                prometheus_url=f"http://127.0.0.1:{prom_port}",
            ),
        },
        logs={"prometheus": tmp_path / "prometheus.log", "adapter": tmp_path / "adapter.log"},
    )
    try:
        pipeline.start("prometheus")
        pipeline.start("adapter")
        with cluster_objects(
            kube, custom_metrics_api(f"{kube.ns}-custom-metrics-reader", kube.ns, "custom-metrics", adapter_port)
        ):
            yield pipeline
    finally:
        pipeline.stop_all()


def apiservice_available(kube: KubeView) -> bool:
    _, body = kube.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/v1beta2.{GROUP}")
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def encoder_hpa(kube: KubeView) -> dict[str, Any]:
    return kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") or {}


async def served_and_scaled(kube: KubeView, pipeline: Processes) -> None:
    """The custom metrics API serves the EPDDeployment's demand (as kubectl reads it) and the HPA has scaled
    the encoders on it: ceil(20 / 4) = 5."""
    await wait_until(lambda: apiservice_available(kube), 120, lambda: f"APIService not Available;\n{pipeline.tails()}")
    path = f"/apis/{GROUP}/v1beta2/namespaces/{kube.ns}/{PLURAL}.{EPD_GROUP}/{DEPLOYMENT}/{LOAD}"

    def answer() -> tuple[bool, str]:
        result = kube.kubectl("get", "--raw", path, check=False)
        return result.returncode == 0, result.stdout if result.returncode == 0 else result.stderr.strip()

    def served() -> str | None:
        """The value the API serves: a MetricValueList of the one object, even asked for by name."""
        ok, text = answer()
        items = (yaml.safe_load(text) or {}).get("items") if ok else None
        return items[0].get("value") if items else None

    await wait_until(lambda: served() == str(DEMAND), 120, lambda: f"served {answer()};\n{pipeline.tails()}")
    await wait_until(lambda: deployment(kube, "vl-encoder")["spec"].get("replicas") == 5, 90, lambda: encoder_hpa(kube))


async def autoscaled(kube: KubeView) -> None:
    """An EPDDeployment whose encoder tier its HPA scales on the demand (2 to 6, 4 items per pod), its HPA
    not able to act yet (no custom metrics API)."""
    doc = epd_doc()
    doc["spec"]["encoder"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 6}  # the default: load, 4 per pod
    await create(kube, doc)
    await wait_until(lambda: condition(epd(kube), "AutoscalingActive").get("status") == "False", 90, lambda: epd(kube))
    await wait_until(lambda: len(kube.pods(**{"serving.epd.dev/role": "encoder"})) == 2, 60)


async def test_the_hpa_reads_the_encoder_load_through_prometheus_and_the_charts_adapter_rules(kube, operator, tmp_path):
    await autoscaled(kube)
    with router_exposition() as router_port, metrics_pipeline(kube, tmp_path, router_port) as pipeline:
        await served_and_scaled(kube, pipeline)
        conditions = {c["type"]: c for c in encoder_hpa(kube)["status"]["conditions"]}
        assert conditions["ScalingActive"]["status"] == "True"
        assert conditions["ScalingActive"]["reason"] == "ValidMetricFound"
        assert LOAD in conditions["ScalingActive"]["message"]

        # ...and the EPDDeployment says autoscaling works again.
        await wait_until(
            lambda: condition(epd(kube), "AutoscalingActive").get("status") == "True", 60, lambda: epd(kube)
        )
        await posted(kube, "Normal", "AutoscalingActive")
        # The tier shows the HPA's own numbers (they move on as the new pods report no load yet).
        await wait_until(
            lambda: (
                epd(kube)["status"]["tiers"]["encoder"]["autoscaling"].get("desiredReplicas")
                == encoder_hpa(kube)["status"].get("desiredReplicas")
            ),
            30,
            lambda: (epd(kube)["status"]["tiers"]["encoder"], encoder_hpa(kube)["status"]),
        )
        assert epd(kube)["status"]["tiers"]["encoder"]["autoscaling"]["maxReplicas"] == 6
        assert condition(epd(kube), "Degraded").get("reason") != "AutoscalingInactive"


# What the EPDDeployment names as missing while each process is away (controller/status_hpa.py's words for the
# answer the HPA quotes: prometheus-adapter's when Prometheus does not answer its query, kube-aggregator's 503).
LOST = {
    "prometheus": "the adapter answers but cannot query its source (Prometheus, for prometheus-adapter)",
    "adapter": "its APIService's server, the adapter, does not answer",
}


def said_active(kube: KubeView) -> int:
    """How often the operator has said the EPDDeployment's autoscaling is active (its Normal Events' counts)."""
    return sum(
        int(e.get("count") or (e.get("series") or {}).get("count") or 1)
        for e in kube.events(kind="EPDDeployment", name="vl")
        if (e.get("type"), e.get("reason")) == ("Normal", "AutoscalingActive")
    )


async def lose(kube: KubeView, pipeline: Processes, name: str) -> None:
    """Stop one process of the pipeline until the EPDDeployment names what is missing, start it again until
    autoscaling is active again: the encoder tier at its 5 replicas throughout."""
    seen: set[int] = set()

    def says(status: str) -> bool:
        seen.add(deployment(kube, "vl-encoder")["spec"]["replicas"])
        return condition(epd(kube), "AutoscalingActive").get("status") == status

    pipeline.stop(name)
    await wait_until(lambda: says("False"), 60, lambda: (epd(kube)["status"], encoder_hpa(kube)["status"]))
    active = condition(epd(kube), "AutoscalingActive")
    hpa_words = {c["type"]: c for c in encoder_hpa(kube)["status"]["conditions"]}["ScalingActive"]
    assert (active["reason"], hpa_words["reason"]) == ("FailedGetObjectMetric", "FailedGetObjectMetric")
    # The HPA's own words (they move on while the API server notices the adapter gone) are the tier's condition's.
    assert active["message"] == (
        f"encoder autoscaling inactive: the HPA cannot read {LOAD} from the custom metrics API: {LOST[name]}; "
        "the HPA holds the tier at 5 replicas until it reads its metrics again; FailedGetObjectMetric, in the HPA's "
        "words in status.tiers.encoder.autoscaling.conditions"
    ), (name, hpa_words, pipeline.tails())
    assert condition(epd(kube), "Degraded").get("reason") == "AutoscalingInactive"
    await posted(kube, "Warning", "AutoscalingInactive", LOST[name])

    before = said_active(kube)
    pipeline.start(name)
    await wait_until(lambda: says("True"), 120, lambda: (epd(kube)["status"], pipeline.tails()))
    await wait_until(lambda: said_active(kube) > before, 20, lambda: kube.events(kind="EPDDeployment", name="vl"))
    # The HPA kept the tier at its replicas while it could not read the demand, and after.
    assert seen == {5} and deployment(kube, "vl-encoder")["spec"]["replicas"] == 5, (name, seen)


async def test_losing_prometheus_or_the_adapter_is_named_holds_the_tier_and_recovers_on_its_own(
    kube, operator, tmp_path
):
    await autoscaled(kube)
    with router_exposition() as router_port, metrics_pipeline(kube, tmp_path, router_port) as pipeline:
        await served_and_scaled(kube, pipeline)
        await wait_until(
            lambda: condition(epd(kube), "AutoscalingActive").get("status") == "True", 60, lambda: epd(kube)
        )
        for name in LOST:  # Prometheus, then the adapter
            await lose(kube, pipeline, name)
