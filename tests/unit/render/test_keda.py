"""A tier scaled by KEDA (`autoscaling.engine: KEDA`): its ScaledObject, what it targets and queries, and
that nothing else of ours scales the tier. The query itself is evaluated by Prometheus' engine against the
router's exposition in tests/helm/test_keda_query.py; the object against KEDA's CRD in
tests/integration/test_keda_schema.py."""

from __future__ import annotations

import pytest

from epd_operator.api.validation import SpecError
from epd_operator.render import render
from epd_operator.render.keda import HPA_EXCLUDED_LABELS_ANNOTATION, load_query
from tests.support.render_examples import KEDA_PROMETHEUS, SHARED_STORAGE, example, find, variants

VARIANTS = variants()


def kinds(objects: list[dict]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def test_an_encoder_that_may_scale_to_zero_gets_a_scaled_object_and_no_hpa():
    objects = render(VARIANTS["keda-encoder-scale-to-zero"])
    so = find(objects, "ScaledObject", "qwen-vl-encoder")
    assert not any(o["kind"] == "HorizontalPodAutoscaler" for o in objects)
    assert "replicas" not in find(objects, "Deployment", "qwen-vl-encoder")["spec"]  # KEDA's to write
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["metadata"]["labels"] == find(objects, "Deployment", "qwen-vl-encoder")["metadata"]["labels"]
    # KEDA's own HPA keeps KEDA's managed-by label: it is not ours to watch or prune
    assert so["metadata"]["annotations"] == {HPA_EXCLUDED_LABELS_ANNOTATION: "app.kubernetes.io/managed-by"}
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen-vl-encoder"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["cooldownPeriod"]) == (0, 4, 600)
    assert "pollingInterval" not in spec and "fallback" not in spec
    assert spec["advanced"] == {
        "horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}}}
    }
    (trigger,) = spec["triggers"]
    assert trigger == {
        "type": "prometheus",
        "name": "load",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": KEDA_PROMETHEUS,
            # one quantity in one unit, to size the tier and to wake it: the deployment's demand in items
            "query": 'sum(epd_router_encoder_demand{namespace="default",epd_deployment="qwen-vl"}) or vector(0)',
            "threshold": "4",  # the encoder's default load per pod, as with an HPA
            "activationThreshold": "0",  # the documented default: the first media item wakes the tier
        },
    }


def test_every_tier_may_use_keda_and_a_multi_node_tier_is_targeted_as_a_leader_worker_set():
    objects = render(VARIANTS["keda-every-tier-multi-node-decode"])
    assert not any(o["kind"] == "HorizontalPodAutoscaler" for o in objects)
    encoder, prefill, decode = (
        find(objects, "ScaledObject", f"qwen-vl-epd-{t}") for t in ("encoder", "prefill", "decode")
    )
    # a tier that never goes to zero queries the same demand as one that may
    load = encoder["spec"]["triggers"][0]["metadata"]
    assert load["query"] == (
        'sum(epd_router_encoder_demand{namespace="inference",epd_deployment="qwen-vl-epd"}) or vector(0)'
    )
    assert (load["threshold"], load["activationThreshold"]) == ("6", "2.5")
    # the user's triggers and fallback, as written, after the load trigger
    assert encoder["spec"]["triggers"][1]["type"] == "cron"
    assert encoder["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 2}
    assert encoder["spec"]["pollingInterval"] == 15
    # a Deployment tier's pods: <deployment>-<ReplicaSet hash>-<pod suffix>
    assert prefill["spec"]["triggers"][0]["metadata"]["query"] == (
        'sum(epd_router_endpoint_inflight{namespace="inference",role="prefill",'
        'backend_pod=~"qwen-vl-epd-prefill-[a-z0-9]+-[a-z0-9]+"}) or vector(0)'
    )
    assert decode["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "qwen-vl-epd-decode",
    }
    # no load asked for on decode: its own trigger only
    assert [t.get("name") for t in decode["spec"]["triggers"]] == ["queue"]
    assert "replicas" not in find(objects, "LeaderWorkerSet", "qwen-vl-epd-decode")["spec"]


def test_a_leader_worker_set_tiers_load_counts_its_leaders():
    objects = render(VARIANTS["keda-every-tier-multi-node-decode"])
    lws = find(objects, "LeaderWorkerSet", "qwen-vl-epd-decode")
    query = load_query(VARIANTS["keda-every-tier-multi-node-decode"], "decode", lws)
    assert 'backend_pod=~"qwen-vl-epd-decode-[0-9]+"' in query


def test_the_prometheus_address_comes_from_the_spec_else_the_operator_else_the_spec_is_refused():
    doc = {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 2}
    epd = example(SHARED_STORAGE, **{"spec.encoder.autoscaling": doc})
    with pytest.raises(SpecError) as refused:
        render(epd)
    (error,) = refused.value.errors
    assert error.path == "spec.encoder.autoscaling.keda.prometheusAddress"
    assert error.message == (
        "KEDA reads this tier's load from Prometheus: name it here, or give the operator a default "
        "(--keda-prometheus-address, the operator chart's keda.prometheusAddress)"
    )
    so = find(render(epd, default_prometheus_address="http://prom:9090"), "ScaledObject", "qwen-vl-encoder")
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://prom:9090"
    named = example(
        SHARED_STORAGE, **{"spec.encoder.autoscaling": {**doc, "keda": {"prometheusAddress": "http://mine:9090"}}}
    )
    so = find(render(named, default_prometheus_address="http://prom:9090"), "ScaledObject", "qwen-vl-encoder")
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://mine:9090"


def test_triggers_alone_need_no_prometheus_and_a_tier_without_any_falls_back_to_cpu():
    cron = {
        "type": "cron",
        "metadata": {"timezone": "UTC", "start": "0 8 * * *", "end": "0 9 * * *", "desiredReplicas": "2"},
    }
    epd = example(
        SHARED_STORAGE,
        **{
            "spec.encoder.autoscaling": {"engine": "KEDA", "maxReplicas": 3, "keda": {"triggers": [cron]}},
            "spec.decode.autoscaling": {"engine": "KEDA", "maxReplicas": 3},
        },
    )
    objects = render(epd)  # no Prometheus anywhere: none is queried
    assert find(objects, "ScaledObject", "qwen-vl-encoder")["spec"]["triggers"] == [cron]
    assert find(objects, "ScaledObject", "qwen-vl-decode")["spec"]["triggers"] == [
        {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}
    ]


def test_the_hpa_engine_is_the_default_and_unchanged():
    epd = example(SHARED_STORAGE, **{"spec.encoder.autoscaling": {"maxReplicas": 3}})
    objects = render(epd)
    assert ("HorizontalPodAutoscaler", "qwen-vl-encoder") in kinds(objects)
    assert not any(o["kind"] == "ScaledObject" for o in objects)
