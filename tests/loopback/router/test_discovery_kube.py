"""The router's Kubernetes discovery (router/discovery.py) against a scripted API server on loopback: per tier
it lists and watches the EndpointSlices and the pods its selector picks, and each pool holds the ready
endpoints with their pod's generation. Against the real API server: tests/integration/test_router_discovery.py."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from epd_operator.kube import Credentials, Kube
from epd_operator.router.backends import Pool
from epd_operator.router.config import RouterConfig
from epd_operator.router.discovery import KubernetesDiscovery
from epd_operator.router.metrics import RouterMetrics
from epd_operator.router.server import Router
from tests.support.fake_api_server import FakeApiServer, fake_api_server

GEN = "serving.epd.dev/compat-generation"


def endpoint_slice(name: str, *addresses: str, ready: bool = True, ports: list[dict] | None = None) -> dict:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "ports": ports if ports is not None else [{"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": [a], "conditions": {"ready": ready}, "targetRef": {"kind": "Pod", "name": f"pod-{a}"}}
            for a in addresses
        ],
    }


def pod(address: str, generation: str | None) -> dict:
    labels = {GEN: generation} if generation is not None else {}
    return {"metadata": {"name": f"pod-{address}", "labels": labels, "resourceVersion": "1"}}


def listing(*items: dict, version: str = "5") -> dict:
    return {"items": list(items), "metadata": {"resourceVersion": version}}


def pools() -> dict[str, Pool]:
    metrics = RouterMetrics()
    return {role: Pool(role, metrics) for role in ("encoder", "decode")}


def state(pool: Pool) -> list[tuple[str, bool, str | None, str | None]]:
    return sorted((ep.url, ep.ready, ep.generation, ep.ec_zmq) for ep in pool.endpoints.values())


def token(api: FakeApiServer) -> Callable[[], Awaitable[Credentials]]:
    """Log in to `api` with a context that names no namespace; the discovery's defaults otherwise."""

    async def login() -> Credentials:
        return Credentials.from_token(api.url, "t")

    return login


def discovery(
    api: FakeApiServer, pools: dict[str, Pool], namespace: str | None = None, **kwargs: Any
) -> KubernetesDiscovery:
    async def login() -> Credentials:
        return Credentials.from_token(api.url, "t", namespace="ctx-ns")

    return KubernetesDiscovery(
        Kube(login), namespace, {"encoder": "tier=enc", "decode": "tier=dec"}, pools, retry_delay=0.01, **kwargs
    )


@pytest.fixture
async def api():
    async with fake_api_server() as fake:
        yield fake


async def test_start_lists_pods_and_slices_per_tier_in_the_contexts_namespace(api):
    api.answer(200, listing(pod("10.0.0.1", "g1")))  # encoder pods
    api.answer(200, listing(endpoint_slice("enc-a", "10.0.0.1")))  # encoder slices
    api.answer(200, listing(pod("10.0.1.1", "g1"), pod("10.0.1.2", None)))  # decode pods
    api.answer(200, listing(endpoint_slice("dec-a", "10.0.1.1", "10.0.1.2", "10.0.1.3")))
    p = pools()
    d = discovery(api, p, ec_consumer_role="decode", ec_port=14579)
    changed: list[str] = []
    d.on_change = changed.append
    await d.start()
    await d.close()
    assert d.namespace == "ctx-ns"
    assert [(r.path, r.query["labelSelector"]) for r in api.requests] == [
        ("/api/v1/namespaces/ctx-ns/pods", "tier=enc"),
        ("/apis/discovery.k8s.io/v1/namespaces/ctx-ns/endpointslices", "tier=enc"),
        ("/api/v1/namespaces/ctx-ns/pods", "tier=dec"),
        ("/apis/discovery.k8s.io/v1/namespaces/ctx-ns/endpointslices", "tier=dec"),
    ]
    assert state(p["encoder"]) == [("http://10.0.0.1:8000", True, "g1", None)]
    assert state(p["decode"]) == [
        ("http://10.0.1.1:8000", True, "g1", "tcp://10.0.1.1:14579"),
        ("http://10.0.1.2:8000", True, None, "tcp://10.0.1.2:14579"),  # a pod without the label: generation None
        ("http://10.0.1.3:8000", False, None, "tcp://10.0.1.3:14579"),  # its pod not seen yet: no work
    ]
    assert changed == ["encoder", "encoder", "decode", "decode"]


