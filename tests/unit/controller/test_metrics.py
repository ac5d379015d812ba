"""The operator's metrics: the phase of each EPDDeployment, build info, and ready pods per compatibility generation."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from epd_operator import __version__
from epd_operator.controller.metrics import PHASES, RECONCILE_BUCKETS, Metrics

GEN = "serving.epd.dev/compat-generation"


def pod(role: str, generation: str | None, ready: bool = True, leaving: bool = False) -> dict:
    labels = {"serving.epd.dev/role": role, **({GEN: generation} if generation else {})}
    meta: dict = {"name": f"{role}-{generation}", "labels": labels}
    if leaving:
        meta["deletionTimestamp"] = "2026-11-30T21:00:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def series(metrics: Metrics) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name == "epd_operator_generation_ready_pods"
    }


# What Prometheus Operator puts on every target; a metric label of the same name gets renamed
# to exported_<name> and dashboards reading it break.
TARGET_LABELS = {"pod", "endpoint", "namespace", "service", "job", "instance", "container"}


def families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def label_names(registry_text: bytes) -> set[str]:
    return {name for f in families(registry_text).values() for s in f.samples for name in s.labels}


def test_ready_pods_per_generation_metric_follows_the_rollout():
    metrics = Metrics()
    metrics.set_generations("ns", "vl", {"aaa": {"encoder": 1, "decode": 2}})
    metrics.set_generations("ns", "vl", {"bbb": {"encoder": 1, "decode": 0}, "aaa": {"encoder": 1, "decode": 2}})
    assert series(metrics) == {
        ("ns", "vl", "bbb", "encoder"): 1.0,
        ("ns", "vl", "bbb", "decode"): 0.0,
        ("ns", "vl", "aaa", "encoder"): 1.0,
        ("ns", "vl", "aaa", "decode"): 2.0,
    }
    metrics.set_generations("ns", "vl", {"bbb": {"encoder": 1, "decode": 2}})  # the old generation is gone
    assert series(metrics) == {("ns", "vl", "bbb", "encoder"): 1.0, ("ns", "vl", "bbb", "decode"): 2.0}
    metrics.forget("ns", "vl")
    assert series(metrics) == {}


def test_operator_metrics_phase_build_info_and_labels():
    m = Metrics()
    m.set_phase("ml", "vl", "Progressing")
    m.set_phase("ml", "vl", "Ready")
    f = families(m.exposition())
    phases = {s.labels["phase"]: s.value for s in f["epd_operator_deployment_phase"].samples}
    assert phases == {p: (1.0 if p == "Ready" else 0.0) for p in PHASES}
    assert set(PHASES) == {"Pending", "Progressing", "Ready", "Degraded", "Failed"}
    assert f["epd_operator_build_info"].samples[0].labels == {"version": __version__}
    assert "process_cpu_seconds" in f
    assert not label_names(m.exposition()) & TARGET_LABELS
    m.forget("ml", "vl")
    assert not families(m.exposition())["epd_operator_deployment_phase"].samples


def test_the_metric_reference_in_the_docs_is_what_the_operator_exports():
    """docs/operator.md's table is generated from `Metrics` (dev/generate/operator_metrics.py): every family's
    name as scraped, type, labels and help, so a renamed or reworded metric shows there."""
    from pathlib import Path

    from dev.generate import operator_metrics

    page = (Path(__file__).resolve().parents[3] / operator_metrics.PAGE).read_text(encoding="utf-8")
    assert operator_metrics.with_table(page) == page, "docs/operator.md's metric table is stale: run `make generate`"
    table = operator_metrics.table()
    assert "| `epd_operator_reconciles_total` | counter | `kind`, `result` |" in table
    assert "| `epd_operator_build_info` | gauge | `version` | epd-operator version; always 1 |" in table


FAMILIES = {
    "epd_operator_reconciles",
    "epd_operator_reconcile_errors",
    "epd_operator_reconcile_duration_seconds",
    "epd_operator_api_writes",
    "epd_operator_drift_repairs",
    "epd_operator_leader",
    "epd_operator_epddeployments",
    "epd_operator_cache_objects",
    "epd_operator_cache_bytes",
    "epd_operator_deployment_phase",
    "epd_operator_generation_ready_pods",
    "epd_operator_build_info",
}


def test_two_operators_in_one_process_each_export_every_family_and_share_no_count():
    """Each instance owns its registry: nothing lands in prometheus_client's global one (a second instance
    would then be refused as a duplicate), and one instance's counts are not the other's."""
    first, second = Metrics(), Metrics()
    first.count_write("patch", "Deployment")
    first.count_write("patch", "Deployment")
    second.count_write("create", "Service")
    for m in (first, second):
        assert set(families(m.exposition())) >= FAMILIES

    def writes(m: Metrics) -> list:
        samples = families(m.exposition())["epd_operator_api_writes"].samples
        return [(s.labels, s.value) for s in samples if s.name.endswith("_total")]

    assert writes(first) == [({"verb": "patch", "kind": "Deployment"}, 2.0)]
    assert writes(second) == [({"verb": "create", "kind": "Service"}, 1.0)]


def test_build_info_is_always_one_and_reconcile_durations_use_the_buckets():
    m = Metrics()
    m.duration.labels("full").observe(0.2)
    f = families(m.exposition())
    assert [(s.labels, s.value) for s in f["epd_operator_build_info"].samples] == [({"version": __version__}, 1.0)]
    bounds = [
        s.labels["le"] for s in f["epd_operator_reconcile_duration_seconds"].samples if s.name.endswith("_bucket")
    ]
    assert bounds == [*(str(float(b)) for b in RECONCILE_BUCKETS), "+Inf"]


def test_forgetting_a_deployment_never_measured_is_harmless():
    m = Metrics()
    m.forget("ml", "never-seen")
    assert not families(m.exposition())["epd_operator_deployment_phase"].samples
