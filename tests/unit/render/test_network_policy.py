"""The rendered NetworkPolicies, judged by what they let through: a small evaluator of
networking/v1 semantics (a pod is isolated by the policies that select it; a connection is allowed
when any of their rules admits its source and port) asked about the connections an EPD deployment
makes and the ones it must refuse."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from epd_operator.api import EPDDeployment
from epd_operator.api.labels import INSTANCE_LABEL, ROLE_LABEL
from epd_operator.api.tiers import VLLM_PORT
from epd_operator.render import render
from epd_operator.render.router_args import ROUTER_METRICS_PORT, ROUTER_PORT
from epd_operator.render.transfer import MOONCAKE_MASTER_METRICS_PORT
from tests.support.render_examples import (
    BEHIND_GATEWAY,
    CPU_CONNECTOR,
    LOCAL_CPU,
    LOCAL_CPU_NIXL,
    MOONCAKE,
    MULTI_NODE,
    NIXL_AUTOSCALED,
    example,
)

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
            if ports and not any(_port_admits(p, port) for p in ports):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_admits(peer, policy["metadata"]["namespace"], source) for peer in peers):
                return True
    return False


def _port_admits(rule_port: JSON, port: int) -> bool:
    if rule_port.get("protocol", "TCP") != "TCP":
        return False
    first: int = rule_port["port"]
    return first <= port <= rule_port.get("endPort", first)


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


# ----------------------------------------------------------------------------- between backends
# The ports asked about are read from the rendered pods (their env and args), so a policy that
# disagrees with what vLLM is told to listen on fails here.

ANY_OTHER_PORT = 41234  # a port no connector of these examples names (outside UCX's range)


def _vllm_container(epd: EPDDeployment, role: str, template: str = "template") -> JSON:
    for obj in render(epd):
        if obj["kind"] in ("Deployment", "LeaderWorkerSet") and obj["metadata"]["labels"][ROLE_LABEL] == role:
            spec = obj["spec"]
            pod_template = (
                spec["leaderWorkerTemplate"][template] if "leaderWorkerTemplate" in spec else spec["template"]
            )
            return pod_template["spec"]["containers"][0]
    raise AssertionError(f"no {role} workload")


def _env(container: JSON, name: str) -> str:
    (value,) = [e["value"] for e in container["env"] if e["name"] == name]
    return value


def _ucx_ports(container: JSON) -> list[int]:
    first, last = (int(p) for p in _env(container, "UCX_TCP_PORT_RANGE").split("-"))
    return [first, (first + last) // 2, last]


def _arg(container: JSON, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def _roles(epd: EPDDeployment) -> list[str]:
    return ["encoder", "prefill", "decode"] if epd.spec.prefill is not None else ["encoder", "decode"]


def test_without_a_transfer_over_the_network_no_backend_reaches_another():
    """E+PD over SharedStorage: the embeddings go through a volume, so no backend pod accepts anything
    from another, the API port included (an encoder could otherwise call decode's API directly)."""
    epd = example(LOCAL_CPU)
    policies = policies_of(epd)
    for source in _roles(epd):
        for target in _roles(epd):
            for port in (VLLM_PORT, 5600, 40000, ANY_OTHER_PORT):
                assert not allowed(policies, pod(epd, source), pod(epd, target), port), (source, target, port)
    assert not [p for p in policies if p["metadata"]["name"].endswith("-transfer")]


@pytest.mark.parametrize("name", [NIXL_AUTOSCALED, LOCAL_CPU_NIXL])
def test_nixl_prefill_and_decode_reach_each_other_on_the_side_channel_and_ucx_ports_only(name):
    epd = example(name)
    policies = policies_of(epd)
    for source, target in (("prefill", "decode"), ("decode", "prefill")):
        container = _vllm_container(epd, target)
        side = int(_env(container, "VLLM_NIXL_SIDE_CHANNEL_PORT"))
        side_ports = [p["containerPort"] for p in container["ports"] if p["name"].startswith("nixl")]
        assert side in side_ports
        for port in side_ports + _ucx_ports(container):
            assert allowed(policies, pod(epd, source), pod(epd, target), port), (source, target, port)
        for port in (VLLM_PORT, ANY_OTHER_PORT, _ucx_ports(container)[-1] + 1):
            assert not allowed(policies, pod(epd, source), pod(epd, target), port), (source, target, port)
    # The encoder (it parses untrusted media) reaches neither, on any port; nor does an outsider.
    for target in ("prefill", "decode"):
        container = _vllm_container(epd, target)
        for port in (VLLM_PORT, int(_env(container, "VLLM_NIXL_SIDE_CHANNEL_PORT")), *_ucx_ports(container)):
            assert not allowed(policies, pod(epd, "encoder"), pod(epd, target), port), (target, port)
            assert not allowed(policies, outsider(epd), pod(epd, target), port), (target, port)
            assert not allowed(policies, pod(epd, "router"), pod(epd, target), port) or port == VLLM_PORT
    for role in ("prefill", "decode"):
        assert not allowed(policies, pod(epd, role), pod(epd, "encoder"), VLLM_PORT), role


def test_nixl_side_channel_ports_follow_the_data_parallel_ranks():
    epd = example(NIXL_AUTOSCALED, **{"spec.prefill.dataParallelSize": 3, "spec.kvTransfer.nixl.sideChannelPort": 7000})
    policies = policies_of(epd)
    for port in (7000, 7001, 7002):
        assert allowed(policies, pod(epd, "decode"), pod(epd, "prefill"), port)
    assert not allowed(policies, pod(epd, "decode"), pod(epd, "prefill"), 7003)


def test_mooncake_encoder_and_consumer_reach_each_other_on_every_port_but_the_api():
    """vLLM binds the consumer's event socket on a port the kernel picks and Mooncake's transfer engine
    picks its own: only the API port can be kept closed."""
    epd = example(MOONCAKE, **{"spec.ecTransfer.mooncake.crossEncoderCache": False})
    policies = policies_of(epd)
    consumer = _vllm_container(epd, "decode")
    ec = json.loads(_arg(consumer, "--ec-transfer-config"))
    for port in (ec["ec_port"], ANY_OTHER_PORT, 1, 65535):
        assert allowed(policies, pod(epd, "encoder"), pod(epd, "decode"), port), port
        assert allowed(policies, pod(epd, "decode"), pod(epd, "encoder"), port), port
    assert not allowed(policies, pod(epd, "encoder"), pod(epd, "decode"), VLLM_PORT)
    assert not allowed(policies, pod(epd, "decode"), pod(epd, "encoder"), VLLM_PORT)
    assert not allowed(policies, pod(epd, "encoder"), pod(epd, "encoder"), ANY_OTHER_PORT), "no store: no peers"
    assert not allowed(policies, outsider(epd), pod(epd, "decode"), ec["ec_port"])


def test_mooncake_e_p_d_encoder_reaches_prefill_and_never_decode():
    epd = example(NIXL_AUTOSCALED, **{"spec.ecTransfer": {"connector": "Mooncake"}})
    policies = policies_of(epd)
    assert allowed(policies, pod(epd, "encoder"), pod(epd, "prefill"), ANY_OTHER_PORT)
    for port in (VLLM_PORT, ANY_OTHER_PORT, 5600, 40000):
        assert not allowed(policies, pod(epd, "encoder"), pod(epd, "decode"), port), port


def test_the_mooncake_master_is_called_by_the_encoders_and_scraped():
    epd = example(MOONCAKE, **{"spec.ecTransfer.mooncake.crossEncoderCache": True})
    policies = policies_of(epd)
    master = pod(epd, "mooncake-master")
    store = json.loads(
        next(o for o in render(epd) if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-transfer"))[
            "data"
        ]["mooncake-store.json"]
    )
    rpc = int(store["master_server_address"].rsplit(":", 1)[1])
    assert allowed(policies, pod(epd, "encoder"), master, rpc)
    assert not allowed(policies, pod(epd, "decode"), master, rpc)
    assert not allowed(policies, pod(epd, "encoder"), master, ANY_OTHER_PORT)
    assert allowed(policies, PROMETHEUS, master, MOONCAKE_MASTER_METRICS_PORT)
    assert not allowed(policies, outsider(epd), master, rpc)
    # The encoders lend each other store segments.
    assert allowed(policies, pod(epd, "encoder"), pod(epd, "encoder"), ANY_OTHER_PORT)
    assert not allowed(policies, pod(epd, "encoder"), pod(epd, "encoder"), VLLM_PORT)


def test_cpu_connector_consumer_dials_the_encoders_side_channel_and_ucx_goes_both_ways():
    epd = example(CPU_CONNECTOR)
    policies = policies_of(epd)
    encoder, consumer = _vllm_container(epd, "encoder"), _vllm_container(epd, "decode")
    side = int(_env(encoder, "VLLM_EC_SIDE_CHANNEL_PORT"))
    assert allowed(policies, pod(epd, "decode"), pod(epd, "encoder"), side)
    assert not allowed(policies, pod(epd, "encoder"), pod(epd, "decode"), side)
    for port in _ucx_ports(encoder):
        assert allowed(policies, pod(epd, "decode"), pod(epd, "encoder"), port)
    for port in _ucx_ports(consumer):
        assert allowed(policies, pod(epd, "encoder"), pod(epd, "decode"), port)
    for source, target in (("encoder", "decode"), ("decode", "encoder")):
        for port in (VLLM_PORT, ANY_OTHER_PORT):
            assert not allowed(policies, pod(epd, source), pod(epd, target), port), (source, target, port)


def test_cpu_connector_without_nixl_opens_only_the_side_channel():
    epd = example(CPU_CONNECTOR, **{"spec.ecTransfer.cpu.nixl": False})
    policies = policies_of(epd)
    assert allowed(policies, pod(epd, "decode"), pod(epd, "encoder"), 5601)
    assert not allowed(policies, pod(epd, "decode"), pod(epd, "encoder"), 40000)
    assert not allowed(policies, pod(epd, "encoder"), pod(epd, "decode"), 40000)


def test_a_multi_node_group_reaches_itself_on_every_port_but_the_api_and_the_encoder_not_at_all():
    epd = example(MULTI_NODE)
    policies = policies_of(epd)
    leader = worker = pod(epd, "decode")  # LWS gives leader and workers the template's labels
    rendezvous = int(_arg(_vllm_container(epd, "decode", "workerTemplate"), "--master-port"))
    for port in (rendezvous, ANY_OTHER_PORT, 1, 65535):
        assert allowed(policies, worker, leader, port), port
    assert not allowed(policies, worker, leader, VLLM_PORT)
    for port in (rendezvous, VLLM_PORT, ANY_OTHER_PORT):
        assert not allowed(policies, outsider(epd), leader, port)
        assert not allowed(policies, pod(epd, "encoder"), leader, port)


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


def test_set_based_selectors_reach_the_policies_as_written():
    scrapers = [
        {
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["obs", "sre"]}]},
            "podSelector": {"matchExpressions": [{"key": "scraper", "operator": "Exists"}]},
        }
    ]
    epd = example(NIXL_AUTOSCALED, **{"spec.networkPolicy": {"scrapers": scrapers}})
    policies = policies_of(epd)
    [backends] = [p for p in policies if p["metadata"]["name"].endswith("-backends")]
    assert backends["spec"]["ingress"][1]["from"] == [
        {
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["obs", "sre"]}]},
            "podSelector": {"matchExpressions": [{"key": "scraper", "operator": "Exists"}]},
        }
    ]
    decode = pod(epd, "decode")
    assert allowed(policies, Pod("o", {"scraper": "yes"}, {"team": "sre"}), decode, VLLM_PORT)
    assert not allowed(policies, Pod("o", {"scraper": "yes"}, {"team": "web"}), decode, VLLM_PORT)
    assert not allowed(policies, Pod("o", {"app": "x"}, {"team": "obs"}), decode, VLLM_PORT)


