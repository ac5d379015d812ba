"""An image change on a running EPDDeployment, on the REAL control plane: the operator applies the new
generation, the real Deployment controller rolls every vLLM tier (kwok runs the pods), the router
discovers old and new pods from the real EndpointSlices and Pods, and a steady client keeps sending
requests through it the whole time.

Pod addresses come from kwok's CIDR and may not be dialled (traffic stays on 127.0.0.0/8), so each pod
the router discovers is served by a loopback fake vLLM of the pod's generation. The fakes stamp their
transfer parameters with their generation and refuse another's (400, counted), as two vLLM builds
would fail each other's: a request that mixed generations would show there.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp

from epd_operator.api.validation import parse_epd
from epd_operator.controller.metrics import Metrics
from epd_operator.render import render
from epd_operator.render.generation import compatibility_generation
from epd_operator.router.backends import DiscoveredEndpoint, Pool
from epd_operator.router.server import Router
from tests.support.cluster import KubeView, volumes
from tests.support.fake_vllm import FakeVLLM
from tests.support.operator_run import create, epd, epd_doc, operator_in_process, patch_spec, phase, wait_until
from tests.support.router_stack import discovering_router

GENERATION = "serving.epd.dev/compat-generation"
NEW_IMAGE = "vllm/vllm-openai:v0.33.1"
CHAT = "/v1/chat/completions"
# Pods one (role, generation) can have at once: replicas plus the rollout's surge.
PODS_PER_GENERATION = 4


class LoopbackPods:
    """A fake vLLM per pod the router discovers, of that pod's generation (fakes are started up front,
    since a pool's update is synchronous, and handed to pods in order of appearance)."""

    def __init__(self) -> None:
        self.free: dict[tuple[str, str], list[FakeVLLM]] = {}
        self.by_pod: dict[str, FakeVLLM] = {}
        self.fakes: list[FakeVLLM] = []

    async def start(self, roles: dict[str, str], generations: list[str]) -> None:
        for role, fake_role in roles.items():
            for generation in generations:
                fakes = [
                    FakeVLLM(fake_role, f"{role}-{generation}-{i}", generation=generation)
                    for i in range(PODS_PER_GENERATION)
                ]
                for fake in fakes:
                    await fake.start()
                self.fakes += fakes
                self.free[(role, generation)] = fakes

    async def stop(self) -> None:
        for fake in self.fakes:
            await fake.stop()

    def serve_all(self, router: Router) -> None:
        """Route every pool of `router` to loopback fakes (before it discovers anything)."""
        for pool in router.pools:
            self.serve(pool)

    def serve(self, pool: Pool) -> None:
        """Route `pool`'s discovered pods to loopback fakes from now on."""
        update = pool.update

        def to_loopback(discovered: list[DiscoveredEndpoint]) -> None:
            mapped = []
            for d in discovered:
                fake = self.by_pod.get(d.pod)
                if fake is None and d.generation is not None:
                    fake = self.by_pod[d.pod] = self.free[(pool.role, d.generation)].pop(0)
                # A pod whose generation is still unknown is not ready: it keeps its (unused) address.
                mapped.append(DiscoveredEndpoint(fake.url, d.ready, d.pod, d.ec_zmq, d.generation) if fake else d)
            update(mapped)

        pool.update = to_loopback  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def steady_client(url: str, clients: int = 4, interval: float = 0.02) -> AsyncIterator[Counter]:
    """`clients` loops of requests one after another (each with a new image) until the block ends;
    counts the statuses."""
    statuses: Counter = Counter()
    stop = asyncio.Event()

    async def run(client: int) -> None:
        async with aiohttp.ClientSession() as session:
            n = 0
            while not stop.is_set():
                n += 1
                image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{client:04d}{n:08d}"}}
                body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "?"}, image]}]}
                async with session.post(url + CHAT, json=body) as r:
                    await r.read()
                    statuses[r.status] += 1
                await asyncio.sleep(interval)

    tasks = [asyncio.create_task(run(client)) for client in range(clients)]
    try:
        yield statuses
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def pod_generations(kube: KubeView) -> Counter:
    return Counter(
        (p["metadata"]["labels"]["serving.epd.dev/role"], p["metadata"]["labels"].get(GENERATION))
        for p in kube.pods()
        if p["metadata"]["labels"].get("serving.epd.dev/role") != "router"
        and not p["metadata"].get("deletionTimestamp")
    )


