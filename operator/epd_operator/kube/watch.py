"""List, then watch: the informer pattern on the client library's `Watch`.

The library's `Watch` reads the event stream, follows the resourceVersion (bookmarks included) and
turns an ERROR event into an `ApiException` carrying its code. What is left here is the policy around
it: a 410 Gone (the version fell out of the server's window) or any other failure lists again, a
watch the server ended (`timeoutSeconds`) resumes from the last version seen.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from .client import REQUEST_ERRORS, Kube
from .resources import Resource

RETRY_DELAY = 1.0  # seconds before a failed list or watch is tried again

log = logging.getLogger(__name__)


class ListWatch:
    """Keep `on_sync(objects)` (after each list: the whole state) and `on_event(type, object)`
    (ADDED, MODIFIED, DELETED) informed about the objects `label_selector` picks."""

    def __init__(
        self,
        kube: Kube,
        resource: Resource,
        namespace: str | None,
        *,
        label_selector: str | None = None,
        on_sync: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        server_timeout: int = 300,
        retry_delay: float = RETRY_DELAY,
    ):
        self.kube = kube
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_sync = on_sync
        self.on_event = on_event
        self.server_timeout = server_timeout
        self.retry_delay = retry_delay
        self.resource_version: str | None = None  # None: list (again) before watching
        self.lists = 0  # how often it listed (a re-list after a 410 shows here)

    async def list(self) -> None:
        items, self.resource_version = await self.kube.list_with_version(
            self.resource, self.namespace, label_selector=self.label_selector
        )
        self.lists += 1
        self.on_sync(items)

    async def run(self) -> None:
        """Until cancelled."""
        what = f"{self.resource.kind} watch ({self.label_selector or 'all'})"
        while True:
            try:
                if self.resource_version is None:
                    await self.list()
                await self._watch()  # returns when the server ends the watch: resume from where it was
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                self.resource_version = None
                if exc.status == 410:
                    log.info("%s: resourceVersion too old; listing again", what)
                    continue
                if exc.status == 401:
                    await self._relogin(what)
                log.warning("%s failed: %s %s", what, exc.status, exc.reason)
                await asyncio.sleep(self.retry_delay)
            except (*REQUEST_ERRORS, ValueError) as exc:  # network trouble or a bad event: list again after a pause
                self.resource_version = None
                log.warning("%s failed: %s", what, str(exc) or type(exc).__name__)
                await asyncio.sleep(self.retry_delay)

    async def _relogin(self, what: str) -> None:
        try:
            await self.kube.relogin()
        except REQUEST_ERRORS as exc:
            log.warning("%s: logging in again failed: %s", what, exc)

    async def _watch(self) -> None:
        client = await self.kube._dynamic()
        path = self.resource.path(self.namespace)
        timeout = (10, self.server_timeout + 30)  # (connect, read): a silent connection is given up

        async def open_stream(*, resource_version: str | None = None, timeout_seconds: int, **_: Any) -> Any:
            # `Watch` calls this with `watch=True`; the library's DynamicClient sends the request.
            query = [("watch", "true"), ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_seconds))]
            if self.label_selector:
                query.append(("labelSelector", self.label_selector))
            if resource_version:
                query.append(("resourceVersion", resource_version))
            return await client.request("GET", path, serialize=False, query_params=query, _request_timeout=timeout)

        # timeout_seconds given: the library's Watch ends with the server's stream instead of
        # reconnecting by itself, so a 410 comes here (and is answered with a list).
        async with Watch() as watch:
            events = aiter(
                watch.stream(open_stream, resource_version=self.resource_version, timeout_seconds=self.server_timeout)
            )
            while True:
                try:
                    event = await anext(events)
                except StopAsyncIteration:
                    return
                except (ApiException, *REQUEST_ERRORS):
                    raise
                except Exception as exc:  # the library's bare Exception (or KeyError) for JSON that is no event
                    raise ValueError(f"not a watch event: {str(exc)[:200]}") from exc
                if not isinstance(event, dict):  # the library hands on a line that is not JSON as it is
                    raise ValueError(f"not a watch event: {str(event)[:200]}")
                self.resource_version = watch.resource_version or self.resource_version
                kind = event["type"]  # the library refuses an event without one (above)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.on_event(kind, event["raw_object"])
