"""Where the backends are: static URLs (vLLM proxy flags) or Kubernetes EndpointSlices.

Kubernetes discovery lists and then watches the EndpointSlices selected per tier
(`/apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=…&watch=1`)
through plain aiohttp, with in-cluster service-account credentials or a kubeconfig.
Only endpoints whose `ready` condition is not false are routed to.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from urllib.parse import urlencode

import aiohttp
import orjson
import yaml

from .backends import DiscoveredEndpoint, Pool
from .config import RouterConfig

log = logging.getLogger("epd_router.discovery")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"


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
        zmq = cfg.ec_consumer_zmq_addrs if role == consumer_role and cfg.ec_consumer_zmq_addrs else [None] * len(urls)
        out[role] = [DiscoveredEndpoint(normalize_url(u), True, "", z) for u, z in zip(urls, zmq)]
    return out


# ---- credentials --------------------------------------------------------------------


@dataclass
class KubeAccess:
    server: str
    ssl_context: ssl.SSLContext | bool | None = None
    token: str | None = None
    token_file: str | None = None
    namespace: str | None = None  # the kubeconfig context's namespace, used when --namespace is absent
    _tmp: list[str] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_file:  # re-read: projected service-account tokens rotate
            with open(self.token_file) as fh:
                token = fh.read().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}

    @classmethod
    def in_cluster(cls) -> KubeAccess:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if ":" in host:
            host = f"[{host}]"
        ctx = ssl.create_default_context(cafile=f"{SA_DIR}/ca.crt")
        return cls(f"https://{host}:{port}", ctx, token_file=f"{SA_DIR}/token")

    @classmethod
    def from_kubeconfig(cls, path: str) -> KubeAccess:
        with open(path) as fh:
            conf = yaml.safe_load(fh) or {}
        current = conf.get("current-context")
        context = _named(conf.get("contexts"), current, "context") if current else (conf.get("contexts") or [{}])[0].get("context", {})
        cluster = _named(conf.get("clusters"), context.get("cluster"), "cluster")
        user = _named(conf.get("users"), context.get("user"), "user") if context.get("user") else {}
        base = os.path.dirname(os.path.abspath(path))
        access = cls(cluster["server"].rstrip("/"))
        if access.server.startswith("https"):
            if cluster.get("insecure-skip-tls-verify"):
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            elif cluster.get("certificate-authority-data"):
                ctx = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
            elif cluster.get("certificate-authority"):
                ctx = ssl.create_default_context(cafile=os.path.join(base, cluster["certificate-authority"]))
            else:
                ctx = ssl.create_default_context()
            cert = access._file(user, "client-certificate", base)
            key = access._file(user, "client-key", base)
            if cert and key:
                ctx.load_cert_chain(cert, key)
            access.ssl_context = ctx
        access.namespace = context.get("namespace")
        access.token = user.get("token")
        access.token_file = user.get("tokenFile")
        return access

    def _file(self, user: dict, name: str, base: str) -> str | None:
        if user.get(f"{name}-data"):
            fd, tmp = tempfile.mkstemp(prefix="epd-router-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(base64.b64decode(user[f"{name}-data"]))
            self._tmp.append(tmp)
            return tmp
        return os.path.join(base, user[name]) if user.get(name) else None

    def cleanup(self) -> None:
        for tmp in self._tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _named(entries, name, key) -> dict:
    for entry in entries or ():
        if entry.get("name") == name:
            return entry.get(key) or {}
    raise ValueError(f"kubeconfig has no {key} named {name!r}")


def default_access(kubeconfig: str | None) -> KubeAccess:
    if kubeconfig:
        return KubeAccess.from_kubeconfig(kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(f"{SA_DIR}/token"):
        return KubeAccess.in_cluster()
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
    return KubeAccess.from_kubeconfig(path)


# ---- EndpointSlices -----------------------------------------------------------------


def slice_endpoints(eps: dict, port_name: str, default_port: int, ec_port: int | None) -> list[DiscoveredEndpoint]:
    ports = eps.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == port_name and p.get("port")), None)
    if port is None:
        port = ports[0].get("port") if len(ports) == 1 and ports[0].get("port") else default_port
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
        out.append(DiscoveredEndpoint(f"http://{host}:{port}", ready, pod, zmq))
    return out


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class KubernetesDiscovery:
    def __init__(
        self,
        access: KubeAccess,
        namespace: str,
        selectors: dict[str, str],
        pools: dict[str, Pool],
        port_name: str = "http",
        default_port: int = 8000,
        ec_consumer_role: str | None = None,
        ec_port: int | None = None,
        retry_delay: float = 1.0,
    ) -> None:
        self.access = access
        self.namespace = namespace
        self.selectors = selectors
        self.pools = pools
        self.port_name = port_name
        self.default_port = default_port
        self.ec_consumer_role = ec_consumer_role
        self.ec_port = ec_port
        self.retry_delay = retry_delay
        self.session: aiohttp.ClientSession | None = None
        self._slices: dict[str, dict[str, dict]] = {role: {} for role in selectors}
        self._listed_at: dict[str, str] = {}
        self.on_change: Callable[[str], None] | None = None

    @classmethod
    def from_config(cls, cfg: RouterConfig, pools: dict[str, Pool]) -> KubernetesDiscovery:
        selectors = {"encoder": cfg.encoder_selector, "prefill": cfg.prefill_selector, "decode": cfg.decode_selector}
        selectors = {role: sel for role, sel in selectors.items() if sel and role in pools}
        consumer = "prefill" if cfg.disaggregated_prefill else "decode"
        access = default_access(cfg.kubeconfig)
        return cls(
            access,
            cfg.namespace or access.namespace or _own_namespace(),
            selectors,
            pools,
            cfg.backend_port_name,
            cfg.backend_port,
            consumer,
            cfg.ec_consumer_port,
        )

    async def start(self) -> None:
        """Open the session and do a first list, so the router starts with endpoints."""
        self.session = aiohttp.ClientSession(read_bufsize=2**22)
        for role in self.selectors:
            try:
                self._listed_at[role] = await self._list(role)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
                log.warning("initial EndpointSlice list for %s failed: %s", role, exc)

    async def run(self) -> None:
        await asyncio.gather(*(self._follow(role) for role in self.selectors))

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.access.cleanup()

    def _url(self, role: str, **params) -> str:
        query = urlencode({"labelSelector": self.selectors[role], **params})
        return f"{self.access.server}{SLICES_PATH.format(ns=self.namespace)}?{query}"

    async def _list(self, role: str) -> str:
        async with self.session.get(self._url(role), headers=self.access.headers(), ssl=self.access.ssl_context) as r:
            if r.status != 200:
                raise ValueError(f"listing EndpointSlices: HTTP {r.status}: {(await r.text())[:200]}")
            doc = orjson.loads(await r.read())
        self._slices[role] = {s["metadata"]["name"]: s for s in doc.get("items") or ()}
        self._publish(role)
        return (doc.get("metadata") or {}).get("resourceVersion") or ""

    async def _watch(self, role: str, resource_version: str) -> AsyncIterator[tuple[str, dict]]:
        params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = aiohttp.ClientTimeout(total=None, sock_read=330)
        async with self.session.get(self._url(role, **params), headers=self.access.headers(), ssl=self.access.ssl_context, timeout=timeout) as r:
            if r.status == 410:
                raise WatchExpired()
            if r.status != 200:
                raise ValueError(f"watching EndpointSlices: HTTP {r.status}")
            async for line in r.content:
                line = line.strip()
                if line:
                    event = orjson.loads(line)
                    yield event.get("type", ""), event.get("object") or {}

    async def _follow(self, role: str) -> None:
        resource_version = self._listed_at.get(role)  # None: list (again) before watching
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list(role)
                async for kind, obj in self._watch(role, resource_version):
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise WatchExpired()
                        raise ValueError(f"watch error: {obj.get('message')}")
                    resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
                    if kind != "BOOKMARK":
                        self._apply(role, kind, obj)
                # The server ended the watch (timeoutSeconds): resume from the last version seen.
            except asyncio.CancelledError:
                raise
            except WatchExpired:
                log.info("EndpointSlice watch for %s expired; listing again", role)
                resource_version = None
            except Exception as exc:  # network trouble or a bad event: list again after a pause
                log.warning("EndpointSlice watch for %s failed: %s", role, exc)
                resource_version = None
                await asyncio.sleep(self.retry_delay)

    def _apply(self, role: str, kind: str, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if kind == "DELETED":
            self._slices[role].pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._slices[role][name] = obj
        else:
            return
        self._publish(role)

    def _publish(self, role: str) -> None:
        ec_port = self.ec_port if role == self.ec_consumer_role else None
        endpoints = [
            ep
            for s in self._slices[role].values()
            for ep in slice_endpoints(s, self.port_name, self.default_port, ec_port)
        ]
        self.pools[role].update(endpoints)
        if self.on_change is not None:
            self.on_change(role)


def _own_namespace() -> str:
    try:
        with open(f"{SA_DIR}/namespace") as fh:
            return fh.read().strip()
    except OSError:
        return "default"
