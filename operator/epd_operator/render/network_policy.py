"""The NetworkPolicies around one EPDDeployment's pods: only its routers reach the vLLM API ports, and
the backends reach each other only on the ports their transfers use.

The router is the deployment's trust boundary (it refuses client-supplied transfer parameters), so
its backends must not be reachable around it, not even from each other: the encoder parses untrusted
client media, and must not be able to call prefill's or decode's API with transfer parameters of its
own. The policies, each allowing (NetworkPolicies only add):

- `{name}-backends`, on every vLLM pod (and the Mooncake master): the vLLM API port from this
  deployment's routers; the vLLM API port (vLLM serves `/metrics` there) and the Mooncake master's
  metrics port from the scrapers. Nothing from the other backends.
- `{name}-{role}-transfer`, on one backend role's pods, where its connectors or its multi-node group
  need it: exactly the connections the render plan lists (`plan.ingress`, from `transfer.transfer_ingress`:
  which tiers, which ports), computed once from the settings the pods' args and env are rendered from.
- `{name}-router`, on the router pods: the API port from `routerFrom` (absent: from anyone), the
  metrics port from the scrapers.

With `egressTo`, every policy also narrows egress to the deployment's own pods, the cluster's DNS pods
(`dns`, on any port: policies see the port after the Service's translation), port 53 anywhere, and
those destinations.
"""

from __future__ import annotations

from typing import Any

from ..api.labels import INSTANCE_LABEL, ROLE_LABEL
from ..api.network import EgressPeer, PodsPeer, Selector
from ..api.spec import EPDDeployment
from ..api.tiers import VLLM_PORT
from .naming import MOONCAKE_MASTER, ROUTER, object_name, selector_labels
from .plan import RenderPlan
from .pods import meta
from .router_args import ROUTER_METRICS_PORT, ROUTER_PORT
from .templating import render_one
from .transfer import MOONCAKE_MASTER_METRICS_PORT, PortRange

JSON = dict[str, Any]

BACKENDS = "backends"  # the name suffix and role label of the policy over the vLLM pods
TRANSFER_SUFFIX = "transfer"  # `{name}-{role}-transfer`: what one role accepts from the other backends
DNS_PORT = 53


def network_policies(plan: RenderPlan) -> list[JSON]:
    """The deployment's NetworkPolicies; none when `spec.networkPolicy.enabled` is false.

    The transfer policies come before `{name}-backends`, so that a controller applying them in order
    admits a transfer before an older `{name}-backends` that admitted every port stops doing so."""
    epd = plan.epd
    spec = epd.spec.networkPolicy
    if not spec.enabled:
        return []
    backends = backend_selector(plan)
    scrapers = [peer(p) for p in spec.scrapers]
    egress = _egress(epd)
    metrics_ports = [VLLM_PORT]
    if plan.mooncake_store is not None:
        metrics_ports.append(MOONCAKE_MASTER_METRICS_PORT)
    backend_ingress: list[JSON] = [
        {"from": [{"podSelector": {"matchLabels": selector_labels(epd, ROUTER)}}], "ports": _tcp(VLLM_PORT)},
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
        *_transfer_policies(plan, egress),
        _policy(epd, BACKENDS, BACKENDS, backends, backend_ingress, egress),
        _policy(epd, ROUTER, ROUTER, {"matchLabels": selector_labels(epd, ROUTER)}, router_ingress, egress),
    ]


def _transfer_policies(plan: RenderPlan, egress: list[JSON] | None) -> list[JSON]:
    """One policy per backend role that accepts transfer connections: a rule per (sources, ports)."""
    epd = plan.epd
    rules: dict[str, list[JSON]] = {}
    for ingress in plan.ingress:
        sources = {
            "podSelector": {
                "matchLabels": {INSTANCE_LABEL: epd.name},
                "matchExpressions": [{"key": ROLE_LABEL, "operator": "In", "values": list(ingress.sources)}],
            }
        }
        rules.setdefault(ingress.role, []).append({"from": [sources], "ports": _tcp_ranges(ingress.ports)})
    return [
        _policy(epd, f"{role}-{TRANSFER_SUFFIX}", role, {"matchLabels": selector_labels(epd, role)}, role_rules, egress)
        for role, role_rules in rules.items()
    ]


def backend_selector(plan: RenderPlan) -> JSON:
    """Every pod of this deployment but its routers: the vLLM tiers (all pods of a multi-node group)
    and the Mooncake master where one is rendered."""
    roles: list[str] = list(plan.roles)
    if plan.mooncake_store is not None:
        roles.append(MOONCAKE_MASTER)
    return {
        "matchLabels": {INSTANCE_LABEL: plan.epd.name},
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


def _tcp_ranges(ranges: tuple[PortRange, ...]) -> list[JSON]:
    return [
        {"protocol": "TCP", "port": first, **({"endPort": last} if last != first else {})} for first, last in ranges
    ]


def _egress(epd: EPDDeployment) -> list[JSON] | None:
    """Egress rules when the spec narrows egress: the deployment's own pods (the routers call the
    backends, the backends each other; their ingress rules say on which ports), the cluster's DNS pods
    on any port (or on `ports` where a `dns` peer names them), port 53 anywhere (a resolver reached
    without a Service's translation, such as a node-local cache), and each named destination."""
    spec = epd.spec.networkPolicy
    if spec.egressTo is None:
        return None
    rules: list[JSON] = [
        {"to": [{"podSelector": {"matchLabels": {INSTANCE_LABEL: epd.name}}}]},
        *(_egress_rule(server) for server in spec.dns),
        {"ports": [{"protocol": proto, "port": DNS_PORT} for proto in ("UDP", "TCP")]},
    ]
    return rules + [_egress_rule(destination) for destination in spec.egressTo]


def _egress_rule(destination: EgressPeer) -> JSON:
    rule: JSON = {"to": [peer(destination)]}
    if destination.ports:
        rule["ports"] = [{"protocol": proto, "port": p} for p in destination.ports for proto in ("TCP", "UDP")]
    return rule


def _policy(
    epd: EPDDeployment, suffix: str, role: str, pod_selector: JSON, ingress: list[JSON], egress: list[JSON] | None
) -> JSON:
    return render_one(
        "networkpolicy.yaml.j2",
        **meta(epd, object_name(epd, suffix), role),
        pod_selector=pod_selector,
        policy_types=["Ingress"] if egress is None else ["Ingress", "Egress"],
        ingress=ingress,
        egress=egress,
    )
