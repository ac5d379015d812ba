"""Router discovery through EndpointSlices served by the API emulator: endpoints appear,
become unready, disappear; only ready ones get traffic; pod names label the HPA metric."""

from contextlib import asynccontextmanager

import aiohttp
import orjson

from epd_operator.router.config import RouterConfig
from epd_operator.router.server import Router
from tests.support.fake_vllm import FakeVLLM
from tests.support.router_stack import serve_router

NS = "default"
ENC_SEL = "serving.epd.dev/role=encoder,app.kubernetes.io/instance=vl"
DEC_SEL = "serving.epd.dev/role=decode,app.kubernetes.io/instance=vl"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
IMG = {"type": "image_url", "image_url": {"url": "https://img/a.png"}}


def endpoint_slice(name: str, role: str, port: int, endpoints: list[tuple[str, str, bool | None]], instance: str = "vl") -> dict:
    """endpoints: (address, pod name, ready) — ready None leaves the condition unset."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"serving.epd.dev/role": role, "app.kubernetes.io/instance": instance, "kubernetes.io/service-name": f"{instance}-{role}"},
        },
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9999, "protocol": "TCP"}, {"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [addr],
                "conditions": {} if ready is None else {"ready": ready},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
            }
            for addr, pod, ready in endpoints
        ],
    }


def port_of(fake: FakeVLLM) -> int:
    return int(fake.url.rsplit(":", 1)[1])


@asynccontextmanager
async def discovering_router(kubeconfig, **extra):
    cfg = RouterConfig(
        discovery="kubernetes",
        kubeconfig=str(kubeconfig),
        namespace=NS,
        encoder_selector=ENC_SEL,
        decode_selector=DEC_SEL,
        health_interval=0,
        **extra,
    )
    router = Router(cfg)
    runner, url = await serve_router(router)
    try:
        async with aiohttp.ClientSession() as session:
            yield router, url, session
    finally:
        await runner.cleanup()


def pool_view(pool) -> dict[str, tuple[str, bool]]:
    return {ep.url: (ep.pod, ep.available) for ep in pool.endpoints.values()}


async def patch_slice(apiserver_url: str, name: str, patch: dict) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.patch(f"{apiserver_url}{SLICES}/{name}", data=orjson.dumps(patch),
                           headers={"Content-Type": "application/merge-patch+json"}) as r:
            assert r.status == 200, await r.text()


async def test_router_follows_endpointslices_and_routes_only_to_ready_endpoints(apiserver, apiserver_url, kubeconfig):
    async with FakeVLLM("encoder", "e0") as e0, FakeVLLM("encoder", "e1") as e1, FakeVLLM("pd", "d0") as d0:
        apiserver.create_object(endpoint_slice("vl-encoder-a", "encoder", port_of(e0), [("127.0.0.1", "vl-encoder-0", True)]))
        apiserver.create_object(endpoint_slice("vl-decode-a", "decode", port_of(d0), [("127.0.0.1", "vl-decode-0", None)]))
        # Another deployment's slice: same role label, other instance — never ours.
        apiserver.create_object(endpoint_slice("other-encoder", "encoder", 1, [("127.0.0.9", "other-0", True)], instance="other"))
        async with discovering_router(kubeconfig) as (router, url, session):
            assert pool_view(router.encoders) == {e0.url: ("vl-encoder-0", True)}
            assert pool_view(router.decodes) == {d0.url: ("vl-decode-0", True)}  # unset ready counts as ready

            async def ask() -> int:
                body = {"model": "m", "messages": [{"role": "user", "content": [IMG]}]}
                async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body)) as r:
                    return r.status

            assert await ask() == 200 and len(e0.received) == 1

            # A second encoder appears (scale-up), as its own slice.
            apiserver.create_object(endpoint_slice("vl-encoder-b", "encoder", port_of(e1), [("127.0.0.1", "vl-encoder-1", True)]))
            await apiserver.wait_for(lambda: e1.url in router.encoders.endpoints)

            # e0's pod turns unready: it keeps its place but gets no work.
            await patch_slice(apiserver_url, "vl-encoder-a", {"endpoints": [
                {"addresses": ["127.0.0.1"], "conditions": {"ready": False}, "targetRef": {"kind": "Pod", "name": "vl-encoder-0"}}]})
            await apiserver.wait_for(lambda: not router.encoders.endpoints[e0.url].available)
            assert [ep.url for ep in router.encoders.available] == [e1.url]
            assert await ask() == 200 and (len(e0.received), len(e1.received)) == (1, 1)

            # The HPA metric carries the pod name from the slice's targetRef.
            async with session.get(url + "/metrics") as r:
                text = (await r.read()).decode()
            assert f'epd_router_endpoint_inflight{{endpoint="127.0.0.1:{port_of(e1)}",pod="vl-encoder-1",role="encoder"}} 0.0' in text

            # Both encoder slices disappear: requests still succeed, media goes raw to PD.
            apiserver.delete_object("discovery.k8s.io/v1", "EndpointSlice", "vl-encoder-a", NS)
            apiserver.delete_object("discovery.k8s.io/v1", "EndpointSlice", "vl-encoder-b", NS)
            await apiserver.wait_for(lambda: not router.encoders.endpoints)
            assert await ask() == 200
            assert d0.bodies()[-1]["messages"][0]["content"][0]["type"] == "image_url"

            # Decode disappears: the router says it cannot serve.
            apiserver.delete_object("discovery.k8s.io/v1", "EndpointSlice", "vl-decode-a", NS)
            await apiserver.wait_for(lambda: not router.decodes.endpoints)
            async with session.get(url + "/health") as r:
                assert r.status == 503
            assert await ask() == 503


async def test_mooncake_consumer_address_comes_from_the_pod_ip(apiserver, kubeconfig):
    apiserver.create_object(endpoint_slice("vl-decode-a", "decode", 8000, [("10.1.2.3", "vl-decode-0", True)]))
    async with discovering_router(kubeconfig, ec_consumer_port=14579) as (router, _url, _session):
        [ep] = router.decodes.endpoints.values()
        assert (ep.url, ep.ec_zmq, ep.pod) == ("http://10.1.2.3:8000", "tcp://10.1.2.3:14579", "vl-decode-0")


async def test_a_watch_ended_by_the_server_is_resumed(apiserver, kubeconfig):
    apiserver.create_object(endpoint_slice("vl-decode-a", "decode", 8000, [("10.0.0.1", "d-0", True)]))
    async with discovering_router(kubeconfig) as (router, _url, _session):
        apiserver.stop_watches()  # as an API server does when timeoutSeconds runs out
        apiserver.create_object(endpoint_slice("vl-decode-b", "decode", 8000, [("10.0.0.2", "d-1", True)]))
        await apiserver.wait_for(lambda: len(router.decodes.available) == 2)
