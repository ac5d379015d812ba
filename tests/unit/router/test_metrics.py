"""Router metrics: label names that survive Prometheus Operator's target labels, build info and process
metrics from the first scrape, removal of a forgotten backend's gauges, and what /metrics reports when
`--workers N` processes share prometheus_client's multiprocess files (simulated here in one process:
each simulated worker writes the files of its own pid)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest, multiprocess, values
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from dev.generate import router_metrics
from epd_operator import __version__
from epd_operator.router import contract
from epd_operator.router.backends import DiscoveredEndpoint, Pool
from epd_operator.router.metrics import RouterMetrics
from tests.support.prom import sample_values, samples

# What Prometheus Operator puts on every target; a metric label of the same name gets renamed
# to exported_<name> and dashboards reading it break.
TARGET_LABELS = {"pod", "endpoint", "namespace", "service", "job", "instance", "container"}


def families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def label_names(registry_text: bytes) -> set[str]:
    return {name for f in families(registry_text).values() for s in f.samples for name in s.labels}


def test_router_labels_never_collide_with_target_labels_and_build_info_exists_before_traffic():
    m = RouterMetrics()
    fresh = families(m.exposition()[0])
    assert [(s.labels, s.value) for s in fresh["epd_router_build_info"].samples] == [({"version": __version__}, 1)]
    assert "process_cpu_seconds" in fresh and "process_resident_memory_bytes" in fresh
    pool = Pool("encoder", m)
    pool.update([DiscoveredEndpoint("http://10.0.0.1:8000", pod="vl-encoder-0")])
    m.backend_errors.labels("encoder", "10.0.0.1:8000", "timeout").inc()
    m.ejections.labels("encoder", "10.0.0.1:8000").inc()
    m.count_request("/v1/chat/completions", 200)
    names = label_names(m.exposition()[0])
    assert {"backend", "backend_pod", "role"} <= names
    assert not names & TARGET_LABELS


def test_a_forgotten_backend_leaves_the_gauges():
    m = RouterMetrics()
    pool = Pool("decode", m)
    pool.update([DiscoveredEndpoint("http://a:8000", pod="pa"), DiscoveredEndpoint("http://b:8000", pod="pb")])
    pool.update([DiscoveredEndpoint("http://a:8000", pod="pa")])
    f = families(m.exposition()[0])
    for name in ("epd_router_endpoint_available", "epd_router_endpoint_inflight"):
        assert [s.labels["backend_pod"] for s in f[name].samples] == ["pa"]


def test_requests_are_counted_per_route_and_status():
    m = RouterMetrics()
    m.count_request("/v1/chat/completions", 200)
    m.count_request("/v1/completions", 503)
    m.count_request("/v1/chat/completions", 200)
    text = m.exposition()[0]
    assert sample_values(text, "epd_router_requests_total", route="/v1/chat/completions", status="200") == [2]
    assert sample_values(text, "epd_router_requests_total", route="/v1/completions", status="503") == [1]


def test_stage_buckets_resolve_sub_millisecond_router_work_and_multi_minute_generations():
    m = RouterMetrics()
    m.observe_stage("encode", 0.0004)
    m.observe_stage("total", 200)
    text = m.exposition()[0]
    assert sample_values(text, "epd_router_stage_seconds_bucket", stage="encode", le="0.0005") == [1]
    assert sample_values(text, "epd_router_stage_seconds_bucket", stage="total", le="120.0") == [0]
    assert sample_values(text, "epd_router_stage_seconds_bucket", stage="total", le="300.0") == [1]


def test_the_metrics_go_to_a_registry_the_caller_passes():
    reg = CollectorRegistry()
    m = RouterMetrics(reg)
    m.count_request("/v1/chat/completions", 200)
    assert sample_values(generate_latest(reg), "epd_router_requests_total", route="/v1/chat/completions") == [1]


Worker = Callable[[int], contextlib.AbstractContextManager[None]]


@pytest.fixture
def worker(tmp_path, monkeypatch) -> Iterator[Worker]:
    """`with worker(pid):` makes the metric values created inside write the multiprocess files of `pid`,
    as a router worker process of that pid does (main sets PROMETHEUS_MULTIPROC_DIR before it starts)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    value_classes: dict[int, Any] = {}  # prometheus_client builds the class per process identifier

    @contextlib.contextmanager
    def as_worker(pid: int) -> Iterator[None]:
        cls = value_classes.get(pid) or value_classes.setdefault(pid, values.MultiProcessValue(lambda: pid))
        with monkeypatch.context() as m:
            m.setattr(values, "ValueClass", cls)
            yield

    yield as_worker
    for cls in value_classes.values():
        cls.close_all_files()


