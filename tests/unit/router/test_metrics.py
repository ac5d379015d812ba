"""Router metrics: label names that survive Prometheus Operator's target labels, build info and process
metrics from the first scrape, removal of a forgotten backend's gauges."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epd_operator import __version__
from epd_operator.router.backends import DiscoveredEndpoint, Pool
from epd_operator.router.metrics import RouterMetrics

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
    assert fresh["epd_router_build_info"].samples[0].labels == {"version": __version__}
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
