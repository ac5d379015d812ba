"""kube.ListWatch against the real API server: a watch refused with 410 Gone (its resourceVersion
fell out of the server's window) lists again, a watch the server ends resumes without a list, and
events keep the picture current.

The real server answers 410 only once etcd has compacted past the version (every 5 minutes by
default), so the 410 comes from the fault proxy in front of it (tests/support/faults.py)."""

from __future__ import annotations

import asyncio
import contextlib

from epd_operator.kube import CHILD_RESOURCES, Kube, ListWatch
from tests.support.cluster import KubeView
from tests.support.faults import FaultProxy
from tests.support.operator_run import wait_until

CONFIGMAP = CHILD_RESOURCES["ConfigMap"]


def configmap(kube: KubeView, name: str, group: str = "watched") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "data": {"k": name},
        "metadata": {"name": name, "namespace": kube.ns, "labels": {"test.epd.dev/group": group}},
    }


async def test_too_old_a_version_lists_again_and_a_server_ended_watch_resumes(kube: KubeView):
    kube.create(configmap(kube, "a"))
    kube.create(configmap(kube, "elsewhere", group="other"))
    seen: dict[str, str] = {}
    syncs: list[list[str]] = []

    def on_sync(items: list[dict]) -> None:
        seen.clear()
        seen.update({o["metadata"]["name"]: o["data"]["k"] for o in items})
        syncs.append(sorted(seen))

    def on_event(kind: str, obj: dict) -> None:
        if kind == "DELETED":
            seen.pop(obj["metadata"]["name"], None)
        else:
            seen[obj["metadata"]["name"]] = obj["data"]["k"]

    with FaultProxy(kube.cluster) as proxy:
        async with Kube(lambda: proxy.credentials(kube.ns)) as client:
            _, version = await client.list_with_version(CONFIGMAP, kube.ns)
            watch = ListWatch(
                client,
                CONFIGMAP,
                kube.ns,
                label_selector="test.epd.dev/group=watched",
                on_sync=on_sync,
                on_event=on_event,
                server_timeout=1,
                retry_delay=0.1,
            )
            watch.resource_version = version  # as if listed: it watches first, and that is refused
            proxy.fail("GET", r"/configmaps$", code=410, times=1)
            await follow(kube, watch, proxy, seen, syncs)


async def follow(
    kube: KubeView, watch: ListWatch, proxy: FaultProxy, seen: dict[str, str], syncs: list[list[str]]
) -> None:
    task = asyncio.create_task(watch.run())
    try:
        await wait_until(lambda: syncs, 10, lambda: f"no list after the 410: {proxy.queries}")
        assert syncs == [["a"]] and watch.lists == 1
        gets = [q for m, q in proxy.queries if m == "GET"]
        assert "watch=true" in gets[1] and "watch=" not in gets[2], gets  # the refused watch, then a list
        kube.create(configmap(kube, "b"))
        await wait_until(lambda: "b" in seen, 10, lambda: seen)
        # The server ends each watch after a second (timeoutSeconds); they resume from the last
        # version seen, without listing again, and miss nothing in between.
        await asyncio.sleep(2.5)
        kube.delete("v1", "ConfigMap", "a")
        kube.create(configmap(kube, "c"))
        await wait_until(lambda: seen == {"b": "b", "c": "c"}, 10, lambda: seen)
        assert watch.lists == 1, syncs
        assert sum("watch=true" in q for m, q in proxy.queries if m == "GET") >= 3, proxy.queries
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
