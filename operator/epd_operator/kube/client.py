"""The operator's, the router's and epdctl's one Kubernetes client, on `kubernetes_asyncio`.

Requests go through the library's `DynamicClient` (paths from its `Resource`, authentication and TLS
from its `Configuration`, including token refresh hooks); answers stay plain dicts, since callers
compare and apply whole objects and the generated model classes would drop fields they do not know.
Every failure is one `ApiError` with the server's status, reason and message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.dynamic import DynamicClient

from .credentials import Credentials, CredentialsError, CredentialSource, load_credentials
from .resources import Resource, resource_of

log = logging.getLogger(__name__)

FIELD_MANAGER = "epd-operator"
JSON = "application/json"  # the content type of every request but apply and patch
REQUEST_TIMEOUT = 30.0  # seconds for one request, unless the caller names its own


def _same_connection(a: Configuration, b: Configuration) -> bool:
    """Same server, TLS and client certificate: a connection pool made for one serves the other."""
    keys = ("host", "ssl_ca_cert", "cert_file", "key_file", "verify_ssl", "tls_server_name", "proxy")
    return all(getattr(a, key) == getattr(b, key) for key in keys)


class ApiError(Exception):
    """The API server said no: `status` (HTTP), `reason` (e.g. "Invalid", "Conflict"), `body`
    (the decoded Status, whose `details.causes` name the refused fields)."""

    def __init__(self, status: int, body: Any, what: str):
        self.status = status
        self.body = body
        message = body.get("message") if isinstance(body, dict) else str(body)[:500]
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        super().__init__(f"{what}: HTTP {status}: {message}")

    @property
    def causes(self) -> list[dict[str, Any]]:
        details = self.body.get("details") if isinstance(self.body, dict) else None
        return list((details or {}).get("causes") or [])


# What a request can fail with: an answer from the server, none at all, or no credentials (an exec
# plugin that fails when its token is renewed).
REQUEST_ERRORS = (ApiError, aiohttp.ClientError, OSError, asyncio.TimeoutError, CredentialsError)


class Kube:
    """One connection pool to one API server. `on_write(verb, kind)` sees every mutating request.

    `credentials` logs in; it is called again when the server answers 401 (a rotated or expired
    token), once per request."""

    def __init__(
        self,
        credentials: CredentialSource = load_credentials,
        *,
        on_write: Callable[[str, str], None] | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ):
        self.credentials = credentials
        self._on_write = on_write or (lambda verb, kind: None)
        self.timeout = timeout
        self._login: Credentials | None = None
        self._client: DynamicClient | None = None
        self._retired: list[ApiClient] = []  # replaced by a re-login; closed with us (requests may be in flight)
        self._logging_in: asyncio.Lock | None = None

    async def __aenter__(self) -> Kube:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        clients = self._retired + ([self._client.client] if self._client is not None else [])
        self._client, self._retired = None, []
        for client in clients:
            await client.close()

    async def login(self) -> Credentials:
        """The current credentials, logging in first if needed."""
        if self._login is None:
            await self.relogin()
        assert self._login is not None
        return self._login

    async def relogin(self) -> Credentials:
        """Log in again (a 401; kopf asks too): exec plugins run again, token files are re-read."""
        self._logging_in = self._logging_in or asyncio.Lock()
        async with self._logging_in:
            login = await self.credentials()
            if self._client is not None and _same_connection(self._client.configuration, login.configuration):
                # Only the token changed (the usual re-login): keep the connection pool.
                current = self._client.configuration
                current.api_key = dict(login.configuration.api_key)
                current.refresh_api_key_hook = login.configuration.refresh_api_key_hook
                login = dataclasses.replace(login, configuration=current)
            else:
                if self._client is not None:
                    self._retired.append(self._client.client)
                self._client = DynamicClient(ApiClient(login.configuration))
                while len(self._retired) > 1:  # the one before last has had a whole login's time to finish
                    await self._retired.pop(0).close()
            self._login = login
        return login

    async def _dynamic(self) -> DynamicClient:
        if self._client is None:
            await self.relogin()
        assert self._client is not None
        return self._client

    async def request(
        self,
        method: str,
        resource: Resource,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Any:
        """One request; the decoded answer, or ApiError."""
        query = query or {}
        if method != "GET" and not query.get("dryRun"):  # a dry run persists nothing
            self._on_write(method, resource.kind)
        return await self._send(
            method, resource.path(namespace, name, subresource), query, body=body, content_type=content_type
        )

    async def _send(self, method: str, path: str, query: dict[str, str], *, body: Any = None, content_type: str) -> Any:
        status, text = await self._exchange(method, path, query, body, content_type)
        if status == 401:  # the credentials expired or were rotated: log in again, once
            await self.relogin()
            status, text = await self._exchange(method, path, query, body, content_type)
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = text.decode(errors="replace")
        if status >= 400:
            raise ApiError(status, payload, f"{method} {path}")
        return payload

    async def _exchange(
        self, method: str, path: str, query: dict[str, str], body: Any, content_type: str
    ) -> tuple[int, bytes]:
        client = await self._dynamic()
        answer = await client.request(
            method,
            path,
            body=body,
            serialize=False,
            content_type=content_type,
            query_params=list(query.items()),
            _request_timeout=self.timeout,
        )
        try:
            return answer.status, await answer.read()
        finally:
            answer.release()

    # ---------------------------------------------------------------- reads

    async def served_resources(self, api_version: str) -> set[str]:
        """The resource names (plurals, with subresources as `plural/sub`) the API server serves in
        `api_version`, from discovery, which every authenticated client may read; ApiError 404 where
        the group version is not served at all."""
        group, _, version = api_version.rpartition("/")
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        found = await self._send("GET", path, {}, content_type=JSON)
        return {str(r.get("name")) for r in (found or {}).get("resources") or []}

    async def get(self, resource: Resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.request("GET", resource, namespace=namespace, name=name)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def list_with_version(
        self, resource: Resource, namespace: str | None, *, label_selector: str | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object (complete: list items omit their type) and the list's resourceVersion, from
        which a watch continues."""
        query = {"labelSelector": label_selector} if label_selector else None
        try:
            result = await self.request("GET", resource, namespace=namespace, query=query)
        except ApiError as exc:
            if exc.status == 404 and resource.optional:
                return [], ""  # the API is not installed here, so nothing of that kind can exist
            raise
        items: list[dict[str, Any]] = result.get("items") or []
        for item in items:
            item.setdefault("apiVersion", resource.api_version)
            item.setdefault("kind", resource.kind)
        return items, str((result.get("metadata") or {}).get("resourceVersion") or "")

    async def list(
        self, resource: Resource, namespace: str | None, *, labels: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items()) if labels else None
        items, _ = await self.list_with_version(resource, namespace, label_selector=selector)
        return items

    # ---------------------------------------------------------------- writes

    async def apply(
        self, obj: dict[str, Any], *, field_manager: str = FIELD_MANAGER, force: bool = True, dry_run: bool = False
    ) -> dict[str, Any]:
        """Server-side apply; `force` takes over fields another manager changed (drift repair).
        Strict field validation: a field the server does not know fails the apply instead of being
        dropped silently."""
        meta = obj["metadata"]
        query = {"fieldManager": field_manager, "force": "true" if force else "false", "fieldValidation": "Strict"}
        if dry_run:  # validated and admitted like a real apply, then not persisted
            query["dryRun"] = "All"
        applied: dict[str, Any] = await self.request(
            "PATCH",
            resource_of(obj),
            namespace=meta.get("namespace"),
            name=meta["name"],
            query=query,
            body=obj,
            content_type="application/apply-patch+yaml",
        )
        return applied

    async def create(
        self, resource: Resource, namespace: str | None, obj: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        query = {"fieldValidation": "Strict", **({"dryRun": "All"} if dry_run else {})}
        created: dict[str, Any] = await self.request("POST", resource, namespace=namespace, body=obj, query=query)
        return created

    async def replace(self, resource: Resource, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT: fails with 409 when `metadata.resourceVersion` is stale (optimistic concurrency)."""
        replaced: dict[str, Any] = await self.request(
            "PUT", resource, namespace=namespace, name=obj["metadata"]["name"], body=obj
        )
        return replaced

    async def patch_status(
        self, resource: Resource, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        # Replace the whole status (JSON patch `add` replaces): a merge patch would keep the keys we
        # dropped, e.g. a removed prefill tier would linger in `.status.tiers`.
        body = [{"op": "add", "path": "/status", "value": status}]
        patched: dict[str, Any] = await self.request(
            "PATCH",
            resource,
            namespace=namespace,
            name=name,
            subresource="status",
            body=body,
            content_type="application/json-patch+json",
        )
        return patched

    async def delete(self, resource: Resource, namespace: str | None, name: str, *, uid: str | None = None) -> bool:
        """Delete in the background (dependents are garbage-collected); False when already gone."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}  # never delete a same-named successor
        try:
            await self.request("DELETE", resource, namespace=namespace, name=name, body=body)
        except ApiError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True