async def record_overlap(
    router: Router, operator: Metrics, old: str, new: str, seen: list[Counter], reported: list[set[str]]
) -> None:
    """Every 10 ms: append to `seen` what the router had available when it had both generations, and to
    `reported` the generations the operator's capacity metric named when it named both."""
    while True:
        now = available(router)
        if {old, new} <= {generation for _, generation in now}:
            seen.append(now)
        generations = {
            s.labels["generation"]
            for family in operator.registry.collect()
            for s in family.samples
            if s.name == "epd_operator_generation_ready_pods"
        }
        if {old, new} <= generations:
            reported.append(generations)
        await asyncio.sleep(0.01)


def available(router: Router) -> Counter:
    return Counter((pool.role, ep.generation) for pool in router.pools for ep in pool.available)


async def test_an_image_change_rolls_every_tier_and_no_request_crosses_generations(kube: KubeView):
    volumes(kube, "ec-cache")
    doc = epd_doc(namespace=kube.ns)
    old = compatibility_generation(parse_epd(doc))
    new = compatibility_generation(parse_epd({**doc, "spec": {**doc["spec"], "image": NEW_IMAGE}}))
    assert old != new
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render(parse_epd(doc))}

    pods = LoopbackPods()
    await pods.start({"encoder": "encoder", "decode": "pd"}, [old, new])
    try:
        async with operator_in_process(
            kube, "--namespace", kube.ns, "--no-leader-election", "--resync-seconds", "1"
        ) as metrics:
            await create(kube, doc)
            await phase(kube, "Ready", timeout=60)
            async with discovering_router(kube, objects, prepare=pods.serve_all) as (router, url):
                await wait_until(
                    lambda: available(router) == Counter({("encoder", old): 1, ("decode", old): 2}),
                    30,
                    lambda: available(router),
                )
                overlap: list[Counter] = []
                reported: list[set[str]] = []
                mixed = asyncio.create_task(record_overlap(router, metrics, old, new, overlap, reported))
                async with steady_client(url) as statuses:
                    await wait_until(lambda: statuses[200] >= 20, 30, lambda: statuses)
                    await patch_spec(kube, {"image": NEW_IMAGE})
                    # The Deployment controller replaces every vLLM pod; the router follows.
                    await wait_until(
                        lambda: pod_generations(kube) == Counter({("encoder", new): 1, ("decode", new): 2}),
                        120,
                        lambda: pod_generations(kube),
                    )
                    await wait_until(
                        lambda: available(router) == Counter({("encoder", new): 1, ("decode", new): 2}),
                        60,
                        lambda: available(router),
                    )

                    def served_by_new() -> int:
                        return sum(len(f.received) for f in pods.fakes if f.generation == new and f.role == "pd")

                    settled = served_by_new()
                    await wait_until(lambda: served_by_new() >= settled + 20, 30, lambda: statuses)
                mixed.cancel()
                await phase(kube, "Ready", timeout=60)
                # The status reports capacity per generation: only the new one is left.
                await wait_until(
                    lambda: (
                        epd(kube)["status"].get("generations")
                        == [
                            {
                                "name": new,
                                "current": True,
                                "pods": {"encoder": 1, "decode": 2},
                                "readyPods": {"encoder": 1, "decode": 2},
                            }
                        ]
                    ),
                    30,
                    lambda: epd(kube)["status"].get("generations"),
                )
    finally:
        await pods.stop()

    # The router did route while old and new pods were both up (the rollout surges: new before old goes).
    assert overlap, "the router never saw both generations at once"
    assert reported, "the operator never reported capacity in both generations"
    assert set(statuses) == {200}, statuses
    assert sum(f.foreign_refused for f in pods.fakes) == 0
    # Both generations served the client, each with its own encoders: no request went across.
    for generation in (old, new):
        encoded = sum(len(f.received) for f in pods.fakes if f.generation == generation and f.role == "encoder")
        answered = sum(len(f.received) for f in pods.fakes if f.generation == generation and f.role == "pd")
        assert answered > 0, generation
        assert encoded <= answered  # an encoder of the generation worked only for its consumers
        for fake in pods.fakes:
            if fake.generation == generation and fake.role == "pd":
                for body in fake.bodies():
                    for part in body["messages"][0]["content"]:
                        if part["type"] == "image_embeds":
                            assert part["image_embeds"]["generation"] == [generation]
