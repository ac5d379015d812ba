"""dev/gateway.py: Traefik's command line and the Gateway it serves agree on where the listener is, and
an EPDDeployment's route names that Gateway's listener."""

from __future__ import annotations

from pathlib import Path

from dev import gateway
from epd_operator.api import parse_epd
from epd_operator.render import render
from tests.support.render_examples import LOCAL_CPU_NIXL, example_document


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in argv[1:])


def test_the_gateways_listener_is_traefiks_entry_point_and_its_class_names_traefik():
    flags = _flags(gateway.argv(Path("/traefik"), "https://127.0.0.1:6443", "t", Path("/ca.crt"), "10.244.0.1"))
    _, gateway_class, gw = gateway.objects()
    [listener] = gw["spec"]["listeners"]
    # Traefik attaches a listener to the entry point with the listener's port.
    assert flags[f"entryPoints.{gateway.ENTRY_POINT}.address"] == f":{listener['port']}"
    assert flags["providers.kubernetesgateway"] == "true"
    assert flags["providers.kubernetesgateway.statusaddress.ip"] == "10.244.0.1"
    assert gateway_class["spec"]["controllerName"] == gateway.CONTROLLER
    assert gw["spec"]["gatewayClassName"] == gateway_class["metadata"]["name"]
    assert flags["ping.entryPoint"] == "ping" and flags["entryPoints.ping.address"] != f":{listener['port']}"


def test_a_route_rendered_for_the_parent_ref_attaches_to_the_gateways_listener():
    doc = example_document(LOCAL_CPU_NIXL)
    doc["spec"].setdefault("router", {})["gateway"] = {"parentRefs": [gateway.parent_ref()]}
    [route] = [o for o in render(parse_epd(doc)) if o["kind"] == "HTTPRoute"]
    [parent] = route["spec"]["parentRefs"]
    _, _, gw = gateway.objects()
    assert (parent["name"], parent["namespace"]) == (gw["metadata"]["name"], gw["metadata"]["namespace"])
    assert parent["sectionName"] == gw["spec"]["listeners"][0]["name"]