async def test_a_failed_first_list_is_logged_and_a_named_namespace_is_kept(api, caplog):
    api.answer(500, {"kind": "Status", "message": "etcd down"})
    p = pools()
    d = discovery(api, p, namespace="serving")
    d.selectors = {"encoder": "tier=enc"}
    with caplog.at_level(logging.WARNING, logger="epd_router.discovery"):
        await d.start()
    await d.close()
    assert d.namespace == "serving" and api.requests[0].path == "/api/v1/namespaces/serving/pods"
    assert caplog.messages == [
        "initial Pod list for encoder failed: GET /api/v1/namespaces/serving/pods: HTTP 500: etcd down"
    ]


async def test_watched_changes_reach_the_pools(api):
    api.answer(200, listing(pod("10.0.0.1", "g1")))
    api.answer(200, listing(endpoint_slice("enc-a", "10.0.0.1")))
    p = pools()
    d = discovery(api, p)
    d.selectors = {"encoder": "tier=enc"}
    await d.start()
    d._apply_pod("encoder", "ADDED", pod("10.0.0.2", "g2"))
    d._apply("encoder", "ADDED", endpoint_slice("enc-b", "10.0.0.2"))
    assert state(p["encoder"]) == [
        ("http://10.0.0.1:8000", True, "g1", None),
        ("http://10.0.0.2:8000", True, "g2", None),
    ]
    publishes: list[str] = []
    d.on_change = publishes.append
    d._apply_pod("encoder", "MODIFIED", pod("10.0.0.2", "g2"))  # a status change: the slice reports readiness
    assert publishes == []
    d._apply_pod("encoder", "MODIFIED", pod("10.0.0.2", "g3"))
    d._apply("encoder", "MODIFIED", endpoint_slice("enc-b", "10.0.0.2", ready=False))
    assert state(p["encoder"])[1] == ("http://10.0.0.2:8000", False, "g3", None)
    d._apply("encoder", "DELETED", endpoint_slice("enc-b"))
    d._apply_pod("encoder", "DELETED", pod("10.0.0.1", "g1"))
    assert state(p["encoder"]) == [("http://10.0.0.1:8000", False, None, None)]  # its pod unknown again
    d._apply("encoder", "ADDED", {"metadata": {}})  # nameless: ignored
    d._apply_pod("encoder", "ADDED", {})
    assert publishes == ["encoder"] * 4
    await d.close()


async def test_run_follows_the_watches(api):
    api.answer(200, listing())  # encoder pods
    api.answer(200, listing())  # encoder slices
    p = pools()
    d = discovery(api, p)
    d.selectors = {"encoder": "tier=enc"}
    await d.start()
    added = {"type": "ADDED", "object": {**pod("10.0.0.9", "g1"), "kind": "Pod"}}
    api.stream([added], hold=30, path="/api/v1/namespaces/ctx-ns/pods")
    sliced = {"type": "ADDED", "object": endpoint_slice("enc-z", "10.0.0.9")}
    api.stream([sliced], hold=30, path="/apis/discovery.k8s.io/v1/namespaces/ctx-ns/endpointslices")
    task = asyncio.create_task(d.run())
    try:
        async with asyncio.timeout(10):
            while state(p["encoder"]) != [("http://10.0.0.9:8000", True, "g1", None)]:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await d.close()
    assert {(r.query.get("watch"), r.query.get("resourceVersion")) for r in api.requests[2:]} == {("true", "5")}


