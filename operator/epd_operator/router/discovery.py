"""Where the backends are: static URLs (vLLM proxy flags) or Kubernetes EndpointSlices.

Kubernetes discovery lists and then watches the EndpointSlices selected per tier through the shared
access layer (epd_operator.kube: in-cluster service account, else the kubeconfig with every
`KUBECONFIG` path merged and exec plugins; re-lists on 410 Gone). Only endpoints whose `ready`
condition is not false are routed to.

EndpointSlices do not carry pod labels, so the tier's pods are watched too (same selector) for one
label: the compatibility generation, which the router pairs tiers by. An endpoint whose pod the pod
watch has not shown yet gets no work until it has: its generation is unknown.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Any

from ..api.labels import GENERATION_LABEL
from ..kube import ENDPOINT_SLICE, POD, REQUEST_ERRORS, RETRY_DELAY, Kube, ListWatch, load_credentials
from .backends import DiscoveredEndpoint, Pool
from .config import RouterConfig
from .contract import EC_RANK_PORT_PREFIX

log = logging.getLogger("epd_router.discovery")


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def split_urls(value: str | None) -> list[str]:
    return [normalize_url(u) for u in (value or "").split(",") if u.strip()]


def static_endpoints(cfg: RouterConfig) -> dict[str, list[DiscoveredEndpoint]]:
    consumer_role = "prefill" if cfg.disaggregated_prefill else "decode"
    roles = {"encoder": cfg.encode_urls, "decode": cfg.decode_urls}
    if cfg.disaggregated_prefill:
        roles["prefill"] = cfg.prefill_urls or []
    out: dict[str, list[DiscoveredEndpoint]] = {}
    for role, urls in roles.items():
        addrs = cfg.ec_consumer_zmq_addrs if role == consumer_role else []
        dp = cfg.ec_consumer_dp_size
        out[role] = [
            DiscoveredEndpoint(
                normalize_url(u),
                True,
                "",
                addrs[i * dp] if addrs else None,
                ec_zmq_ranks=tuple(addrs[i * dp : (i + 1) * dp]) if addrs and dp > 1 else (),
            )
            for i, u in enumerate(urls)
        ]
    return out


# ---- EndpointSlices -----------------------------------------------------------------


def slice_endpoints(eps: dict, port_name: str, default_port: int, ec_port: int | None) -> list[DiscoveredEndpoint]:
    ports = eps.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == port_name and p.get("port")), None)
    if port is None:
        port = ports[0].get("port") if len(ports) == 1 and ports[0].get("port") else default_port
    rank_ports = _rank_ports(ports)
    out = []
    for ep in eps.get("endpoints") or ():
        addresses = ep.get("addresses") or ()
        if not addresses:
            continue
        addr = addresses[0]
        host = f"[{addr}]" if ":" in addr else addr
        # Kubernetes: an unset `ready` condition means ready.
        ready = (ep.get("conditions") or {}).get("ready") is not False
        ref = ep.get("targetRef") or {}
        pod = ref.get("name", "") if ref.get("kind", "Pod") == "Pod" else ""
        zmq = f"tcp://{host}:{ec_port}" if ec_port is not None else None
        ranks = tuple(f"tcp://{host}:{p}" for p in rank_ports) if ec_port is not None else ()
        out.append(
            DiscoveredEndpoint(f"http://{host}:{port}", ready, pod, ranks[0] if ranks else zmq, ec_zmq_ranks=ranks)
        )
    return out


def _rank_ports(ports: list[dict]) -> list[int]:
    """A Mooncake consumer's control port per DP rank, as its Service declares them (`ec-dp<d>`), in rank
    order; empty unless ranks 0..n-1 are all there."""
    by_rank = {}
    for p in ports:
        name = p.get("name") or ""
        if name.startswith(EC_RANK_PORT_PREFIX) and name[len(EC_RANK_PORT_PREFIX) :].isdigit() and p.get("port"):
            by_rank[int(name[len(EC_RANK_PORT_PREFIX) :])] = p["port"]
    return [by_rank[d] for d in range(len(by_rank))] if set(by_rank) == set(range(len(by_rank))) else []


def _generation(pod: dict) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(GENERATION_LABEL, "")


def with_generation(ep: DiscoveredEndpoint, generations: dict[str, str]) -> DiscoveredEndpoint:
    """`ep` with its pod's generation; not ready while its pod (and so its generation) is unknown."""
    generation = generations.get(ep.pod)
    if generation is None:
        return dataclasses.replace(ep, ready=False) if ep.pod else ep
    return dataclasses.replace(ep, generation=generation or None)


