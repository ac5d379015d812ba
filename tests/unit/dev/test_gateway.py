"""dev/parts/gateway.py: Traefik's command line and the Gateway it serves agree on where the listener is, its pods
carry the labels its Service and `routerFrom` select, and an EPDDeployment's route names the Gateway's
listener."""

from __future__ import annotations

from typing import Any

from dev.parts import gateway
from epd_operator.api import parse_epd
from epd_operator.render import render
from tests.support.render_examples import LOCAL_CPU_NIXL, example_document


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args)


def _kinds() -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in gateway.objects()}


def test_the_gateways_listener_is_traefiks_entry_point_and_its_class_names_traefik():
    deployment = gateway.deployment("10.96.0.20", {"node": "real"})
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    flags = _flags(container["args"])
    objects = _kinds()
    gateway_class, gw = objects["GatewayClass"], objects["Gateway"]
    [listener] = gw["spec"]["listeners"]
    # Traefik attaches a listener to the entry point with the listener's port.
    assert flags[f"entryPoints.{gateway.ENTRY_POINT}.address"] == f":{listener['port']}"
    assert flags["providers.kubernetesgateway"] == "true"
    assert flags["providers.kubernetesgateway.statusaddress.ip"] == "10.96.0.20"
    assert gateway_class["spec"]["controllerName"] == gateway.CONTROLLER
    assert gw["spec"]["gatewayClassName"] == gateway_class["metadata"]["name"]
    assert flags["ping.entryPoint"] == "ping" and flags["entryPoints.ping.address"] != f":{listener['port']}"
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], f":{probe['port']}") == ("/ping", flags["entryPoints.ping.address"])


def test_traefiks_pods_carry_the_labels_its_service_and_router_from_select_and_run_under_its_account():
    deployment = gateway.deployment("10.96.0.20", {"node": "real"})
    pod = deployment["spec"]["template"]
    objects = _kinds()
    assert pod["metadata"]["labels"] == gateway.LABELS == objects["Service"]["spec"]["selector"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert gateway.LABELS["app.kubernetes.io/name"] == "traefik"  # what docs/gateway.md tells routerFrom
    assert pod["spec"]["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": gateway.NAME, "namespace": gateway.NAMESPACE}]
    [port] = objects["Service"]["spec"]["ports"]
    assert port["port"] == port["targetPort"] == gateway.PORT
    # Traefik's provider writes the status of every route kind it serves.
    rules = objects["ClusterRole"]["rules"]
    assert {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["*/status"], "verbs": ["update"]} in rules


def test_a_route_rendered_for_the_parent_ref_attaches_to_the_gateways_listener():
    doc = example_document(LOCAL_CPU_NIXL)
    doc["spec"].setdefault("router", {})["gateway"] = {"parentRefs": [gateway.parent_ref()]}
    [route] = [o for o in render(parse_epd(doc)) if o["kind"] == "HTTPRoute"]
    [parent] = route["spec"]["parentRefs"]
    gw = _kinds()["Gateway"]
    assert (parent["name"], parent["namespace"]) == (gw["metadata"]["name"], gw["metadata"]["namespace"])
    assert parent["sectionName"] == gw["spec"]["listeners"][0]["name"]