def decode_pool(m: RouterMetrics) -> Pool:
    pool = Pool("decode", m)
    pool.update([DiscoveredEndpoint("http://a:8000", pod="pa"), DiscoveredEndpoint("http://b:8000", pod="pb")])
    return pool


def test_with_workers_metrics_adds_their_counts_and_combines_backend_gauges_without_pid(worker):
    with worker(101):
        m1 = RouterMetrics()
        p1 = decode_pool(m1)
        p1.acquire(p1.endpoints["http://a:8000"], 2)
        m1.count_request("/v1/chat/completions", 200)
    with worker(102):
        m2 = RouterMetrics()
        p2 = decode_pool(m2)
        p2.acquire(p2.endpoints["http://a:8000"])
        for _ in range(3):  # ejected in this worker only
            p2.record_failure(p2.endpoints["http://b:8000"], "timeout")
        m2.count_request("/v1/chat/completions", 200)
    # Any worker answers /metrics with every worker's values.
    for m in (m1, m2):
        text = m.exposition()[0]
        assert sample_values(text, "epd_router_requests_total", route="/v1/chat/completions") == [2]
        assert sample_values(text, "epd_router_endpoint_inflight", backend_pod="pa") == [3]
        assert sample_values(text, "epd_router_endpoint_inflight", backend_pod="pb") == [0]
        # available: 1 while any worker still sends it work
        assert sample_values(text, "epd_router_endpoint_available", backend_pod="pb") == [1]
        assert sample_values(text, "epd_router_generation_backends", role="decode") == [2]
        assert not [s for s in samples(text) if "pid" in s.labels]
        assert sample_values(text, "epd_router_build_info", version=__version__) == [1]


def test_with_workers_a_backend_leaves_the_gauges_once_every_worker_forgot_it(worker):
    pools = []
    for pid, work in ((101, 2), (102, 1)):
        with worker(pid):
            pool = decode_pool(RouterMetrics())
            pool.acquire(pool.endpoints["http://b:8000"], work)
            pools.append(pool)
    first, second = pools
    first.update([DiscoveredEndpoint("http://a:8000", pod="pa")])
    text = first.metrics.exposition()[0]
    assert sample_values(text, "epd_router_endpoint_inflight", backend_pod="pb") == [1]  # the other worker's
    assert sample_values(text, "epd_router_endpoint_available", backend_pod="pb") == [1]
    second.update([DiscoveredEndpoint("http://a:8000", pod="pa")])
    f = families(second.metrics.exposition()[0])
    for name in ("epd_router_endpoint_available", "epd_router_endpoint_inflight"):
        assert [s.labels["backend_pod"] for s in f[name].samples] == ["pa"]


def test_an_exited_worker_takes_its_backend_gauges_along_but_not_its_counts(worker, tmp_path):
    with worker(101):
        m1 = RouterMetrics()
        p1 = decode_pool(m1)
        p1.acquire(p1.endpoints["http://a:8000"])
        for _ in range(3):  # ejected in the worker that stays
            p1.record_failure(p1.endpoints["http://b:8000"], "timeout")
    with worker(102):
        m2 = RouterMetrics()
        p2 = decode_pool(m2)
        p2.acquire(p2.endpoints["http://a:8000"], 5)
        m2.count_request("/v1/chat/completions", 200)
    multiprocess.mark_process_dead(102, str(tmp_path))  # what the supervisor does when a worker exits
    text = m1.exposition()[0]
    assert sample_values(text, "epd_router_endpoint_inflight", backend_pod="pa") == [1]
    assert sample_values(text, "epd_router_endpoint_available", backend_pod="pb") == [0]
    assert sample_values(text, "epd_router_requests_total", route="/v1/chat/completions") == [1]


def per_pod(text: bytes, name: str) -> dict[str, float]:
    return {s.labels["backend_pod"]: s.value for s in families(text)[name].samples}