class KubernetesDiscovery:
    def __init__(
        self,
        kube: Kube,
        namespace: str | None,
        selectors: dict[str, str],
        pools: dict[str, Pool],
        port_name: str = "http",
        default_port: int = 8000,
        ec_consumer_role: str | None = None,
        ec_port: int | None = None,
        retry_delay: float = RETRY_DELAY,
    ) -> None:
        self.kube = kube
        self.namespace = namespace  # None: the kubeconfig context's, else the pod's, else "default"
        self.selectors = selectors
        self.pools = pools
        self.port_name = port_name
        self.default_port = default_port
        self.ec_consumer_role = ec_consumer_role
        self.ec_port = ec_port
        self.retry_delay = retry_delay
        self._slices: dict[str, dict[str, dict]] = {role: {} for role in selectors}
        # Pod name -> its generation label ("" when it has none), per role: all the pod watch keeps.
        self._generations: dict[str, dict[str, str]] = {role: {} for role in selectors}
        self.watches: dict[str, ListWatch] = {}
        self.pod_watches: dict[str, ListWatch] = {}
        self.on_change: Callable[[str], None] | None = None

    @classmethod
    def from_config(cls, cfg: RouterConfig, pools: dict[str, Pool]) -> KubernetesDiscovery:
        wanted = {"encoder": cfg.encoder_selector, "prefill": cfg.prefill_selector, "decode": cfg.decode_selector}
        selectors = {role: sel for role, sel in wanted.items() if sel and role in pools}
        consumer = "prefill" if cfg.disaggregated_prefill else "decode"
        kube = Kube(lambda: load_credentials(cfg.kubeconfig))
        return cls(
            kube,
            cfg.namespace,
            selectors,
            pools,
            cfg.backend_port_name,
            cfg.backend_port,
            consumer,
            cfg.ec_consumer_port,
        )

    async def start(self) -> None:
        """Log in (no credentials: fail now) and list once, so the router starts with endpoints."""
        login = await self.kube.login()
        if self.namespace is None:
            self.namespace = login.default_namespace or "default"
        for role, selector in self.selectors.items():
            self.watches[role] = ListWatch(
                self.kube,
                ENDPOINT_SLICE,
                self.namespace,
                label_selector=selector,
                on_sync=functools.partial(self._sync, role),
                on_event=functools.partial(self._apply, role),
                retry_delay=self.retry_delay,
            )
            self.pod_watches[role] = ListWatch(
                self.kube,
                POD,
                self.namespace,
                label_selector=selector,
                on_sync=functools.partial(self._sync_pods, role),
                on_event=functools.partial(self._apply_pod, role),
                retry_delay=self.retry_delay,
            )
            for what, watch in (("Pod", self.pod_watches[role]), ("EndpointSlice", self.watches[role])):
                try:
                    await watch.list()
                except REQUEST_ERRORS as exc:  # the watch lists again until it succeeds
                    log.warning("initial %s list for %s failed: %s", what, role, exc)

    async def run(self) -> None:
        await asyncio.gather(*(watch.run() for watch in (*self.watches.values(), *self.pod_watches.values())))

    async def close(self) -> None:
        await self.kube.close()

    def _sync(self, role: str, items: list[dict[str, Any]]) -> None:
        self._slices[role] = {s["metadata"]["name"]: s for s in items}
        self._publish(role)

    def _apply(self, role: str, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if kind == "DELETED":
            self._slices[role].pop(name, None)
        else:
            self._slices[role][name] = obj
        self._publish(role)

    def _sync_pods(self, role: str, items: list[dict[str, Any]]) -> None:
        self._generations[role] = {p["metadata"]["name"]: _generation(p) for p in items}
        self._publish(role)

    def _apply_pod(self, role: str, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        known = self._generations[role]
        if kind == "DELETED":
            known.pop(name, None)
        elif known.get(name) != _generation(obj):
            known[name] = _generation(obj)
        else:
            return  # a status change: the EndpointSlice reports readiness
        self._publish(role)

    def _publish(self, role: str) -> None:
        ec_port = self.ec_port if role == self.ec_consumer_role else None
        generations = self._generations[role]
        endpoints = [
            with_generation(ep, generations)
            for s in self._slices[role].values()
            for ep in slice_endpoints(s, self.port_name, self.default_port, ec_port)
        ]
        self.pools[role].update(endpoints)
        if self.on_change is not None:
            self.on_change(role)
