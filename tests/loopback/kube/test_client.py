"""`Kube`, epd_operator.kube's client, against a scripted API server on loopback: the requests it sends for
each verb (path, query, content type, body, token), what it makes of the answers, and logging in again
after a 401. What the real API server does with the requests: tests/integration."""

from __future__ import annotations

import asyncio

import pytest

from epd_operator.kube import CHILD_RESOURCES, EPD, POD, ApiError, Credentials, Kube
from tests.support.fake_api_server import fake_api_server

CONFIG_MAP = CHILD_RESOURCES["ConfigMap"]
ROUTE = CHILD_RESOURCES["HTTPRoute"]


class Logins:
    """A credential source that hands out token-1, token-2, ... for one server (or the next of `servers`)."""

    def __init__(self, *servers: str):
        self.servers = list(servers)
        self.count = 0

    async def __call__(self) -> Credentials:
        self.count += 1
        server = self.servers[min(self.count, len(self.servers)) - 1]
        return Credentials.from_token(server, f"token-{self.count}", namespace="ns")


@pytest.fixture
async def api():
    async with fake_api_server() as fake:
        yield fake


async def test_get_sends_the_token_to_the_objects_path_and_none_for_404(api):
    api.answer(200, {"kind": "EPDDeployment", "metadata": {"name": "a"}})
    api.answer(404, {"kind": "Status", "reason": "NotFound", "message": "not found"})
    writes: list[tuple[str, str]] = []
    async with Kube(Logins(api.url), on_write=lambda verb, kind: writes.append((verb, kind))) as kube:
        assert await kube.get(EPD, "ns", "a") == {"kind": "EPDDeployment", "metadata": {"name": "a"}}
        assert await kube.get(POD, "ns", "gone") is None
    assert writes == []  # reads are no writes
    first, second = api.requests
    assert (first.method, first.path) == ("GET", "/apis/serving.epd.dev/v1alpha1/namespaces/ns/epddeployments/a")
    assert first.headers["Authorization"] == "Bearer token-1"
    assert second.path == "/api/v1/namespaces/ns/pods/gone"


async def test_an_error_answer_is_one_api_error_with_the_servers_status(api):
    status = {
        "kind": "Status",
        "reason": "Invalid",
        "message": "spec.x: bad",
        "details": {"causes": [{"field": "spec.x", "message": "bad"}]},
    }
    api.answer(422, status)
    api.answer(500, raw=b"<html>proxy error</html>")
    api.answer(400, raw=b"\xff\xfe not utf-8")
    async with Kube(Logins(api.url)) as kube:
        with pytest.raises(ApiError) as refused:
            await kube.get(EPD, "ns", "a")
        with pytest.raises(ApiError) as broken:
            await kube.get(EPD, "ns", "b")
        with pytest.raises(ApiError) as bad_request:
            await kube.get(EPD, "ns", "c")
    assert (bad_request.value.status, bad_request.value.body) == (400, "\ufffd\ufffd not utf-8")
    assert (refused.value.status, refused.value.reason, refused.value.body) == (422, "Invalid", status)
    assert refused.value.causes == [{"field": "spec.x", "message": "bad"}]
    assert str(refused.value) == (
        "GET /apis/serving.epd.dev/v1alpha1/namespaces/ns/epddeployments/a: HTTP 422: spec.x: bad"
    )
    assert (broken.value.status, broken.value.reason, broken.value.causes) == (500, "", [])
    assert broken.value.body == "<html>proxy error</html>"
    assert str(broken.value).endswith("HTTP 500: <html>proxy error</html>")


async def test_list_completes_each_item_and_returns_the_lists_version(api):
    items = [{"metadata": {"name": "a"}}, {"apiVersion": "v9", "kind": "Other", "metadata": {"name": "b"}}]
    api.answer(200, {"items": items, "metadata": {"resourceVersion": "42"}})
    api.answer(200, {"items": None, "metadata": {}})
    api.answer(200, {"items": [{"metadata": {"name": "c"}}]})
    async with Kube(Logins(api.url)) as kube:
        listed, version = await kube.list_with_version(CONFIG_MAP, "ns", label_selector="app=x")
        assert await kube.list_with_version(CONFIG_MAP, None) == ([], "")
        assert await kube.list(CONFIG_MAP, "ns", labels={"a": "1", "b": "2"}) == [
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
        ]
    assert version == "42"
    assert listed == [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}},
        {"apiVersion": "v9", "kind": "Other", "metadata": {"name": "b"}},
    ]
    assert [(r.path, r.query) for r in api.requests] == [
        ("/api/v1/namespaces/ns/configmaps", {"labelSelector": "app=x"}),
        ("/api/v1/configmaps", {}),
        ("/api/v1/namespaces/ns/configmaps", {"labelSelector": "a=1,b=2"}),
    ]


