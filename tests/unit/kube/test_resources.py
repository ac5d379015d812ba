"""The kinds epd_operator.kube reads and writes (kube/resources.py): request paths, the API group, which kind
an object is; and when a re-login may keep the connection pool (kube/client.py), from configurations alone."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client import Configuration

from epd_operator.kube import CHILD_RESOURCES, EPD, EVENT, LEASE, ApiError, Resource, child_resource, resource_of
from epd_operator.kube.client import _same_connection

NAMESPACE = Resource("v1", "Namespace", "namespaces", namespaced=False)


def test_paths_of_core_and_grouped_kinds():
    assert EVENT.path("ns") == "/api/v1/namespaces/ns/events"
    assert EVENT.path() == "/api/v1/events"  # every namespace
    assert LEASE.path("ns", "epd-operator") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/epd-operator"
    assert EPD.path("ns", "a", "status") == "/apis/serving.epd.dev/v1alpha1/namespaces/ns/epddeployments/a/status"
    assert NAMESPACE.path(name="team-a") == "/api/v1/namespaces/team-a"


def test_a_namespaced_object_needs_its_namespace():
    with pytest.raises(ValueError, match=r"^Lease is namespaced: a namespace is required$"):
        LEASE.path(None, "epd-operator")
    assert NAMESPACE.path(None, "team-a")  # cluster-scoped: none needed


def test_group_and_library_resource():
    assert (EPD.group, EVENT.group) == ("serving.epd.dev", "")
    core, grouped = EVENT.for_library(), LEASE.for_library()
    assert (core.prefix, core.group, core.api_version, core.kind, core.name) == ("api", None, "v1", "Event", "events")
    assert (grouped.prefix, grouped.group, grouped.api_version) == ("apis", "coordination.k8s.io", "v1")
    assert (core.namespaced, NAMESPACE.for_library().namespaced) == (True, False)
    client = object()
    assert EVENT.for_library(client).client is client  # type: ignore[arg-type]


def test_only_the_gateway_lws_and_keda_kinds_are_optional_and_keda_says_how_to_do_without():
    assert {k for k, r in CHILD_RESOURCES.items() if r.optional} == {"HTTPRoute", "LeaderWorkerSet", "ScaledObject"}
    assert CHILD_RESOURCES["HTTPRoute"].when_missing == "install its CRDs, or remove the field that asks for it"
    assert CHILD_RESOURCES["ScaledObject"].when_missing.startswith("KEDA is not installed; install it")
    assert all(r.namespaced for r in CHILD_RESOURCES.values())


def test_which_kind_an_object_is():
    epd = {"apiVersion": "serving.epd.dev/v1alpha1", "kind": "EPDDeployment"}
    assert resource_of(epd) is EPD
    assert resource_of({"apiVersion": "v1", "kind": "ConfigMap"}) is CHILD_RESOURCES["ConfigMap"]
    with pytest.raises(
        ValueError, match=r"^the operator does not manage serving.epd.dev/v1beta9/EPDDeployment objects$"
    ):
        resource_of({**epd, "apiVersion": "serving.epd.dev/v1beta9"})
    with pytest.raises(ValueError, match="does not manage apps/v2/Deployment"):
        child_resource({"apiVersion": "apps/v2", "kind": "Deployment"})
    with pytest.raises(ValueError, match="does not manage None/None"):
        child_resource({})


def configuration(**changes) -> Configuration:
    config = Configuration(host="https://10.0.0.1:6443")
    config.ssl_ca_cert, config.cert_file, config.key_file = "/ca.crt", "/tls.crt", "/tls.key"
    config.tls_server_name, config.proxy = "kubernetes", None
    for key, value in changes.items():
        setattr(config, key, value)
    return config


@pytest.mark.parametrize(
    "key, value",
    [
        ("host", "https://10.0.0.2:6443"),
        ("ssl_ca_cert", "/other-ca.crt"),
        ("cert_file", "/other.crt"),
        ("key_file", "/other.key"),
        ("verify_ssl", False),
        ("tls_server_name", "other"),
        ("proxy", "http://proxy:3128"),
    ],
)
def test_a_connection_pool_serves_only_the_same_server_tls_and_client_certificate(key, value):
    assert _same_connection(configuration(), configuration())
    assert _same_connection(configuration(), configuration(api_key={"BearerToken": "Bearer new"}))
    assert not _same_connection(configuration(), configuration(**{key: value}))


def test_fixed_credentials_keep_the_servers_name_whole():
    from epd_operator.kube import Credentials

    assert Credentials.from_token("https://gateway-X/", "t").server == "https://gateway-X"


def test_an_api_error_without_a_status_body_keeps_a_short_message():
    error = ApiError(502, "x" * 600, "GET /api/v1/pods")
    assert str(error) == f"GET /api/v1/pods: HTTP 502: {'x' * 500}"
    assert (error.reason, error.causes) == ("", [])
    assert ApiError(422, {"details": {"causes": None}}, "w").causes == []
    assert ApiError(422, {"details": None}, "w").causes == []
    assert str(ApiError(409, {"reason": "Conflict"}, "PUT /x")) == "PUT /x: HTTP 409: None"
    assert ApiError(500, {"message": "no reason given"}, "w").reason == ""
