"""An in-process router in front of scripted fake vLLM backends, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from epd_operator.router.config import RouterConfig
from epd_operator.router.main import listening_socket
from epd_operator.router.server import Router, RouterServer

from .fake_vllm import FakeVLLM


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Until `condition()` holds, polling every 5 ms; fails after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


def request_counts(router: Router) -> dict[tuple[str, str], float]:
    """`epd_router_requests_total` by (route, status)."""
    return {
        (s.labels["route"], s.labels["status"]): s.value
        for family in router.metrics.registry.collect()
        for s in family.samples
        if s.name == "epd_router_requests_total"
    }


def router_argv(port: int, *args: str) -> list[str]:
    """The real `epd-router` process (this checkout's, by module) on 127.0.0.1:`port`, with `args`."""
    return [sys.executable, "-m", "epd_operator.router.main", "--host", "127.0.0.1", "--port", str(port), *args]


@dataclass
class Reply:
    status: int
    headers: CIMultiDict[str]
    body: bytes

    def json(self):
        return orjson.loads(self.body)


@dataclass
class Stack:
    router: Router
    url: str
    session: aiohttp.ClientSession
    encoders: list[FakeVLLM] = field(default_factory=list)
    prefills: list[FakeVLLM] = field(default_factory=list)
    decodes: list[FakeVLLM] = field(default_factory=list)
    server: RouterServer | None = None  # the listening router: `shutdown()` drains it

    async def post(self, path: str, doc=None, *, data: bytes | None = None, headers: dict | None = None) -> Reply:
        payload = data if data is not None else orjson.dumps(doc)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        async with self.session.post(self.url + path, data=payload, headers=hdrs) as r:
            return Reply(r.status, CIMultiDict(r.headers), await r.read())

    async def get(self, path: str, headers: dict | None = None) -> Reply:
        async with self.session.get(self.url + path, headers=headers or {}) as r:
            return Reply(r.status, CIMultiDict(r.headers), await r.read())

    def all_backends(self) -> list[FakeVLLM]:
        return [*self.encoders, *self.prefills, *self.decodes]


async def serve_router(router: Router) -> tuple[RouterServer, str]:
    server = await router.serve(listening_socket("127.0.0.1", 0))
    return server, server.url


@asynccontextmanager
async def router_stack(encoders: int = 2, prefills: int = 0, decodes: int = 1, pd_role: str | None = None, **config):
    """Start fakes and a router over them. Health checking is off unless `health_interval` is given:
    tests drive `stack.router.health.check_all()` themselves."""
    fakes_e = [FakeVLLM("encoder", f"e{i}") for i in range(encoders)]
    fakes_p = [FakeVLLM("prefill", f"p{i}") for i in range(prefills)]
    fakes_d = [FakeVLLM(pd_role or ("decode" if prefills else "pd"), f"d{i}") for i in range(decodes)]
    started: list[FakeVLLM] = []
    runner = None
    try:
        for fake in (*fakes_e, *fakes_p, *fakes_d):
            await fake.start()
            started.append(fake)
        config.setdefault("health_interval", 0)
        cfg = RouterConfig(
            encode_urls=[f.url for f in fakes_e],
            prefill_urls=[f.url for f in fakes_p] or None,
            decode_urls=[f.url for f in fakes_d],
            **config,
        )
        router = Router(cfg)
        runner, url = await serve_router(router)
        async with aiohttp.ClientSession() as session:
            yield Stack(router, url, session, fakes_e, fakes_p, fakes_d, runner)
    finally:
        if runner is not None:
            await runner.cleanup()
        for fake in started:
            await fake.stop()


@asynccontextmanager
async def discovering_router(
    kube: Any, objects: dict, prepare: Callable[[Router], None] | None = None, **extra: Any
) -> AsyncIterator[tuple[Router, str]]:
    """A router discovering the rendered tiers of `objects` (keyed by (kind, name)) in `kube`'s
    namespace through the real API server, with the selectors the operator renders into its args.
    `prepare(router)` runs before it serves (and so before discovery starts); yields (router, url)."""
    router_args = objects[("Deployment", "vl-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
    selector = {flag: router_args[i + 1] for i, flag in enumerate(router_args) if flag.endswith("-selector")}
    cfg = RouterConfig(
        discovery="kubernetes",
        kubeconfig=str(kube.kubeconfig),
        namespace=kube.ns,
        encoder_selector=selector["--encoder-selector"],
        decode_selector=selector["--decode-selector"],
        health_interval=0,
        **extra,
    )
    router = Router(cfg)
    if prepare is not None:
        prepare(router)
    runner, url = await serve_router(router)
    try:
        yield router, url
    finally:
        await runner.cleanup()