def test_turned_off_renders_no_policy():
    assert policies_of(example(NIXL_AUTOSCALED, **{"spec.networkPolicy": {"enabled": False}})) == []


def test_egress_is_open_unless_narrowed():
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies_of(example(NIXL_AUTOSCALED)))


def test_narrowed_egress_keeps_the_deployment_and_dns_and_adds_the_destinations():
    epd = example(NIXL_AUTOSCALED, **{"spec.networkPolicy": {"egressTo": [{"cidr": "10.96.0.1/32", "ports": [443]}]}})
    policies = policies_of(epd)
    assert {p["metadata"]["name"] for p in policies} == {
        f"{epd.name}-backends",
        f"{epd.name}-router",
        f"{epd.name}-prefill-transfer",
        f"{epd.name}-decode-transfer",
    }
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        egress = policy["spec"]["egress"]
        assert {"to": [{"podSelector": {"matchLabels": {INSTANCE_LABEL: epd.name}}}]} in egress
        assert {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]} in egress
        assert {
            "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 443}],
        } in egress


def _egress_allowed(policy: JSON, destination: Pod, port: int, protocol: str = "UDP") -> bool:
    """Whether `policy`'s egress rules admit a connection to `destination` on `port` (after the
    Service's translation: the destination pod's own port)."""
    for rule in policy["spec"]["egress"]:
        ports = rule.get("ports")
        if ports and not any(p["protocol"] == protocol and p["port"] == port for p in ports):
            continue
        peers = rule.get("to")
        if not peers or any(_peer_admits(peer, policy["metadata"]["namespace"], destination) for peer in peers):
            return True
    return False