async def test_listing_an_optional_kind_the_server_does_not_serve_finds_nothing(api):
    api.answer(404, {"kind": "Status", "reason": "NotFound"})
    api.answer(404, {"kind": "Status", "reason": "NotFound"})
    async with Kube(Logins(api.url)) as kube:
        assert await kube.list_with_version(ROUTE, "ns") == ([], "")
        with pytest.raises(ApiError) as exc:
            await kube.list(CONFIG_MAP, "ns")
    assert exc.value.status == 404


async def test_discovery_reads_the_group_versions_resource_names(api):
    api.answer(200, {"kind": "APIResourceList", "resources": [{"name": "httproutes"}, {"name": "httproutes/status"}]})
    api.answer(200, {"kind": "APIResourceList", "resources": [{"name": "pods"}]})
    api.answer(200, {"kind": "APIResourceList", "groupVersion": "x/v1"})  # a group version serving nothing
    api.answer(404, {"kind": "Status", "reason": "NotFound", "message": "the server could not find it"})
    writes: list[tuple[str, str]] = []
    async with Kube(Logins(api.url), on_write=lambda verb, kind: writes.append((verb, kind))) as kube:
        assert await kube.served_resources(ROUTE.api_version) == {"httproutes", "httproutes/status"}
        assert await kube.served_resources("v1") == {"pods"}
        assert await kube.served_resources("x/v1") == set()
        with pytest.raises(ApiError) as missing:
            await kube.served_resources("leaderworkerset.x-k8s.io/v1")
    assert missing.value.status == 404
    assert str(missing.value).startswith("GET /apis/leaderworkerset.x-k8s.io/v1: HTTP 404")
    assert [(r.method, r.path, r.query) for r in api.requests] == [
        ("GET", "/apis/gateway.networking.k8s.io/v1", {}),
        ("GET", "/api/v1", {}),
        ("GET", "/apis/x/v1", {}),
        ("GET", "/apis/leaderworkerset.x-k8s.io/v1", {}),
    ]
    assert api.requests[0].headers["Authorization"] == "Bearer token-1"
    assert writes == []


async def test_apply_is_a_strict_server_side_apply_and_a_dry_run_is_no_write(api):
    writes: list[tuple[str, str]] = []
    meta = {"name": "c", "namespace": "ns"}
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}
    api.answer(200, {**obj, "metadata": {**meta, "resourceVersion": "7"}})
    async with Kube(Logins(api.url), on_write=lambda verb, kind: writes.append((verb, kind))) as kube:
        applied = await kube.apply(obj)
        await kube.apply(obj, field_manager="epdctl", force=False, dry_run=True)
    assert applied["metadata"]["resourceVersion"] == "7"
    assert writes == [("PATCH", "ConfigMap")]
    real, dry = api.requests
    assert (real.method, real.path, real.body) == ("PATCH", "/api/v1/namespaces/ns/configmaps/c", obj)
    assert real.headers["Content-Type"] == "application/apply-patch+yaml"
    assert real.query == {"fieldManager": "epd-operator", "force": "true", "fieldValidation": "Strict"}
    assert dry.query == {"fieldManager": "epdctl", "force": "false", "fieldValidation": "Strict", "dryRun": "All"}


async def test_create_replace_and_status_writes(api):
    writes: list[tuple[str, str]] = []
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": "3"}}
    async with Kube(Logins(api.url), on_write=lambda verb, kind: writes.append((verb, kind))) as kube:
        await kube.create(CONFIG_MAP, "ns", obj)
        await kube.create(CONFIG_MAP, "ns", obj, dry_run=True)
        await kube.replace(CONFIG_MAP, "ns", obj)
        await kube.patch_status(EPD, "ns", "a", {"phase": "Ready"})
    assert writes == [("POST", "ConfigMap"), ("PUT", "ConfigMap"), ("PATCH", "EPDDeployment")]
    create, dry, replace, status = api.requests
    assert (create.method, create.path, create.query, create.body) == (
        "POST",
        "/api/v1/namespaces/ns/configmaps",
        {"fieldValidation": "Strict"},
        obj,
    )
    assert create.headers["Content-Type"] == "application/json"
    assert dry.query == {"fieldValidation": "Strict", "dryRun": "All"}
    assert (replace.method, replace.path, replace.body) == ("PUT", "/api/v1/namespaces/ns/configmaps/c", obj)
    assert (status.method, status.path) == (
        "PATCH",
        "/apis/serving.epd.dev/v1alpha1/namespaces/ns/epddeployments/a/status",
    )
    assert status.headers["Content-Type"] == "application/json-patch+json"
    assert status.body == [{"op": "add", "path": "/status", "value": {"phase": "Ready"}}]