def test_endpoint_gauges_follow_availability_in_flight_work_and_the_pod():
    m = RouterMetrics()
    pool = Pool("decode", m, eject_after=1)
    pool.update([DiscoveredEndpoint("http://a:8000", pod="pa"), DiscoveredEndpoint("http://b:8000", pod="pb")])
    a, b = pool.endpoints.values()
    pool.acquire(a)
    pool.acquire(a, 2)
    pool.release(a)
    pool.record_failure(b, "health")
    text = m.exposition()[0]
    assert per_pod(text, "epd_router_endpoint_available") == {"pa": 1, "pb": 0}
    assert per_pod(text, "epd_router_endpoint_inflight") == {"pa": 2, "pb": 0}
    # a's address now belongs to another pod: its series move to that pod's name
    pool.update([DiscoveredEndpoint("http://a:8000", pod="pa2"), DiscoveredEndpoint("http://b:8000", pod="pb")])
    text = m.exposition()[0]
    assert per_pod(text, "epd_router_endpoint_available") == {"pa2": 1, "pb": 0}
    assert per_pod(text, "epd_router_endpoint_inflight") == {"pa2": 2, "pb": 0}


def test_with_workers_each_keeps_its_own_endpoint_gauges_current(monkeypatch, tmp_path):
    """Under --workers (PROMETHEUS_MULTIPROC_DIR set) a worker's gauges are what it writes for the others
    to read: its registry must hold its in-flight counts as they change, and relabelling an address
    listed under two pods must not fail."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    m = RouterMetrics()
    pool = Pool("decode", m)
    pool.update([DiscoveredEndpoint("http://a:8000", pod="pa")])
    (a,) = pool.endpoints.values()

    def written() -> dict[str, float]:
        return per_pod(generate_latest(m.registry), "epd_router_endpoint_inflight")

    assert written() == {"pa": 0}
    pool.acquire(a, 3)
    assert written() == {"pa": 3}
    pool.release(a)
    assert written() == {"pa": 2}
    pool.update([DiscoveredEndpoint("http://c:8000", pod="old"), DiscoveredEndpoint("http://c:8000", pod="new")])
    assert written()["new"] == 0


def test_the_metric_table_in_the_docs_is_what_the_router_exports():
    """Names, types, labels and `# HELP` texts: docs/router.md's table is generated from RouterMetrics."""
    page = (Path(__file__).resolve().parents[3] / router_metrics.PAGE).read_text(encoding="utf-8")
    assert router_metrics.with_table(page) == page, "docs/router.md's metric table is stale: run `make generate`"
    assert (
        "| `epd_router_requests_total` | counter | `route`, `status` | Requests answered, by route and HTTP status |"
        in page
    )


def test_a_page_without_the_metric_table_markers_is_refused():
    with pytest.raises(ValueError, match=re.escape("the page needs one <!-- router metrics")):
        router_metrics.with_table("# Router\n")


def test_a_build_info_collector_names_its_family_and_always_says_one():
    from epd_operator import __version__
    from epd_operator.router.metrics import BuildInfo

    registry = CollectorRegistry()
    registry.register(BuildInfo("probe_build_info", "probe version; always 1"))
    text = generate_latest(registry).decode()
    assert "# HELP probe_build_info probe version; always 1\n" in text
    assert f'probe_build_info{{version="{__version__}"}} 1.0\n' in text


def test_two_routers_in_one_process_each_export_the_encoder_demand():
    """Each RouterMetrics owns its registry: nothing lands in prometheus_client's global one, where a second
    instance would be refused as a duplicate."""
    from epd_operator.router import contract
    from epd_operator.router.metrics import RouterMetrics

    first, second = RouterMetrics(), RouterMetrics()
    for m in (first, second):
        names = {f.name for f in m.registry.collect()}
        assert contract.ENCODER_DEMAND_METRIC in names


def test_every_metric_the_router_keeps_is_in_its_own_registry():
    """Each metric is described to the registry /metrics collects: a metric made with `registry=None` would
    count and never be scraped."""
    metrics = RouterMetrics(CollectorRegistry())
    kept = {d.name for m in vars(metrics).values() if isinstance(m, MetricWrapperBase) for d in m.describe()}
    exposed = {f.name for f in metrics.registry.collect()}
    assert {contract.ENCODER_DEMAND_METRIC, "epd_router_requests", "epd_router_generation_backends"} <= kept
    assert kept <= exposed, kept - exposed
