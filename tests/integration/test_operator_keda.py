"""Tiers scaled by KEDA on the real control plane, with KEDA's own ScaledObject CRD (from its Go module)
installed: the API server judges every rendered ScaledObject strictly, and the operator applies and owns
the ScaledObject, never writes the tier's replicas, leaves the HPA KEDA creates alone, and reports the
ScaledObject's verdict and an encoder tier at zero.

No KEDA controller runs here (dev/parts/keda.py only fetches its module): what KEDA does is done the way it
does it, through the API (the Deployment's scale subresource, the ScaledObject's status subresource,
an HPA owned by the ScaledObject), so the operator's reading of real objects is what is tested. Without
the CRD (a cluster without KEDA): tests/integration/test_operator_stale_crd.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epd_operator.render import render
from tests.support.cluster import KubeView, install_crd, keda_crd, volumes
from tests.support.operator_run import (
    condition,
    create,
    deployment,
    epd,
    epd_doc,
    events,
    observed,
    operator_in_process,
    patch_spec,
    phase,
    posted,
    resyncs,
    wait_until,
)
from tests.support.render_examples import KEDA_PROMETHEUS, variants

RESYNC = "0.3"
KEDA_API = "keda.sh/v1alpha1"
ENCODER_AT_ZERO = {
    "engine": "KEDA",
    "minReplicas": 0,
    "maxReplicas": 4,
    "keda": {"prometheusAddress": KEDA_PROMETHEUS},
}


@pytest.fixture
def ns(kube: KubeView) -> KubeView:
    install_crd(kube.cluster, keda_crd())  # cluster-scoped and idempotent
    volumes(kube, "ec-cache", "models")
    return kube


def so_path(kube: KubeView, name: str = "") -> str:
    return f"/apis/{KEDA_API}/namespaces/{kube.ns}/scaledobjects" + (f"/{name}" if name else "")


def test_the_api_server_accepts_every_rendered_scaled_object_strictly(ns):
    objects = [o for epd_ in variants().values() for o in render(epd_) if o["kind"] == "ScaledObject"]
    assert len(objects) >= 4
    for obj in objects:
        body = {**obj, "metadata": {**obj["metadata"], "namespace": ns.ns}}
        # Strict: a field KEDA's schema does not know is an error, not silently pruned.
        status, answer = ns.request(
            "PATCH",
            so_path(ns, obj["metadata"]["name"]) + "?fieldManager=epd-tests&dryRun=All&fieldValidation=Strict",
            body,
            content_type="application/apply-patch+yaml",
        )
        assert status == 200, (obj["metadata"]["name"], answer)


def keda_writes_status(ns: KubeView, *conditions: tuple[str, str, str, str]) -> None:
    ns.ok(
        "PATCH",
        so_path(ns, "vl-encoder") + "/status",
        {
            "status": {
                "scaleTargetKind": "apps/v1.Deployment",
                "hpaName": "keda-hpa-vl-encoder",
                "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions],
            }
        },
        content_type="application/merge-patch+json",
    )


async def test_an_encoder_tier_scaled_by_keda_goes_to_zero_and_the_deployment_stays_ready(ns):
    async with operator_in_process(
        ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC
    ) as metrics:
        doc = epd_doc()
        doc["spec"]["encoder"]["autoscaling"] = ENCODER_AT_ZERO
        created = await create(ns, doc)
        await observed(ns, 1)
        so = ns.get(KEDA_API, "ScaledObject", "vl-encoder")
        assert so is not None, epd(ns)["status"]
        assert so["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        assert so["spec"]["minReplicaCount"] == 0 and so["spec"]["scaleTargetRef"]["name"] == "vl-encoder"
        assert ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is None
        await posted(ns, "Normal", "Applied", "ScaledObject vl-encoder created")
        # The Deployment starts at one pod (created without replicas), which serves until KEDA acts.
        await phase(ns, "Ready", timeout=60)
        scaling = condition(epd(ns), "AutoscalingActive")
        assert (scaling["status"], scaling["reason"]) == ("Unknown", "ScaledObjectPending")

        # KEDA: its HPA (owned by the ScaledObject), its verdict, and the tier scaled to zero.
        ns.create(
            {
                "apiVersion": "autoscaling/v2",
                "kind": "HorizontalPodAutoscaler",
                "metadata": {
                    "name": "keda-hpa-vl-encoder",
                    "labels": {
                        "app.kubernetes.io/instance": "vl",
                        "serving.epd.dev/role": "encoder",
                        "app.kubernetes.io/managed-by": "keda-operator",
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": KEDA_API,
                            "kind": "ScaledObject",
                            "name": "vl-encoder",
                            "uid": so["metadata"]["uid"],
                        }
                    ],
                },
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vl-encoder"},
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "metrics": [
                        {
                            "type": "External",
                            "external": {
                                "metric": {"name": "s0-prometheus"},
                                "target": {"type": "AverageValue", "averageValue": "4"},
                            },
                        }
                    ],
                },
            }
        )
        keda_writes_status(
            ns,
            ("Ready", "True", "ScaledObjectReady", "ScaledObject is defined correctly and is ready for scaling"),
            ("Active", "False", "ScalerNotActive", "Scaling is not performed because triggers are not active"),
            ("Fallback", "False", "NoFallbackFound", "No fallbacks are active on this scaled object"),
            ("Paused", "False", "ScaledObjectUnpaused", "pause annotation removed for ScaledObject"),
        )
        ns.ok(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns.ns}/deployments/vl-encoder/scale?fieldManager=keda",
            {"spec": {"replicas": 0}},
            content_type="application/merge-patch+json",
        )
        # (while the last encoder pod drains, the tier reads 1/0, already ScaledToZero)
        await wait_until(
            lambda: (
                epd(ns)["status"]["tiers"]["encoder"].get("reason") == "ScaledToZero"
                and epd(ns)["status"]["tiers"]["encoder"]["ready"] == "0/0"
            ),
            120,
            lambda: f"encoder tier not reported at zero: {epd(ns)['status']}",
        )
        status = epd(ns)["status"]
        assert status["phase"] == "Ready", status
        encoder = status["tiers"]["encoder"]
        assert encoder["ready"] == "0/0"
        assert encoder["autoscaling"]["engine"] == "KEDA"
        assert [(c["type"], c["status"]) for c in encoder["autoscaling"]["conditions"]] == [
            ("Ready", "True"),
            ("Active", "False"),
            ("Fallback", "False"),
            ("Paused", "False"),
        ]
        assert condition(epd(ns), "AutoscalingActive")["status"] == "True"
        await posted(ns, "Normal", "ScaledToZero", "encoder scaled to zero")

        # Resyncs: the operator writes no replicas and leaves KEDA's HPA alone.
        await resyncs(metrics)
        assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 0
        assert ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "keda-hpa-vl-encoder") is not None

        # KEDA cannot query Prometheus: its verdict degrades the deployment, with KEDA's words.
        keda_writes_status(
            ns,
            ("Ready", "False", "TriggerError", "error inside prometheus trigger: dial tcp: no such host"),
            ("Active", "False", "ScalerNotActive", "Scaling is not performed because triggers are not active"),
        )
        await phase(ns, "Degraded")
        scaling = condition(epd(ns), "AutoscalingActive")
        assert (scaling["status"], scaling["reason"]) == ("False", "TriggerError")
        assert "KEDA cannot scale it" in scaling["message"] and "no such host" in scaling["message"]
        await posted(ns, "Warning", "AutoscalingInactive", "encoder autoscaling inactive")


ENCODER_ON_HPA = {"engine": "HPA", "minReplicas": 2, "maxReplicas": 4, "keda": None}


def reconcile_failures(ns: KubeView) -> list[str]:
    return [m for t, r, m in events(ns) if r == "ReconcileFailed"]


async def test_switching_engines_both_ways_hands_over_in_order_and_wakes_a_tier_at_zero(ns):
    """HPA -> KEDA: the HPA goes before the ScaledObject is created (KEDA's webhook refuses a ScaledObject
    for a target an HPA manages: tests/integration/test_keda_controller.py shows it with the real one).
    KEDA -> HPA with the tier at zero: the tier gets minReplicas before its HPA exists, since an HPA
    whose target has 0 replicas disables itself."""
    async with operator_in_process(ns, "--namespace", ns.ns, "--no-leader-election", "--resync-seconds", RESYNC):
        doc = epd_doc()
        doc["spec"]["encoder"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 4}
        await create(ns, doc)
        await observed(ns, 1)
        assert ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is not None
        await wait_until(lambda: deployment(ns, "vl-encoder")["spec"].get("replicas") == 2, 60)

        await patch_spec(ns, {"encoder": {"autoscaling": ENCODER_AT_ZERO}})
        await observed(ns, 2)
        assert ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") is None
        assert ns.get(KEDA_API, "ScaledObject", "vl-encoder") is not None
        assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 2  # kept through the handover
        await posted(ns, "Normal", "Applied", "ScaledObject vl-encoder created")

        # KEDA takes the idle tier to zero (through the scale subresource, as KEDA does), then back to the HPA.
        ns.ok(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns.ns}/deployments/vl-encoder/scale?fieldManager=keda",
            {"spec": {"replicas": 0}},
            content_type="application/merge-patch+json",
        )
        await patch_spec(ns, {"encoder": {"autoscaling": ENCODER_ON_HPA}})
        await observed(ns, 3)
        assert ns.get(KEDA_API, "ScaledObject", "vl-encoder") is None
        hpa = ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder")
        assert hpa is not None and hpa["spec"]["minReplicas"] == 2
        assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 2  # woken to minReplicas, not left at zero

        # The real HPA controller's verdict is about its metric (no custom metrics API here), never that
        # scaling is disabled for a target at zero; and the tier stays at its minimum.
        def scaling_active() -> dict[str, Any]:
            got = ns.get("autoscaling/v2", "HorizontalPodAutoscaler", "vl-encoder") or {}
            return next(
                (c for c in (got.get("status") or {}).get("conditions") or [] if c["type"] == "ScalingActive"), {}
            )

        await wait_until(lambda: scaling_active().get("reason"), 60, lambda: scaling_active())
        assert scaling_active()["reason"] != "ScalingDisabled", scaling_active()
        await resyncs_of(ns)
        assert deployment(ns, "vl-encoder")["spec"]["replicas"] == 2
        assert reconcile_failures(ns) == []


async def resyncs_of(ns: KubeView) -> None:
    """A few seconds of resyncs (RESYNC apart): what a stuck or flapping pass would show in."""
    await asyncio.sleep(10 * float(RESYNC))