def test_from_config_watches_the_tiers_with_a_selector_and_a_pool():
    cfg = RouterConfig(
        discovery="kubernetes",
        encoder_selector="tier=enc",
        prefill_selector="tier=pre",
        decode_selector="tier=dec",
        namespace="serving",
        backend_port_name="api",
        backend_port=9000,
        ec_consumer_port=14579,
    )
    d = KubernetesDiscovery.from_config(cfg, pools())  # no prefill pool: not watched
    assert d.selectors == {"encoder": "tier=enc", "decode": "tier=dec"}
    assert (d.namespace, d.port_name, d.default_port) == ("serving", "api", 9000)
    assert (d.ec_consumer_role, d.ec_port) == ("prefill", 14579)
    cfg.prefill_selector = None
    assert KubernetesDiscovery.from_config(cfg, pools()).ec_consumer_role == "decode"


async def test_without_a_namespace_anywhere_the_default_one_is_watched_and_a_failed_slice_list_is_logged(api, caplog):
    api.answer(200, listing(pod("10.0.0.1", "g1")))
    api.answer(500, {"kind": "Status", "message": "etcd down"})
    d = KubernetesDiscovery(Kube(token(api)), None, {"encoder": "tier=enc"}, pools())
    with caplog.at_level(logging.WARNING, logger="epd_router.discovery"):
        await d.start()
    await d.close()
    assert [r.path for r in api.requests] == [
        "/api/v1/namespaces/default/pods",
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
    ]
    assert caplog.messages == [
        "initial EndpointSlice list for encoder failed: "
        "GET /apis/discovery.k8s.io/v1/namespaces/default/endpointslices: HTTP 500: etcd down"
    ]


async def test_deletions_take_the_endpoints_and_unknown_ones_are_harmless(api):
    api.answer(200, listing(pod("10.0.0.1", "g1")))
    api.answer(200, listing(endpoint_slice("enc-a", "10.0.0.1"), endpoint_slice("enc-b", "10.0.0.2")))
    p = pools()
    d = discovery(api, p)
    d.selectors = {"encoder": "tier=enc"}
    await d.start()
    await d.close()
    # A DELETED event carries the object as it last was.
    d._apply("encoder", "DELETED", endpoint_slice("enc-b", "10.0.0.2"))
    assert state(p["encoder"]) == [("http://10.0.0.1:8000", True, "g1", None)]
    d._apply("encoder", "DELETED", endpoint_slice("enc-gone", "10.0.0.3"))  # seen neither listed nor added
    d._apply_pod("encoder", "DELETED", pod("10.0.0.3", "g1"))
    assert state(p["encoder"]) == [("http://10.0.0.1:8000", True, "g1", None)]


async def test_an_endpoint_without_a_pod_is_routed_to_on_the_default_port_names(api):
    # No targetRef: no pod whose generation could be awaited, so it is ready as its slice says.
    podless = {"addresses": ["10.0.0.5"], "conditions": {"ready": True}}
    several = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8001}]
    api.answer(200, listing())
    api.answer(
        200,
        listing(
            {"metadata": {"name": "enc-a"}, "ports": several, "endpoints": [podless]},
            {"metadata": {"name": "enc-b"}, "endpoints": [{"addresses": ["10.0.0.6"]}]},
        ),
    )
    p = pools()
    d = KubernetesDiscovery(Kube(token(api)), "ns", {"encoder": "tier=enc"}, p)
    await d.start()
    await d.close()
    assert state(p["encoder"]) == [
        ("http://10.0.0.5:8001", True, None, None),
        ("http://10.0.0.6:8000", True, None, None),
    ]