async def test_delete_is_in_the_background_guarded_by_the_uid_and_false_when_gone(api):
    api.answer(200, {"kind": "Status"})
    api.answer(404, {"kind": "Status", "reason": "NotFound"})
    api.answer(409, {"kind": "Status", "reason": "Conflict"})
    api.answer(403, {"kind": "Status", "reason": "Forbidden"})
    writes: list[tuple[str, str]] = []
    async with Kube(Logins(api.url), on_write=lambda verb, kind: writes.append((verb, kind))) as kube:
        assert await kube.delete(CONFIG_MAP, "ns", "c", uid="u-1") is True
        assert await kube.delete(CONFIG_MAP, "ns", "c") is False
        assert await kube.delete(CONFIG_MAP, "ns", "c", uid="u-2") is False  # a successor holds the name
        with pytest.raises(ApiError) as exc:
            await kube.delete(CONFIG_MAP, "ns", "c")
    assert exc.value.status == 403
    assert writes == [("DELETE", "ConfigMap")] * 4
    guarded, plain = api.requests[0], api.requests[1]
    assert (guarded.method, guarded.path) == ("DELETE", "/api/v1/namespaces/ns/configmaps/c")
    assert guarded.body == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Background",
        "preconditions": {"uid": "u-1"},
    }
    assert plain.body == {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}


async def test_an_empty_answer_is_none(api):
    api.answer(200, raw=b"")
    async with Kube(Logins(api.url)) as kube:
        assert await kube.request("GET", CONFIG_MAP, namespace="ns", name="c") is None


async def test_a_401_logs_in_again_once_and_retries_with_the_new_token(api):
    logins = Logins(api.url)
    api.answer(401, {"kind": "Status", "reason": "Unauthorized"})
    api.answer(200, {"metadata": {"name": "a"}})
    api.answer(401, {"kind": "Status", "reason": "Unauthorized"})
    api.answer(401, {"kind": "Status", "reason": "Unauthorized", "message": "token expired"})
    async with Kube(logins) as kube:
        assert await kube.get(EPD, "ns", "a") == {"metadata": {"name": "a"}}
        with pytest.raises(ApiError) as exc:
            await kube.get(EPD, "ns", "a")
    assert (exc.value.status, exc.value.reason) == (401, "Unauthorized")
    assert [r.headers["Authorization"] for r in api.requests] == [
        "Bearer token-1",
        "Bearer token-2",
        "Bearer token-2",
        "Bearer token-3",
    ]
    assert logins.count == 3


async def test_a_new_token_for_the_same_server_keeps_the_connection_pool(api):
    logins = Logins(api.url)

    async def refresh(configuration) -> None:
        pass

    async def login_with_a_refresh_hook() -> Credentials:
        login = await logins()
        if logins.count == 2:
            login.configuration.refresh_api_key_hook = refresh
        return login

    async with Kube(login_with_a_refresh_hook) as kube:
        first = await kube.login()
        client = kube._client
        second = await kube.relogin()
        assert kube._client is client and kube._retired == []
        assert second.configuration.refresh_api_key_hook is refresh  # the new login's refresh, on the kept pool
        assert second.configuration is first.configuration  # the pool's configuration, with the new token
        assert second.authorization() == ("Bearer", "token-2")
        assert await kube.login() is second
        await kube.get(EPD, "ns", "a")
    assert api.requests[0].headers["Authorization"] == "Bearer token-2"


async def test_another_server_gets_a_new_pool_and_the_old_ones_are_closed(api):
    async with fake_api_server() as other:
        kube = Kube(Logins(api.url, other.url, api.url))
        await kube.login()
        first = kube._client
        assert first is not None
        await kube.relogin()  # the other server
        second = kube._client
        assert second is not None and second is not first and kube._retired == [first.client]
        await kube.get(EPD, "ns", "a")
        await kube.relogin()  # back: the one before last has had a login's time, and is closed
        assert kube._retired == [second.client]
        assert first.client.rest_client.pool_manager.closed
        await kube.close()
        assert kube._client is None and kube._retired == []
        assert second.client.rest_client.pool_manager.closed
        await kube.close()  # twice is fine
    assert len(other.requests) == 1 and api.requests == []


async def test_a_slow_server_times_out(api):
    api.answer(200, {}, delay=5)
    async with Kube(Logins(api.url), timeout=0.2) as kube:
        with pytest.raises(asyncio.TimeoutError):
            await kube.get(EPD, "ns", "a")


async def test_the_retry_after_a_401_sends_the_same_body_and_content_type(api):
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {"k": "v"}}
    api.answer(401, {"kind": "Status", "reason": "Unauthorized"})
    api.answer(200, obj)
    async with Kube(Logins(api.url)) as kube:
        await kube.apply(obj)
    first, retry = api.requests
    assert (retry.method, retry.path, retry.query, retry.body) == (first.method, first.path, first.query, obj)
    assert retry.headers["Content-Type"] == first.headers["Content-Type"] == "application/apply-patch+yaml"
