"""Blocking Kubernetes requests for code that is not async: the local cluster's bootstrap (fake
nodes, TokenRequests, readiness) and the tests' view of it.

The same library as `Kube` (`kubernetes_asyncio`'s `ApiClient`: its TLS, its auth headers, its
connection pool), run on a private event loop in a daemon thread, so a caller inside someone else's
event loop (an async test) can still block on it. Paths are raw API paths, query string included:
callers here speak the API directly rather than through `Resource`.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient

from epd_operator.kube.client import ApiError
from epd_operator.kube.credentials import Credentials

T = TypeVar("T")


class BlockingKube:
    """One connection pool to one API server, with blocking calls. Close it (or use `with`)."""

    def __init__(self, credentials: Credentials, *, timeout: float = 30.0):
        self.credentials = credentials
        self.timeout = timeout
        self._client: ApiClient | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-blocking", daemon=True)
        self._thread.start()

    def __enter__(self) -> BlockingKube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._client is not None:
            self._run(self._client.close())
            self._client = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop.is_closed():
            coroutine.close()
            raise RuntimeError("this BlockingKube is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """(HTTP status, decoded answer) whatever the status; connection failures raise
        (aiohttp.ClientError, OSError, asyncio.TimeoutError). `token` replaces the credentials'
        own for this one request (acting as a service account)."""
        return self._run(self._call(method, path, body, content_type, token, timeout or self.timeout))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        token: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        """The decoded answer, or ApiError (status, reason, decoded body) for any status >= 400."""
        status, payload = self.call(method, path, body, content_type=content_type, token=token, timeout=timeout)
        if status >= 400:
            raise ApiError(status, payload, f"{method} {path}")
        return payload

    async def _call(
        self, method: str, path: str, body: Any, content_type: str, token: str | None, timeout: float
    ) -> tuple[int, Any]:
        if self._client is None:  # made on the loop that uses it (its aiohttp session binds to it)
            self._client = ApiClient(self.credentials.configuration)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        if token is not None:  # instead of the configuration's own (no auth settings applied below)
            headers["Authorization"] = f"Bearer {token}"
        # _preload_content=False: the raw answer, not raised on an error status, so the caller gets
        # the server's Status body as sent.
        answer = await self._client.call_api(
            path,
            method,
            header_params=headers,
            body=body,
            auth_settings=[] if token is not None else ["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout,
        )
        try:
            status, text = answer.status, await answer.read()
        finally:
            answer.release()
        try:
            payload = json.loads(text) if text else None
        except ValueError:
            payload = text.decode(errors="replace")
        return int(status), payload
