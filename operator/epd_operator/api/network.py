"""The NetworkPolicies around an `EPDDeployment`'s pods: who may scrape them, who may call the router, and
where the pods may connect."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator

from .fields import MAX_LIST_ITEMS, LabelValue, Strict

# A label key: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# A requirement's key is checked by a CEL rule (api/rules.py); a matchLabels key by `Selector` itself.
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LABEL_KEY_MESSAGE = (
    "must be a label key: an optional DNS-subdomain prefix and '/', then at most 63 letters, digits, "
    "'-', '_' or '.', starting and ending with a letter or digit"
)
# Bounds on selectors and peer lists: they keep the CEL rules that walk them within the API server's cost limits.
MAX_SELECTOR_TERMS = 16
MAX_PEERS = 16
# The label the Prometheus Operator puts on the Prometheus pods it runs (which scrape the chart's PodMonitors).
PROMETHEUS_POD_LABEL = {"app.kubernetes.io/name": "prometheus"}
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
CIDR_PATTERN = (
    rf"^(({_OCTET}\.){{3}}{_OCTET}/([0-9]|[12][0-9]|3[0-2])"
    r"|[0-9a-fA-F]{0,4}(:[0-9a-fA-F]{0,4}){2,7}/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8]))$"
)
Port = Annotated[int, Field(ge=1, le=65535)]


class SelectorRequirement(Strict):
    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the key relates to `values`.")
    values: list[LabelValue] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Label values: at least one with `In`/`NotIn`, none with `Exists`/`DoesNotExist`.",
    )


class Selector(Strict):
    """A meta/v1 LabelSelector: every term must match; `{}` selects everything."""

    matchLabels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_SELECTOR_TERMS,
        description="Labels the object must carry, key: value (keys are label keys such as `app.kubernetes.io/name`).",
    )
    matchExpressions: list[SelectorRequirement] = Field(
        default_factory=list, max_length=MAX_SELECTOR_TERMS, description="Set-based requirements."
    )

    @field_validator("matchLabels")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        # Checked here, not by a CEL rule: a CRD schema cannot bound a map key's length, and the API
        # server prices a regex over an unbounded key beyond its cost budget. The operator and
        # `epdctl validate` refuse it, so no policy with such a key is ever applied.
        bad = [key for key in value if len(key) > 317 or not re.match(LABEL_KEY_PATTERN, key)]
        if bad:
            raise ValueError(f"{', '.join(repr(k) for k in bad)}: every key {LABEL_KEY_MESSAGE}")
        return value


class PodsPeer(Strict):
    namespaceSelector: Selector | None = Field(
        None, description="Namespaces the pods live in (`{}`: every namespace); absent: the EPDDeployment's own."
    )
    podSelector: Selector | None = Field(None, description="Pods in those namespaces; absent: every pod there.")


class Peer(PodsPeer):
    """Pods that may connect, as a NetworkPolicy peer: pods matching `podSelector` in the namespaces
    matching `namespaceSelector` (at least one of the two)."""


class EgressPeer(PodsPeer):
    """A destination the deployment's pods may connect to: pods (`namespaceSelector`/`podSelector`)
    or an address range (`cidr`), on `ports` (absent: every port)."""

    cidr: str | None = Field(
        None,
        min_length=1,
        max_length=43,
        pattern=CIDR_PATTERN,
        description="An IP range, e.g. the API server's address (`kubectl get endpoints kubernetes`) as `/32`; "
        "not together with the selectors.",
    )
    ports: list[Port] = Field(
        default_factory=list,
        max_length=MAX_PEERS,
        description="TCP and UDP ports (1-65535) allowed to that destination; empty: every port.",
    )


def _default_scrapers() -> list[Peer]:
    return [Peer(namespaceSelector=Selector(), podSelector=Selector(matchLabels=dict(PROMETHEUS_POD_LABEL)))]


# Where kubeadm, GKE, EKS and AKS run the cluster's DNS (CoreDNS or kube-dns): `kube-system`'s pods
# labelled `k8s-app: kube-dns`.
CLUSTER_DNS_NAMESPACE_LABEL = {"kubernetes.io/metadata.name": "kube-system"}
CLUSTER_DNS_POD_LABEL = {"k8s-app": "kube-dns"}


def _default_dns() -> list[EgressPeer]:
    return [
        EgressPeer(
            namespaceSelector=Selector(matchLabels=dict(CLUSTER_DNS_NAMESPACE_LABEL)),
            podSelector=Selector(matchLabels=dict(CLUSTER_DNS_POD_LABEL)),
        )
    ]


class NetworkPolicySpec(Strict):
    """NetworkPolicies that let only this deployment's routers call its vLLM pods (see the network model
    in docs/router.md). They protect only where the cluster's network plugin enforces NetworkPolicies."""

    enabled: bool = Field(
        True, description="Render the NetworkPolicies; `false`: none, every pod may reach every vLLM port."
    )
    scrapers: list[Peer] = Field(
        default_factory=_default_scrapers,
        max_length=MAX_PEERS,
        description="Who may scrape metrics: the vLLM pods' API port (vLLM serves `/metrics` there), the "
        "routers' and the Mooncake master's metrics ports. Default: the Prometheus Operator's Prometheus pods "
        "(`app.kubernetes.io/name: prometheus`) in any namespace; empty: no scraper.",
        json_schema_extra={
            "default": [
                {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(PROMETHEUS_POD_LABEL)}},
            ]
        },
    )
    routerFrom: list[Peer] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PEERS,
        description="Who may call the router's API port, e.g. a gateway's pods; absent: any client, in the "
        "cluster or (through a NodePort or LoadBalancer Service) outside it. An empty list would lock every "
        "client out and is refused.",
    )
    egressTo: list[EgressPeer] | None = Field(
        None,
        min_length=1,
        max_length=MAX_PEERS,
        description="Narrow the pods' outgoing connections to these destinations, besides each other and DNS "
        "(`dns`, and port 53 anywhere); absent: egress is open. The routers watch the API server: list its "
        "endpoint address here (`kubectl get endpointslices -l kubernetes.io/service-name=kubernetes`), since "
        "policies see the address after the Service's translation. A model downloaded from a hub needs the "
        "hub's addresses too.",
    )
    dns: list[EgressPeer] = Field(
        default_factory=_default_dns,
        max_length=MAX_PEERS,
        description="With `egressTo`: the cluster's DNS servers the pods may query, on every port unless `ports` "
        "names some (policies see the DNS pod's own port after the Service's translation: 53 on most clusters, "
        "5353 on OpenShift, whose DNS pods are `openshift-dns`'s `dns.operator.openshift.io/daemonset-dns: "
        "default`). Default: the `k8s-app: kube-dns` pods of `kube-system` (CoreDNS or kube-dns on kubeadm, "
        "GKE, EKS, AKS). Port 53 stays open to any address besides.",
        json_schema_extra={
            "default": [
                {
                    "namespaceSelector": {"matchLabels": dict(CLUSTER_DNS_NAMESPACE_LABEL)},
                    "podSelector": {"matchLabels": dict(CLUSTER_DNS_POD_LABEL)},
                },
            ]
        },
    )
