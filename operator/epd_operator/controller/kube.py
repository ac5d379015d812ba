"""A small async Kubernetes API client for the operator's own reads and writes.

kopf watches and dispatches; this client does what kopf does not: server-side apply, label-selected
lists, deletes with preconditions, status patches, Events and Leases. It speaks plain JSON over
aiohttp (already a kopf dependency) and authenticates with kopf's own `ConnectionInfo` (kubeconfig
or in-cluster service account), so kopf and the operator always use one set of credentials and no
second Kubernetes library is pulled in.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import kopf

from ..api.spec import GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)

FIELD_MANAGER = "epd-operator"


@dataclasses.dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    # Served only where its CRDs are installed (Gateway API): listing it elsewhere finds nothing.
    optional: bool = False

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced:
            if namespace is None:
                raise ValueError(f"{self.kind} is namespaced: a namespace is required")
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name)}"
        if subresource is not None:
            base += f"/{subresource}"
        return base


EPD = Resource(f"{GROUP}/{VERSION}", KIND, PLURAL)
LEASE = Resource("coordination.k8s.io/v1", "Lease", "leases")
EVENT = Resource("v1", "Event", "events")
# Read only: a tier's pods are listed when it lacks ready pods, to say why (e.g. unschedulable).
POD = Resource("v1", "Pod", "pods")

# Every kind the renderer may emit. Pruning lists each of them, so a kind missing here would leave
# its objects behind when a feature is switched off; a unit test renders the examples against it.
CHILD_RESOURCES: dict[str, Resource] = {r.kind: r for r in (
    Resource("v1", "ConfigMap", "configmaps"),
    Resource("v1", "Service", "services"),
    Resource("v1", "ServiceAccount", "serviceaccounts"),
    Resource("apps/v1", "Deployment", "deployments"),
    Resource("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
    Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
    Resource("rbac.authorization.k8s.io/v1", "Role", "roles"),
    Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
    Resource("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", optional=True),
)}


def child_resource(obj: dict[str, Any]) -> Resource:
    resource = CHILD_RESOURCES.get(obj.get("kind", ""))
    if resource is None or resource.api_version != obj.get("apiVersion"):
        raise ValueError(f"the operator does not manage {obj.get('apiVersion')}/{obj.get('kind')} objects")
    return resource


class ApiError(Exception):
    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)[:500]
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        super().__init__(f"{what}: HTTP {status}: {message}")


# What a request can fail with: an answer from the server, or none at all.
REQUEST_ERRORS = (ApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def login() -> kopf.ConnectionInfo:
    """Credentials the way kopf finds them: the pod's service account first, then the kubeconfig."""
    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no Kubernetes credentials: not in a pod, and neither $KUBECONFIG nor ~/.kube/config exists")
    return info


class Kube:
    """One aiohttp session to one API server. `on_write(verb, kind)` sees every mutating request."""

    def __init__(self, credentials: Callable[[], kopf.ConnectionInfo] = login, *,
                 on_write: Callable[[str, str], None] | None = None, timeout: float = 30.0):
        self.credentials = credentials
        self._on_write = on_write or (lambda verb, kind: None)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._info: kopf.ConnectionInfo | None = None

    @property
    def connection(self) -> kopf.ConnectionInfo:
        if self._info is None:
            self._info = self.credentials()
        return self._info

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            info = self.connection
            context: ssl.SSLContext | bool = info.as_ssl_context() if info.server.startswith("https") else False
            self._session = aiohttp.ClientSession(
                base_url=info.server.rstrip("/") + "/", timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=context), json_serialize=json.dumps)
        return self._session

    async def _request(self, method: str, path: str, *, kind: str, params: dict[str, str] | None = None,
                       body: Any = None, content_type: str = "application/json") -> Any:
        if method != "GET" and not (params or {}).get("dryRun"):  # a dry run persists nothing
            self._on_write(method, kind)
        data = None if body is None else json.dumps(body)
        for attempt in (1, 2):
            session = self._open()
            # Credentials go per request, so a re-login does not disturb requests in flight.
            headers = {**self.connection.as_http_headers(), "Content-Type": content_type, "Accept": "application/json"}
            async with session.request(method, path.lstrip("/"), params=params, data=data, headers=headers) as resp:
                text = await resp.text()
                if resp.status == 401 and attempt == 1:
                    # Service-account tokens rotate: log in again once, as kopf does for its watches.
                    self._info = None
                    continue
                try:
                    payload = json.loads(text) if text else None
                except ValueError:
                    payload = text
                if resp.status >= 400:
                    raise ApiError(resp.status, payload, f"{method} {path}")
                return payload
        raise AssertionError("unreachable")  # pragma: no cover

    # ---------------------------------------------------------------- reads

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return await self._request("GET", resource.path(namespace, name), kind=resource.kind)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, resource: Resource, namespace: str | None, *,
                   labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
        try:
            result = await self._request("GET", resource.path(namespace), kind=resource.kind, params=params)
        except ApiError as exc:
            if exc.status == 404 and resource.optional:
                return []  # the API is not installed here, so nothing of that kind can exist
            raise
        items = result.get("items") or []
        for item in items:  # list items omit their type; callers compare and apply whole objects
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        return items

    # ---------------------------------------------------------------- writes

    async def apply(self, obj: dict[str, Any], *, field_manager: str = FIELD_MANAGER, force: bool = True,
                    dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply; `force` takes over fields another manager changed (drift repair).
        Strict field validation: a field the server does not know fails the apply instead of being
        dropped silently."""
        resource = child_resource(obj) if obj.get("kind") != KIND else EPD
        meta = obj["metadata"]
        params = {"fieldManager": field_manager, "force": "true" if force else "false", "fieldValidation": "Strict"}
        if dry_run:  # validated and admitted like a real apply, then not persisted
            params["dryRun"] = "All"
        return await self._request("PATCH", resource.path(meta.get("namespace"), meta["name"]), kind=resource.kind,
                                   params=params, body=obj, content_type="application/apply-patch+yaml")

    async def create(self, resource: Resource, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", resource.path(namespace), kind=resource.kind, body=obj)

    async def replace(self, resource: Resource, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT: fails with 409 when `metadata.resourceVersion` is stale (optimistic concurrency)."""
        return await self._request("PUT", resource.path(namespace, obj["metadata"]["name"]), kind=resource.kind, body=obj)

    async def patch_status(self, resource: Resource, namespace: str | None, name: str, status: dict[str, Any]) -> dict[str, Any]:
        # Replace the whole status (JSON patch `add` replaces): a merge patch would keep the keys we
        # dropped, e.g. a removed prefill tier would linger in `.status.tiers`.
        body = [{"op": "add", "path": "/status", "value": status}]
        return await self._request("PATCH", resource.path(namespace, name, "status"), kind=resource.kind,
                                   body=body, content_type="application/json-patch+json")

    async def delete(self, resource: Resource, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        """Delete in the background (dependents are garbage-collected); False when already gone."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}  # never delete a same-named successor
        try:
            await self._request("DELETE", resource.path(namespace, name), kind=resource.kind, body=body)
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True
