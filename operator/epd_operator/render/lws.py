"""Multi-node tiers: a tier with `nodesPerReplica > 1` becomes a LeaderWorkerSet (sigs.k8s.io/lws, v1).

One replica is one LWS group of `nodesPerReplica` pods: the leader runs `vllm serve` with its API
server (node rank 0), the workers run the same command headless with their LWS worker index as node
rank; all meet at the leader's address, which LWS's pod webhook puts in every container's
environment. The single-node rendering of the tier (its Deployment) is the starting point: its pod
template becomes the leader's, and the worker's is derived from it, so placement, volumes, env and
transfer settings stay identical on every node of a replica.
"""

from __future__ import annotations

from typing import Any

from ..api.tiers import MULTI_NODE_MASTER_PORT, ConsumerTier, Tier
from .naming import VllmRole
from .plan import RenderPlan
from .templating import render_one
from .transfer import container_port
from .vllm import WORKER, serve_args

JSON = dict[str, Any]

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_PLURAL = "leaderworkersets"
# Set by LWS on every pod of a group; "0" is the leader (api/leaderworkerset/v1 WorkerIndexLabelKey).
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
# Only a leader serves HTTP: a worker is headless, so it has no API port and nothing for probes to ask.
_API_ONLY = ("startupProbe", "readinessProbe", "livenessProbe")


def multi_node(tier: Tier) -> bool:
    return isinstance(tier, ConsumerTier) and tier.nodesPerReplica > 1


def worker_pod(plan: RenderPlan, role: VllmRole, leader_pod: JSON) -> JSON:
    """The worker's pod spec: the leader's, with the headless command line and without the API port."""
    leader, *sidecars = leader_pod["containers"]
    assert leader["name"] == "vllm"
    vllm = {key: value for key, value in leader.items() if key not in _API_ONLY}
    vllm["args"] = serve_args(plan.epd, role, plan.tier(role).transfer, node=WORKER)
    vllm["ports"] = [port for port in leader["ports"] if port["name"] != "http"]
    return {**leader_pod, "containers": [vllm, *sidecars]}


def leader_worker_set(plan: RenderPlan, role: VllmRole, deployment: JSON) -> JSON:
    """The LeaderWorkerSet that replaces the tier's single-node `deployment` (same name, labels, pods)."""
    tier = plan.tier(role).spec
    assert isinstance(tier, ConsumerTier)
    template = deployment["spec"]["template"]
    meta = deployment["metadata"]
    vllm, *sidecars = template["spec"]["containers"]
    rendezvous = container_port("rendezvous", MULTI_NODE_MASTER_PORT)
    leader_pod = {**template["spec"], "containers": [{**vllm, "ports": [*vllm["ports"], rendezvous]}, *sidecars]}
    return render_one(
        "leaderworkerset.yaml.j2",
        name=meta["name"],
        namespace=meta["namespace"],
        labels=meta["labels"],
        replicas=deployment["spec"].get("replicas"),
        size=tier.nodesPerReplica,
        template_metadata=template["metadata"],
        leader_pod=leader_pod,
        worker_pod=worker_pod(plan, role, template["spec"]),
    )


def leaders_only(service: JSON) -> JSON:
    """The tier's Service selects only leaders: the router must never send a request to a worker."""
    spec = service["spec"]
    return {**service, "spec": {**spec, "selector": {**spec["selector"], WORKER_INDEX_LABEL: "0"}}}


def multi_node_workload(plan: RenderPlan, role: VllmRole, workload: Any) -> Any:
    """A tier's `Workload` as rendered for one node, or its multi-node form (LeaderWorkerSet) when asked for."""
    if multi_node(plan.tier(role).spec):
        workload.deployment = leader_worker_set(plan, role, workload.deployment)
        workload.service = leaders_only(workload.service)
        if workload.hpa is not None:
            workload.hpa = scale_lws(workload.hpa)
    return workload


def scale_lws(hpa: JSON) -> JSON:
    """An HPA scales the LeaderWorkerSet by whole groups (LWS serves the scale subresource)."""
    spec = hpa["spec"]
    target = {**spec["scaleTargetRef"], "apiVersion": LWS_API_VERSION, "kind": LWS_KIND}
    return {**hpa, "spec": {**spec, "scaleTargetRef": target}}
