"""The NetworkPolicies around one EPDDeployment's pods: only its routers reach the vLLM ports.

The router is the deployment's trust boundary (it refuses client-supplied transfer parameters), so
its backends must not be reachable around it. Two policies, each allowing (NetworkPolicies only add):

- `{name}-backends`, on every vLLM pod (and the Mooncake master): the vLLM API port from this
  deployment's routers; every port from the deployment's other backend pods, because NIXL's side
  channel, UCX over TCP (on ports it picks), the EC connectors, Mooncake and a multi-node group's
  rendezvous and collectives connect pod to pod; the vLLM API port (vLLM serves `/metrics` there) and
  the Mooncake master's metrics port from the scrapers.
- `{name}-router`, on the router pods: the API port from `routerFrom` (absent: from anyone), the
  metrics port from the scrapers.

With `egressTo`, both also narrow egress to the deployment's own pods, DNS and those destinations.
"""

from __future__ import annotations

from typing import Any

from ..api.labels import INSTANCE_LABEL, ROLE_LABEL
from ..api.network import EgressPeer, PodsPeer, Selector
from ..api.spec import EPDDeployment
from ..api.tiers import VLLM_PORT
from .naming import MOONCAKE_MASTER, ROUTER, object_name, selector_labels, vllm_roles
from .pods import meta
from .router_args import ROUTER_METRICS_PORT, ROUTER_PORT
from .templating import render_one
from .transfer import MOONCAKE_MASTER_METRICS_PORT, mooncake_store_config

JSON = dict[str, Any]

BACKENDS = "backends"  # the name suffix and role label of the policy over the vLLM pods
DNS_PORT = 53


def network_policies(epd: EPDDeployment) -> list[JSON]:
    """The deployment's NetworkPolicies; none when `spec.networkPolicy.enabled` is false."""
    spec = epd.spec.networkPolicy
    if not spec.enabled:
        return []
    backends = backend_selector(epd)
    scrapers = [peer(p) for p in spec.scrapers]
    egress = _egress(epd)
    metrics_ports = [VLLM_PORT]
    if mooncake_store_config(epd) is not None:
        metrics_ports.append(MOONCAKE_MASTER_METRICS_PORT)
    backend_ingress = [
        {"from": [{"podSelector": {"matchLabels": selector_labels(epd, ROUTER)}}], "ports": _tcp(VLLM_PORT)},
        {"from": [{"podSelector": backends}]},
    ]
    if scrapers:
        backend_ingress.append({"from": scrapers, "ports": _tcp(*metrics_ports)})
    router_api: JSON = {"ports": _tcp(ROUTER_PORT)}
    if spec.routerFrom is not None:
        router_api = {"from": [peer(p) for p in spec.routerFrom], **router_api}
    router_ingress = [router_api]
    if scrapers:
        router_ingress.append({"from": scrapers, "ports": _tcp(ROUTER_METRICS_PORT)})
    return [
        _policy(epd, BACKENDS, backends, backend_ingress, egress),
        _policy(epd, ROUTER, {"matchLabels": selector_labels(epd, ROUTER)}, router_ingress, egress),
    ]


def backend_selector(epd: EPDDeployment) -> JSON:
    """Every pod of this deployment but its routers: the vLLM tiers (all pods of a multi-node group)
    and the Mooncake master where one is rendered."""
    roles: list[str] = list(vllm_roles(epd))
    if mooncake_store_config(epd) is not None:
        roles.append(MOONCAKE_MASTER)
    return {
        "matchLabels": {INSTANCE_LABEL: epd.name},
        "matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": roles}],
    }


def selector(value: Selector) -> JSON:
    """A meta/v1 LabelSelector; `{}` (everything) when it has no terms."""
    out: JSON = {}
    if value.matchLabels:
        out["matchLabels"] = dict(value.matchLabels)
    if value.matchExpressions:
        out["matchExpressions"] = [
            {"key": r.key, "operator": r.operator, **({"values": list(r.values)} if r.values else {})}
            for r in value.matchExpressions
        ]
    return out


def peer(value: PodsPeer) -> JSON:
    """A networking/v1 NetworkPolicyPeer."""
    out: JSON = {}
    if value.namespaceSelector is not None:
        out["namespaceSelector"] = selector(value.namespaceSelector)
    if value.podSelector is not None:
        out["podSelector"] = selector(value.podSelector)
    if isinstance(value, EgressPeer) and value.cidr is not None:
        out["ipBlock"] = {"cidr": value.cidr}
    return out


def _tcp(*ports: int) -> list[JSON]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _egress(epd: EPDDeployment) -> list[JSON] | None:
    """Egress rules when the spec narrows egress: the deployment's own pods (the routers call the
    backends, the backends each other), DNS anywhere, and each named destination."""
    destinations = epd.spec.networkPolicy.egressTo
    if destinations is None:
        return None
    rules: list[JSON] = [
        {"to": [{"podSelector": {"matchLabels": {INSTANCE_LABEL: epd.name}}}]},
        {"ports": [{"protocol": proto, "port": DNS_PORT} for proto in ("UDP", "TCP")]},
    ]
    for destination in destinations:
        rule: JSON = {"to": [peer(destination)]}
        if destination.ports:
            rule["ports"] = [{"protocol": proto, "port": p} for p in destination.ports for proto in ("TCP", "UDP")]
        rules.append(rule)
    return rules


def _policy(epd: EPDDeployment, role: str, pod_selector: JSON, ingress: list[JSON], egress: list[JSON] | None) -> JSON:
    return render_one(
        "networkpolicy.yaml.j2",
        **meta(epd, object_name(epd, role), role),
        pod_selector=pod_selector,
        policy_types=["Ingress"] if egress is None else ["Ingress", "Egress"],
        ingress=ingress,
        egress=egress,
    )