KUBE_SYSTEM = {"kubernetes.io/metadata.name": "kube-system"}


@pytest.mark.parametrize("dns_port", [53, 1053, 5353])
def test_narrowed_egress_reaches_the_cluster_dns_pods_whatever_port_they_listen_on(dns_port):
    """Policies match the port after the kube-dns Service's translation: 53 behind 53 on most clusters,
    1053 on this project's local cluster, 5353 on OpenShift."""
    epd = example(LOCAL_CPU, **{"spec.networkPolicy": {"egressTo": [{"cidr": "10.0.0.1/32"}]}})
    coredns = Pod("kube-system", {"k8s-app": "kube-dns"}, KUBE_SYSTEM)
    for policy in policies_of(epd):
        assert _egress_allowed(policy, coredns, dns_port), policy["metadata"]["name"]
        assert _egress_allowed(policy, coredns, dns_port, "TCP"), policy["metadata"]["name"]
        # A pod elsewhere that merely listens on a DNS-like port is no DNS server, nor is another kube-system pod.
        assert not _egress_allowed(policy, Pod("tenant-b", {"k8s-app": "kube-dns"}, {"x": "y"}), 1053)
        assert not _egress_allowed(policy, Pod("kube-system", {"k8s-app": "metrics-server"}, KUBE_SYSTEM), 1053)
        assert not _egress_allowed(policy, outsider(epd), 5353)


