"""Router discovery from REAL EndpointSlices: the rendered headless Services and Deployments are
applied to the real control plane, kwok runs their pods, the endpointslice controller builds the
slices, and the router's discovery follows them (scale-up, a pod turning unready, scale-down).

The pods' addresses come from kwok's pod CIDR and are only read: health checks are off and no
request is sent, since traffic here may only go to 127.0.0.0/8 (routing itself is tested with
loopback backends in tests/loopback/router/).
"""

from __future__ import annotations

from epd_operator.api.validation import parse_epd
from epd_operator.render import render
from tests.support.cluster import KubeView, volumes
from tests.support.operator_run import epd_doc, wait_until
from tests.support.render_examples import MOONCAKE
from tests.support.router_stack import discovering_router


def rendered(kube: KubeView) -> dict[tuple[str, str], dict]:
    volumes(kube, "ec-cache")
    doc = epd_doc(namespace=kube.ns)
    objects = render(parse_epd(doc))
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def pool_view(pool) -> dict[str, tuple[str, bool]]:
    return {ep.pod: (ep.url, ep.available) for ep in pool.endpoints.values()}


def pod_urls(kube: KubeView, role: str, port: int = 8000) -> dict[str, str]:
    return {
        p["metadata"]["name"]: f"http://{p['status']['podIP']}:{port}"
        for p in kube.pods(**{"serving.epd.dev/role": role})
        if p.get("status", {}).get("podIP")
    }


async def test_router_follows_the_endpointslices_the_controller_builds(kube):
    objects = rendered(kube)
    for key in (
        ("Service", "vl-encoder"),
        ("Service", "vl-decode"),
        ("Deployment", "vl-encoder"),
        ("Deployment", "vl-decode"),
    ):
        kube.apply(objects[key])
    # Another deployment's encoder in the same namespace: same role label, other instance.
    other = {
        **objects[("Service", "vl-encoder")],
        "metadata": {**objects[("Service", "vl-encoder")]["metadata"], "name": "other-encoder"},
    }
    other["metadata"]["labels"] = {**other["metadata"]["labels"], "app.kubernetes.io/instance": "other"}
    kube.apply(other)

    await wait_until(
        lambda: len(pod_urls(kube, "decode")) == 2 and len(pod_urls(kube, "encoder")) == 1,
        60,
        lambda: [p["status"] for p in kube.pods()],
    )
    async with discovering_router(kube, objects) as (router, _url):
        await wait_until(
            lambda: pool_view(router.encoders) == {p: (u, True) for p, u in pod_urls(kube, "encoder").items()},
            30,
            lambda: (pool_view(router.encoders), pod_urls(kube, "encoder")),
        )
        await wait_until(
            lambda: pool_view(router.decodes) == {p: (u, True) for p, u in pod_urls(kube, "decode").items()},
            30,
            lambda: (pool_view(router.decodes), pod_urls(kube, "decode")),
        )

        # Scale-up: a second encoder pod appears in the slice.
        kube.kubectl("scale", "deployment/vl-encoder", "--replicas=2")
        await wait_until(lambda: len(router.encoders.available) == 2, 60, lambda: pool_view(router.encoders))
        assert set(pool_view(router.encoders)) == set(pod_urls(kube, "encoder"))

        # A pod turns unready: it stays known but gets no work.
        first = sorted(pod_urls(kube, "encoder"))[0]
        kube.set_pod_ready(first, False)
        await wait_until(
            lambda: pool_view(router.encoders).get(first, ("", True))[1] is False,
            30,
            lambda: pool_view(router.encoders),
        )
        assert [ep.pod for ep in router.encoders.available] == [p for p in pod_urls(kube, "encoder") if p != first]

        # The decode tier goes away: the router says it cannot serve.
        kube.delete("apps/v1", "Deployment", "vl-decode")
        await wait_until(lambda: not router.decodes.endpoints, 60, lambda: pool_view(router.decodes))


async def test_mooncake_consumer_address_comes_from_the_pod_ip(kube):
    objects = rendered(kube)
    kube.apply(objects[("Service", "vl-decode")])
    kube.apply(objects[("Deployment", "vl-decode")])
    await wait_until(lambda: len(pod_urls(kube, "decode")) == 2, 60)
    async with discovering_router(kube, objects, ec_consumer_port=14579) as (router, _url):
        await wait_until(lambda: len(router.decodes.endpoints) == 2, 30)
        ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in kube.pods(**{"serving.epd.dev/role": "decode"})}
        assert {(ep.pod, ep.url, ep.ec_zmq) for ep in router.decodes.endpoints.values()} == {
            (pod, f"http://{ip}:8000", f"tcp://{ip}:14579") for pod, ip in ips.items()
        }


async def test_each_dp_ranks_mooncake_address_comes_from_the_endpointslice(kube):
    """A Mooncake PD tier at DP 2, TP 2: its Service declares rank d's control port (ec-dp<d>: ec_port + d*TP),
    the endpointslice controller copies it into the slice, and the router pins rank d to that address. The
    router is deliberately given no TP (stride 1): the addresses can only have come from the slice."""
    volumes(kube, "ec-cache")
    doc = epd_doc(MOONCAKE, namespace=kube.ns)
    doc["spec"]["decode"].update(
        {
            "replicas": 1,
            "dataParallelSize": 2,
            "tensorParallelSize": 2,
            "nodeSelector": {},
            "resources": {"limits": {"nvidia.com/gpu": 4}},
        }
    )
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(parse_epd(doc))}
    kube.apply(objects[("Service", "vl-decode")])
    kube.apply(objects[("Deployment", "vl-decode")])
    await wait_until(lambda: len(pod_urls(kube, "decode")) == 1, 60, lambda: [p.get("status") for p in kube.pods()])
    async with discovering_router(kube, objects, ec_consumer_port=14579, decode_dp_size=2) as (router, _url):
        await wait_until(lambda: len(router.decodes.available) == 2, 30, lambda: router.decodes.describe())
        (ip,) = [p["status"]["podIP"] for p in kube.pods(**{"serving.epd.dev/role": "decode"})]
        assert sorted((ep.key, ep.rank, ep.ec_zmq) for ep in router.decodes.endpoints.values()) == [
            (f"{ip}:8000#dp0", 0, f"tcp://{ip}:14579"),
            (f"{ip}:8000#dp1", 1, f"tcp://{ip}:14581"),
        ]
