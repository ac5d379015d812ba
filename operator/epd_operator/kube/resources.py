"""The kinds of Kubernetes object the operator, the router and epdctl read or write.

A static table instead of API discovery: the operator knows which kinds it renders, so it needs no
discovery round trips at start (nor a discovery cache to invalidate when a CRD appears later). Each
entry becomes the client library's own `dynamic.Resource`, which builds the request paths.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kubernetes_asyncio import dynamic

from ..api.spec import GROUP, KIND, PLURAL, VERSION


@dataclasses.dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool = True
    # Served only where its CRDs are installed (Gateway API, LeaderWorkerSet, KEDA): listing it elsewhere finds nothing.
    optional: bool = False
    # What to do where an optional kind is not served, in words for the status and its Event.
    when_missing: str = "install its CRDs, or remove the field that asks for it"

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    def for_library(self, client: dynamic.DynamicClient | None = None) -> dynamic.Resource:
        group, _, version = self.api_version.rpartition("/")
        return dynamic.Resource(
            prefix="apis" if group else "api",
            group=group or None,
            api_version=version,
            kind=self.kind,
            namespaced=self.namespaced,
            name=self.plural,
            client=client,
        )

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        if self.namespaced and namespace is None and name is not None:
            raise ValueError(f"{self.kind} is namespaced: a namespace is required")
        path = self.for_library().path(name=name, namespace=namespace)
        return f"{path}/{subresource}" if subresource else path


EPD = Resource(f"{GROUP}/{VERSION}", KIND, PLURAL)
LEASE = Resource("coordination.k8s.io/v1", "Lease", "leases")
EVENT = Resource("v1", "Event", "events")
# Read only: a tier's pods are watched to say why it is not ready (the scheduler's or the kubelet's reason).
POD = Resource("v1", "Pod", "pods")
# The router's discovery follows these (the endpointslice controller builds them per Service).
ENDPOINT_SLICE = Resource("discovery.k8s.io/v1", "EndpointSlice", "endpointslices")

# Every kind the renderer may emit. Pruning lists each of them, so a kind missing here would leave
# its objects behind when a feature is switched off; a unit test renders the examples against it.
CHILD_RESOURCES: dict[str, Resource] = {
    r.kind: r
    for r in (
        Resource("v1", "ConfigMap", "configmaps"),
        Resource("v1", "Service", "services"),
        Resource("v1", "ServiceAccount", "serviceaccounts"),
        Resource("apps/v1", "Deployment", "deployments"),
        Resource("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers"),
        Resource("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets"),
        Resource("rbac.authorization.k8s.io/v1", "Role", "roles"),
        Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
        Resource("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
        Resource("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes", optional=True),
        # Multi-node tiers only (sigs.k8s.io/lws): served where the LeaderWorkerSet CRD is installed.
        Resource("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets", optional=True),
        # Tiers scaled by KEDA (autoscaling.engine: KEDA): served where KEDA is installed.
        Resource(
            "keda.sh/v1alpha1",
            "ScaledObject",
            "scaledobjects",
            optional=True,
            when_missing="KEDA is not installed; install it (docs/autoscaling.md), or set autoscaling.engine: HPA",
        ),
    )
}


def child_resource(obj: dict[str, Any]) -> Resource:
    resource = CHILD_RESOURCES.get(obj.get("kind", ""))
    if resource is None or resource.api_version != obj.get("apiVersion"):
        raise ValueError(f"the operator does not manage {obj.get('apiVersion')}/{obj.get('kind')} objects")
    return resource


def resource_of(obj: dict[str, Any]) -> Resource:
    """The EPDDeployment or one of its children."""
    return EPD if obj.get("kind") == KIND and obj.get("apiVersion") == EPD.api_version else child_resource(obj)