def test_dns_servers_can_be_named_with_their_ports():
    openshift = {"kubernetes.io/metadata.name": "openshift-dns"}
    epd = example(
        LOCAL_CPU,
        **{
            "spec.networkPolicy": {
                "egressTo": [{"cidr": "10.0.0.1/32"}],
                "dns": [
                    {
                        "namespaceSelector": {"matchLabels": openshift},
                        "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}},
                        "ports": [5353],
                    }
                ],
            }
        },
    )
    dns = Pod("openshift-dns", {"dns.operator.openshift.io/daemonset-dns": "default"}, openshift)
    for policy in policies_of(epd):
        assert _egress_allowed(policy, dns, 5353)
        assert not _egress_allowed(policy, dns, 8080, "TCP")
        assert not _egress_allowed(policy, Pod("kube-system", {"k8s-app": "kube-dns"}, KUBE_SYSTEM), 1053)


def test_dns_servers_matter_only_when_egress_is_narrowed():
    epd = example(LOCAL_CPU, **{"spec.networkPolicy": {"dns": []}})
    assert all("egress" not in p["spec"] for p in policies_of(epd))


@pytest.mark.parametrize("name", [NIXL_AUTOSCALED, MOONCAKE, MULTI_NODE, CPU_CONNECTOR])
def test_every_backend_pod_is_selected_by_the_backends_policy(name):
    """No vLLM (or Mooncake master) pod template escapes the policy: its labels match the selector;
    and each transfer policy selects exactly its own role's pods."""
    epd = example(name, **{"spec.ecTransfer.mooncake.crossEncoderCache": True} if name == MOONCAKE else {})
    objects = render(epd)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    (backends,) = [p for p in policies if p["metadata"]["name"].endswith("-backends")]
    transfer = {p["metadata"]["labels"][ROLE_LABEL]: p for p in policies if p["metadata"]["name"].endswith("-transfer")}
    assert transfer, "every one of these examples moves something between pods"
    for obj in objects:
        if obj["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        spec = obj["spec"]
        templates = (
            [spec["leaderWorkerTemplate"]["leaderTemplate"], spec["leaderWorkerTemplate"]["workerTemplate"]]
            if "leaderWorkerTemplate" in spec
            else [spec["template"]]
        )
        role = obj["metadata"]["labels"][ROLE_LABEL]
        for template in templates:
            labels = template["metadata"]["labels"]
            assert _matches(backends["spec"]["podSelector"], labels) != (role == "router")
            for policy_role, policy in transfer.items():
                assert _matches(policy["spec"]["podSelector"], labels) == (policy_role == role), (policy_role, role)


def test_transfer_policies_come_before_the_backends_policy():
    """Applied in order, a transfer is admitted by its own policy before an older `{name}-backends`
    (which admitted every port between backends) is narrowed."""
    epd = example(NIXL_AUTOSCALED)
    names = [p["metadata"]["name"] for p in policies_of(epd)]
    backends = names.index(f"{epd.name}-backends")
    assert backends > max(names.index(f"{epd.name}-prefill-transfer"), names.index(f"{epd.name}-decode-transfer"))


def test_the_gateway_example_admits_only_its_gateways_proxy_pods_to_the_router():
    epd = example(BEHIND_GATEWAY)
    policies = policies_of(epd)
    router = pod(epd, "router")
    ns = {"kubernetes.io/metadata.name": "envoy-gateway-system"}
    owner = {"gateway.envoyproxy.io/owning-gateway-name": "inference"}
    proxy = Pod("envoy-gateway-system", {**owner, "gateway.envoyproxy.io/owning-gateway-namespace": "gateways"}, ns)
    assert allowed(policies, proxy, router, ROUTER_PORT)
    # Envoy Gateway's controller, a proxy of another Gateway, or any other pod: refused.
    assert not allowed(
        policies, Pod("envoy-gateway-system", {"control-plane": "envoy-gateway"}, ns), router, ROUTER_PORT
    )
    other = Pod("envoy-gateway-system", {**owner, "gateway.envoyproxy.io/owning-gateway-namespace": "other"}, ns)
    assert not allowed(policies, other, router, ROUTER_PORT)
    assert not allowed(policies, Pod(epd.namespace, {"app": "curl"}), router, ROUTER_PORT)
    assert [o["kind"] for o in render(epd)].count("HTTPRoute") == 1
