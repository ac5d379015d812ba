"""The rendered NetworkPolicies, judged by what they let through: a small evaluator of
networking/v1 semantics (a pod is isolated by the policies that select it; a connection is allowed
when any of their rules admits its source and port) asked about the connections an EPD deployment
makes and the ones it must refuse."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from epd_operator.api import EPDDeployment
from epd_operator.api.labels import INSTANCE_LABEL, ROLE_LABEL
from epd_operator.api.tiers import VLLM_PORT
from epd_operator.render import render
from epd_operator.render.router_args import ROUTER_METRICS_PORT, ROUTER_PORT
from epd_operator.render.transfer import MOONCAKE_MASTER_METRICS_PORT
from tests.support.render_examples import MOONCAKE, MULTI_NODE, NIXL_AUTOSCALED, example

JSON = dict[str, Any]


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str] = field(default_factory=dict)
    namespace_labels: dict[str, str] = field(default_factory=dict)


def _matches(selector: JSON, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for req in selector.get("matchExpressions", []):
        key, op, values = req["key"], req["operator"], req.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_admits(peer: JSON, policy_namespace: str, source: Pod) -> bool:
    if "ipBlock" in peer:
        return False  # the pods here have no addresses; only selectors are asked about
    if "namespaceSelector" in peer:
        if not _matches(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != policy_namespace:
        return False
    return _matches(peer.get("podSelector", {}), source.labels)


def allowed(policies: list[JSON], source: Pod, target: Pod, port: int) -> bool:
    """Whether `source` may open a TCP connection to `target` on `port` (ingress side only)."""
    selecting = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace and _matches(p["spec"]["podSelector"], target.labels)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p.get("protocol", "TCP") == "TCP" and p["port"] == port for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, policy["metadata"]["namespace"], source) for peer in peers):
                return True
    return False


def policies_of(epd: EPDDeployment) -> list[JSON]:
    return [obj for obj in render(epd) if obj["kind"] == "NetworkPolicy"]


def pod(epd: EPDDeployment, role: str) -> Pod:
    return Pod(epd.namespace, {INSTANCE_LABEL: epd.name, ROLE_LABEL: role})


def outsider(epd: EPDDeployment) -> Pod:
    return Pod("tenant-b", {"app": "curl"}, {"kubernetes.io/metadata.name": "tenant-b"})


PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"}, {"kubernetes.io/metadata.name": "monitoring"})


def test_only_the_routers_and_the_scrapers_reach_the_vllm_port():
    epd = example(NIXL_AUTOSCALED)
    policies = policies_of(epd)
    for role in ("encoder", "prefill", "decode"):
        target = pod(epd, role)
        assert allowed(policies, pod(epd, "router"), target, VLLM_PORT), role
        assert allowed(policies, PROMETHEUS, target, VLLM_PORT), role
        assert not allowed(policies, outsider(epd), target, VLLM_PORT), role
        assert not allowed(policies, Pod(epd.namespace, {"app": "curl"}), target, VLLM_PORT), role
        # Another deployment's router in the same namespace is not this deployment's router.
        other_router = Pod(epd.namespace, {INSTANCE_LABEL: "other", ROLE_LABEL: "router"})
        assert not allowed(policies, other_router, target, VLLM_PORT), role
        assert not allowed(policies, PROMETHEUS, target, 5600), "scrapers reach only the metrics port"


def test_prefill_and_decode_reach_each_other_on_every_port_and_outsiders_on_none():
    epd = example(NIXL_AUTOSCALED)
    policies = policies_of(epd)
    nixl = epd.spec.kvTransfer.nixl.sideChannelPort if epd.spec.kvTransfer else 5600
    for source, target in (("prefill", "decode"), ("decode", "prefill"), ("decode", "encoder")):
        # the side channel, and any port UCX picks
        for port in (nixl, 41234):
            assert allowed(policies, pod(epd, source), pod(epd, target), port), (source, target, port)
    assert not allowed(policies, outsider(epd), pod(epd, "prefill"), nixl)
    assert not allowed(policies, pod(epd, "router"), pod(epd, "prefill"), nixl), "the router needs only the API port"


def test_a_multi_node_group_reaches_itself():
    epd = example(MULTI_NODE)
    policies = policies_of(epd)
    leader = worker = pod(epd, "decode")  # LWS gives leader and workers the template's labels
    assert allowed(policies, worker, leader, 29501)
    assert not allowed(policies, outsider(epd), leader, 29501)


def test_the_mooncake_master_is_a_backend_with_a_scraped_metrics_port():
    epd = example(MOONCAKE, **{"spec.ecTransfer.mooncake": {"crossEncoderCache": True}})
    policies = policies_of(epd)
    master = pod(epd, "mooncake-master")
    assert allowed(policies, pod(epd, "encoder"), master, 50051)
    assert allowed(policies, PROMETHEUS, master, MOONCAKE_MASTER_METRICS_PORT)
    assert not allowed(policies, outsider(epd), master, 50051)


def test_the_router_answers_anyone_by_default_and_its_metrics_only_the_scrapers():
    epd = example(NIXL_AUTOSCALED)
    policies = policies_of(epd)
    router = pod(epd, "router")
    assert allowed(policies, outsider(epd), router, ROUTER_PORT)
    assert allowed(policies, PROMETHEUS, router, ROUTER_METRICS_PORT)
    assert not allowed(policies, outsider(epd), router, ROUTER_METRICS_PORT)


def test_router_from_admits_only_the_named_clients():
    gateway_ns = {"kubernetes.io/metadata.name": "gw", "gateway": "true"}
    epd = example(
        NIXL_AUTOSCALED,
        **{"spec.networkPolicy": {"routerFrom": [{"namespaceSelector": {"matchLabels": {"gateway": "true"}}}]}},
    )
    policies = policies_of(epd)
    router = pod(epd, "router")
    assert allowed(policies, Pod("gw", {"app": "envoy"}, gateway_ns), router, ROUTER_PORT)
    assert not allowed(policies, outsider(epd), router, ROUTER_PORT)


def test_named_scrapers_replace_the_default():
    monitoring = {"kubernetes.io/metadata.name": "obs"}
    epd = example(
        NIXL_AUTOSCALED,
        **{"spec.networkPolicy": {"scrapers": [{"namespaceSelector": {"matchLabels": monitoring}}]}},
    )
    policies = policies_of(epd)
    assert allowed(policies, Pod("obs", {"app": "vmagent"}, monitoring), pod(epd, "decode"), VLLM_PORT)
    assert not allowed(policies, PROMETHEUS, pod(epd, "decode"), VLLM_PORT)
    none = example(NIXL_AUTOSCALED, **{"spec.networkPolicy": {"scrapers": []}})
    assert not allowed(policies_of(none), PROMETHEUS, pod(none, "decode"), VLLM_PORT)
    assert allowed(policies_of(none), pod(none, "router"), pod(none, "decode"), VLLM_PORT)


def test_turned_off_renders_no_policy():
    assert policies_of(example(NIXL_AUTOSCALED, **{"spec.networkPolicy": {"enabled": False}})) == []


def test_egress_is_open_unless_narrowed():
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies_of(example(NIXL_AUTOSCALED)))


def test_narrowed_egress_keeps_the_deployment_and_dns_and_adds_the_destinations():
    epd = example(NIXL_AUTOSCALED, **{"spec.networkPolicy": {"egressTo": [{"cidr": "10.96.0.1/32", "ports": [443]}]}})
    policies = policies_of(epd)
    assert {p["metadata"]["name"] for p in policies} == {f"{epd.name}-backends", f"{epd.name}-router"}
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        egress = policy["spec"]["egress"]
        assert {"to": [{"podSelector": {"matchLabels": {INSTANCE_LABEL: epd.name}}}]} in egress
        assert {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]} in egress
        assert {
            "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 443}],
        } in egress


@pytest.mark.parametrize("name", [NIXL_AUTOSCALED, MOONCAKE, MULTI_NODE])
def test_every_backend_pod_is_selected_by_the_backends_policy(name):
    """No vLLM (or Mooncake master) pod template escapes the policy: its labels match the selector."""
    epd = example(name)
    objects = render(epd)
    (backends,) = [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"].endswith("-backends")]
    for obj in objects:
        if obj["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        spec = obj["spec"]
        templates = (
            [spec["leaderWorkerTemplate"]["leaderTemplate"], spec["leaderWorkerTemplate"]["workerTemplate"]]
            if "leaderWorkerTemplate" in spec
            else [spec["template"]]
        )
        is_router = obj["metadata"]["labels"][ROLE_LABEL] == "router"
        for template in templates:
            assert _matches(backends["spec"]["podSelector"], template["metadata"]["labels"]) != is_router
