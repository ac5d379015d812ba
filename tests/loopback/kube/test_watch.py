"""`ListWatch` against a scripted API server on loopback: list, then watch from the list's version; resume after
the server ends a watch; list again after a 410, a bad line or a failed request; log in again after a 401.
Against the real API server: tests/integration/test_kube_watch.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from epd_operator.kube import CHILD_RESOURCES, Credentials, Kube, ListWatch
from tests.support.fake_api_server import FakeApiServer, fake_api_server

CONFIG_MAP = CHILD_RESOURCES["ConfigMap"]


def event(kind: str, name: str, version: str) -> dict:
    return {"type": kind, "object": {"kind": "ConfigMap", "metadata": {"name": name, "resourceVersion": version}}}


def listing(version: str, *names: str) -> dict:
    return {"items": [{"metadata": {"name": n}} for n in names], "metadata": {"resourceVersion": version}}


class Seen:
    def __init__(self) -> None:
        self.syncs: list[list[str]] = []
        self.events: list[tuple[str, str]] = []

    def on_sync(self, items: list[dict]) -> None:
        self.syncs.append([f"{i['kind']}/{i['metadata']['name']}" for i in items])

    def on_event(self, kind: str, obj: dict) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


@asynccontextmanager
async def watching(api: FakeApiServer, seen: Seen, **kwargs) -> AsyncIterator[tuple[ListWatch, Kube]]:
    logins = iter(range(1, 100))

    async def login() -> Credentials:
        return Credentials.from_token(api.url, f"token-{next(logins)}")

    async with Kube(login) as kube:
        watch = ListWatch(
            kube,
            CONFIG_MAP,
            "ns",
            on_sync=seen.on_sync,
            on_event=seen.on_event,
            retry_delay=0.01,
            **kwargs,
        )
        task = asyncio.create_task(watch.run())
        try:
            yield watch, kube
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


@pytest.fixture
async def api():
    async with fake_api_server() as fake:
        yield fake


async def test_list_then_watch_from_the_lists_version(api):
    seen = Seen()
    api.answer(200, listing("10", "a"))
    api.stream(
        [
            event("ADDED", "b", "11"),
            event("MODIFIED", "a", "12"),
            {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": "15"}}},
            event("DELETED", "b", "16"),
        ],
        hold=30,
    )
    async with watching(api, seen, label_selector="app=x", server_timeout=120) as (watch, _):
        await api.wait_for(2)
        async with asyncio.timeout(10):
            while len(seen.events) < 3:
                await asyncio.sleep(0.01)
        assert watch.resource_version == "16" and watch.lists == 1
    assert seen.syncs == [["ConfigMap/a"]]
    assert seen.events == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]
    listed, watched = api.requests
    assert (listed.path, listed.query) == ("/api/v1/namespaces/ns/configmaps", {"labelSelector": "app=x"})
    assert watched.path == "/api/v1/namespaces/ns/configmaps"
    assert watched.query == {
        "watch": "true",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "120",
        "labelSelector": "app=x",
        "resourceVersion": "10",
    }


async def test_a_watch_the_server_ended_resumes_from_the_last_version_without_listing(api):
    seen = Seen()
    api.answer(200, listing("", "a"))  # no version: the first watch starts from now
    api.stream([event("ADDED", "b", "11")])
    api.stream([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}])
    api.stream([], hold=30)
    async with watching(api, seen) as (watch, _):
        await api.wait_for(4)
        assert watch.lists == 1
    first, second, third = api.requests[1:]
    assert "resourceVersion" not in first.query and "labelSelector" not in first.query
    assert first.query["timeoutSeconds"] == "300"
    assert second.query["resourceVersion"] == "11"
    assert third.query["resourceVersion"] == "20"
    assert seen.events == [("ADDED", "b")]


async def test_410_gone_lists_again_at_once(api, caplog):
    seen = Seen()
    api.answer(200, listing("10", "a"))
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    api.stream([{"type": "ERROR", "object": gone}])
    api.answer(200, listing("30", "a", "b"))
    api.stream([], hold=30)
    with caplog.at_level(logging.INFO, logger="epd_operator.kube.watch"):
        async with watching(api, seen) as (watch, _):
            await api.wait_for(4)
            assert watch.lists == 2
    assert seen.syncs == [["ConfigMap/a"], ["ConfigMap/a", "ConfigMap/b"]]
    assert api.requests[3].query["resourceVersion"] == "30"
    assert "ConfigMap watch (all): resourceVersion too old; listing again" in caplog.messages


@pytest.mark.parametrize(
    "answer, logged",
    [
        (b"not json\n", "ConfigMap watch (all) failed: not a watch event: not json"),
        ({"kind": "Status", "code": 500, "reason": "InternalError"}, "ConfigMap watch (all) failed: 500 InternalError"),
        # JSON that is neither an event nor a Status with a code, and an ERROR event whose Status lacks one
        ({"kind": "Status"}, "ConfigMap watch (all) failed: not a watch event: Malformed JSON response"),
        ({"type": "ERROR", "object": {"kind": "Status"}}, "ConfigMap watch (all) failed: not a watch event: 'reason'"),
    ],
)
async def test_a_bad_event_or_a_failed_watch_lists_again_after_a_pause(api, caplog, answer, logged):
    seen = Seen()
    api.answer(200, listing("10", "a"))
    api.stream([event("ADDED", "b", "11"), answer])
    api.answer(200, listing("40", "a", "b"))
    api.stream([], hold=30)
    with caplog.at_level(logging.WARNING, logger="epd_operator.kube.watch"):
        async with watching(api, seen) as (watch, _):
            await api.wait_for(4)
            assert watch.lists == 2
    assert seen.events == [("ADDED", "b")]
    assert api.requests[3].query["resourceVersion"] == "40"
    assert caplog.messages[0].startswith(logged)


async def test_a_failed_list_is_retried(api, caplog):
    seen = Seen()
    api.answer(503, {"kind": "Status", "message": "etcd is down"})
    api.answer(200, listing("10", "a"))
    api.stream([], hold=30)
    with caplog.at_level(logging.WARNING, logger="epd_operator.kube.watch"):
        async with watching(api, seen) as (watch, _):
            await api.wait_for(3)
            assert watch.lists == 1
    assert seen.syncs == [["ConfigMap/a"]]
    assert caplog.messages == [
        "ConfigMap watch (all) failed: GET /api/v1/namespaces/ns/configmaps: HTTP 503: etcd is down"
    ]


async def test_a_401_on_the_watch_logs_in_again_and_lists(api):
    seen = Seen()
    api.answer(200, listing("10", "a"))
    api.stream([{"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "token expired"}])
    api.answer(200, listing("50", "a"))
    api.stream([], hold=30)
    async with watching(api, seen) as (watch, _):
        await api.wait_for(4)
        assert watch.lists == 2
    assert [r.headers["Authorization"] for r in api.requests] == [
        "Bearer token-1",
        "Bearer token-1",
        "Bearer token-2",
        "Bearer token-2",
    ]


async def test_a_failed_login_after_a_401_is_logged_and_retried(api, caplog):
    from epd_operator.kube import CredentialsError

    seen = Seen()
    api.answer(200, listing("10", "a"))
    api.stream([{"kind": "Status", "code": 401, "reason": "Unauthorized", "message": "token expired"}])
    api.answer(200, listing("50", "a"))
    api.stream([], hold=30)
    logins = iter([True, False, True])

    async def login() -> Credentials:
        if not next(logins):
            raise CredentialsError("exec plugin: process returned 1")
        return Credentials.from_token(api.url, "t")

    with caplog.at_level(logging.WARNING, logger="epd_operator.kube.watch"):
        async with Kube(login) as kube:
            watch = ListWatch(kube, CONFIG_MAP, "ns", on_sync=seen.on_sync, on_event=seen.on_event, retry_delay=0.01)
            task = asyncio.create_task(watch.run())
            await api.wait_for(4)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert caplog.messages[:2] == [
        "ConfigMap watch (all): logging in again failed: exec plugin: process returned 1",
        "ConfigMap watch (all) failed: 401 Unauthorized: token expired",
    ]


async def test_a_long_bad_line_is_logged_cut_to_200_characters(api, caplog):
    seen = Seen()
    api.answer(200, listing("10"))
    api.stream([b"y" * 300 + b"\n"])
    api.answer(200, listing("11"))
    api.stream([], hold=30)
    with caplog.at_level(logging.WARNING, logger="epd_operator.kube.watch"):
        async with watching(api, seen):
            await api.wait_for(4)
    assert caplog.messages[0] == "ConfigMap watch (all) failed: not a watch event: " + "y" * 200


async def test_a_long_unreadable_event_is_logged_cut_to_200_characters(api, caplog):
    seen = Seen()
    api.answer(200, listing("10"))
    api.stream([{"kind": "Status", "message": "z" * 300}])  # JSON, but no event and no code
    api.answer(200, listing("11"))
    api.stream([], hold=30)
    with caplog.at_level(logging.WARNING, logger="epd_operator.kube.watch"):
        async with watching(api, seen):
            await api.wait_for(4)
    prefix = "ConfigMap watch (all) failed: not a watch event: "
    assert caplog.messages[0].startswith(prefix + "Malformed JSON response")
    assert len(caplog.messages[0]) == len(prefix) + 200


async def test_a_failure_without_a_message_is_logged_by_its_type(api, caplog):
    seen = Seen()
    api.answer(200, listing("10"), delay=1)  # slower than the client waits
    api.answer(200, listing("11"))
    api.stream([], hold=30)

    async def login() -> Credentials:
        return Credentials.from_token(api.url, "t")

    with caplog.at_level(logging.WARNING, logger="epd_operator.kube.watch"):
        async with Kube(login, timeout=0.2) as kube:
            watch = ListWatch(kube, CONFIG_MAP, "ns", on_sync=seen.on_sync, on_event=seen.on_event, retry_delay=0.01)
            task = asyncio.create_task(watch.run())
            await api.wait_for(3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert caplog.messages[0] == "ConfigMap watch (all) failed: TimeoutError"