def kubeconfig_for(api: FakeApiServer, tmp_path, monkeypatch) -> str:
    """A kubeconfig naming `api`, the only one the discovery may use (no in-cluster account, no $KUBECONFIG)."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "from-ctx"}}],
                "current-context": "x",
            }
        )
    )
    return str(kubeconfig)


async def test_from_config_logs_in_with_the_named_kubeconfig_and_fills_the_pools(api, tmp_path, monkeypatch):
    kubeconfig = kubeconfig_for(api, tmp_path, monkeypatch)
    cfg = RouterConfig(
        discovery="kubernetes",
        kubeconfig=kubeconfig,
        prefill_selector="tier=pre",
        decode_selector="tier=dec",
        backend_port_name="api",
        backend_port=9000,
        ec_consumer_port=14579,
    )
    several = [{"name": "metrics", "port": 9090}, {"name": "api", "port": 8100}]
    api.answer(200, listing(pod("10.0.2.1", "g1")))
    api.answer(200, listing(endpoint_slice("pre-a", "10.0.2.1", ports=several)))
    api.answer(200, listing(pod("10.0.1.1", "g1")))
    api.answer(200, listing(endpoint_slice("dec-a", "10.0.1.1", ports=[])))
    p = {role: Pool(role, RouterMetrics()) for role in ("prefill", "decode")}
    d = KubernetesDiscovery.from_config(cfg, p)
    await d.start()
    await d.close()
    assert [(r.path, r.query["labelSelector"]) for r in api.requests] == [
        ("/api/v1/namespaces/from-ctx/pods", "tier=pre"),
        ("/apis/discovery.k8s.io/v1/namespaces/from-ctx/endpointslices", "tier=pre"),
        ("/api/v1/namespaces/from-ctx/pods", "tier=dec"),
        ("/apis/discovery.k8s.io/v1/namespaces/from-ctx/endpointslices", "tier=dec"),
    ]
    assert state(p["prefill"]) == [("http://10.0.2.1:8100", True, "g1", "tcp://10.0.2.1:14579")]  # the EC consumer
    assert state(p["decode"]) == [("http://10.0.1.1:9000", True, "g1", None)]


async def test_a_failed_watch_is_retried_and_the_pool_catches_up(api):
    api.answer(200, listing())  # encoder pods
    api.answer(200, listing())  # encoder slices
    p = pools()
    d = discovery(api, p)
    d.selectors = {"encoder": "tier=enc"}
    await d.start()
    for path, obj in (
        ("/api/v1/namespaces/ctx-ns/pods", {**pod("10.0.0.9", "g1"), "kind": "Pod"}),
        ("/apis/discovery.k8s.io/v1/namespaces/ctx-ns/endpointslices", endpoint_slice("enc-z", "10.0.0.9")),
    ):
        failed = {"kind": "Status", "code": 500, "reason": "InternalError", "message": "etcd down"}
        api.answer(500, failed, path=path)  # the watch fails
        api.answer(200, listing(), path=path)  # after the pause: list again
        api.stream([{"type": "ADDED", "object": obj}], hold=30, path=path)
    task = asyncio.create_task(d.run())
    try:
        async with asyncio.timeout(10):
            while state(p["encoder"]) != [("http://10.0.0.9:8000", True, "g1", None)]:
                assert not task.done(), task.exception()
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await d.close()


async def test_a_router_with_kubernetes_discovery_starts_with_what_it_listed_and_stops_its_watches(
    api, tmp_path, monkeypatch
):
    cfg = RouterConfig(
        discovery="kubernetes",
        kubeconfig=kubeconfig_for(api, tmp_path, monkeypatch),
        encoder_selector="tier=enc",
        decode_selector="tier=dec",
        health_interval=0,
    )
    api.answer(200, listing(pod("10.0.0.9", "g1")))
    api.answer(200, listing(endpoint_slice("enc-a", "10.0.0.9")))
    api.answer(200, listing(pod("10.0.1.1", "g1")))
    api.answer(200, listing(endpoint_slice("dec-a", "10.0.1.1")))
    for path in ("/api/v1/namespaces/from-ctx/pods", "/apis/discovery.k8s.io/v1/namespaces/from-ctx/endpointslices"):
        for _ in range(2):
            api.stream([], hold=30, path=path)  # the watches, quiet until the router stops
    router = Router(cfg)
    await router.start()
    try:
        assert state(router.encoders) == [("http://10.0.0.9:8000", True, "g1", None)]
        assert state(router.decodes) == [("http://10.0.1.1:8000", True, "g1", None)]
        (watching,) = [t for t in router._tasks if t.get_name() == "discovery"]
        assert not watching.done()
    finally:
        await router.stop()
    assert watching.cancelled()
