"""The request a ListWatch's watch makes (kube/watch.py), read from a stand-in for the library's client: a
connection that stays silent is given up 30 s after the server should have ended the watch. The watch
against a scripted server: tests/loopback/kube/test_watch.py."""

from __future__ import annotations

from typing import Any, cast

import pytest

from epd_operator.kube import CHILD_RESOURCES, Kube, ListWatch


class Answer:
    """An empty watch stream."""

    class content:  # aiohttp's attribute name
        @staticmethod
        async def readline() -> bytes:
            return b""

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class Client:
    def __init__(self) -> None:
        self.requests: list[tuple[tuple, dict[str, Any]]] = []

    async def request(self, *args: Any, **kwargs: Any) -> Answer:
        self.requests.append((args, kwargs))
        return Answer()


class StandIn:
    def __init__(self) -> None:
        self.client = Client()

    async def _dynamic(self) -> Client:
        return self.client


@pytest.mark.parametrize("server_timeout", [300, 45])
async def test_the_watch_reads_at_most_30_seconds_past_the_servers_own_end(server_timeout):
    kube = StandIn()
    watch = ListWatch(
        cast(Kube, kube),
        CHILD_RESOURCES["ConfigMap"],
        "ns",
        on_sync=lambda items: None,
        on_event=lambda kind, obj: None,
        server_timeout=server_timeout,
    )
    watch.resource_version = "7"
    await watch._watch()
    ((args, kwargs),) = kube.client.requests
    assert args == ("GET", "/api/v1/namespaces/ns/configmaps")
    assert kwargs["_request_timeout"] == (10, server_timeout + 30)  # (connect, read)
    assert ("timeoutSeconds", str(server_timeout)) in kwargs["query_params"]
