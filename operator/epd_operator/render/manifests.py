"""EPDDeployment -> Kubernetes objects: assembles the vLLM tiers, the router and the transfer extras.

Pure: the same spec always gives the same objects in the same order, with no I/O, clock or
randomness, so the controller's server-side apply is a no-op in steady state. The vLLM tiers are
built in `vllm_tiers`, the router's objects in `router_workload`, the shapes they share in `pods`.
"""

from __future__ import annotations

from ..api.router import DEFAULT_ROUTER_IMAGE
from ..api.spec import EPDDeployment
from ..api.tiers import Placement
from ..api.transfer import Mooncake
from .keda import scaled_object, uses_keda
from .lws import multi_node_workload
from .naming import (
    CONFIG_HASH_ANNOTATION,
    MOONCAKE_MASTER,
    ROLE_LABEL,
    TRANSFER,
    object_name,
    selector_labels,
    transfer_configmap_name,
)
from .network_policy import network_policies
from .plan import plan_render
from .pods import JSON, RUNTIME_DEFAULT_SECCOMP, Workload, config_hash, meta, pod_spec, resources, workload
from .router_workload import router_rbac, router_route, router_workload
from .templating import render_one
from .transfer import MOONCAKE_MASTER_METRICS_PORT, MOONCAKE_MASTER_RPC_PORT
from .vllm_tiers import vllm_workload

__all__ = ["config_hash", "render", "tier_hashes"]  # config_hash: re-exported, the package's API


def render(
    epd: EPDDeployment,
    *,
    default_router_image: str = DEFAULT_ROUTER_IMAGE,
    default_prometheus_address: str | None = None,
) -> list[JSON]:
    """Every object `epd` becomes: ConfigMap, router RBAC, NetworkPolicies, Services, Deployments, HPAs or ScaledObjects, PDBs.

    `default_router_image` is the image of the router and janitor when the spec names none; the
    operator passes its own image, so upgrading the operator chart upgrades the data plane with it.
    `default_prometheus_address` is the Prometheus a KEDA-scaled tier's load trigger queries when its
    spec names none (the operator's `--keda-prometheus-address`); without either such a spec is refused.
    """
    plan = plan_render(epd, epd.spec.router.image or default_router_image)
    tiers = {role: multi_node_workload(plan, role, vllm_workload(plan, role)) for role in plan.roles}
    scaled_objects = [
        scaled_object(epd, role, w.deployment, autoscaling, default_prometheus_address)
        for role, w in tiers.items()
        if uses_keda(autoscaling := plan.tier(role).spec.autoscaling)
    ]
    workloads = [*tiers.values(), router_workload(epd, plan.router_image)]
    if plan.mooncake_store is not None:
        workloads.append(_mooncake_master_workload(epd))
    return [
        render_one("configmap.yaml.j2", **meta(epd, transfer_configmap_name(epd), TRANSFER), data=plan.config),
        *router_rbac(epd),
        # Before the workloads: no pod of the deployment ever runs without its policies.
        *network_policies(plan),
        *(w.service for w in workloads),
        *(w.deployment for w in workloads),
        *(w.hpa for w in workloads if w.hpa is not None),
        *scaled_objects,
        *(w.pdb for w in workloads if w.pdb is not None),
        *router_route(epd),
    ]


def tier_hashes(objects: list[JSON]) -> dict[str, str]:
    """The config hash of every Deployment among `objects`, by role."""
    return {
        obj["metadata"]["labels"][ROLE_LABEL]: _template(obj)["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        for obj in objects
        if obj.get("kind") in ("Deployment", "LeaderWorkerSet")
    }


def _template(workload: JSON) -> JSON:
    """The pod template of a Deployment, or of a LeaderWorkerSet's leader (its workers' carry the same hash)."""
    spec = workload["spec"]
    return spec["leaderWorkerTemplate"]["leaderTemplate"] if "leaderWorkerTemplate" in spec else spec["template"]


def _mooncake_master_workload(epd: EPDDeployment) -> Workload:
    """The Mooncake store master the cross-encoder cache needs (one replica: it holds only metadata)."""
    spec = epd.spec
    master = (spec.ecTransfer.mooncake or Mooncake()).master
    container = render_one(
        "mooncake-master-container.yaml.j2",
        image=spec.encoder.image or spec.image,  # the vLLM EPD image ships mooncake_master
        rpc_port=MOONCAKE_MASTER_RPC_PORT,
        metrics_port=MOONCAKE_MASTER_METRICS_PORT,
        resources=resources(master),
    )
    placement = Placement(replicas=1)
    pod = pod_spec(master, [container], [], spec.imagePullSecrets, RUNTIME_DEFAULT_SECCOMP)
    service = render_one(
        "service.yaml.j2",
        **meta(epd, object_name(epd, MOONCAKE_MASTER), MOONCAKE_MASTER),
        type="ClusterIP",
        selector=selector_labels(epd, MOONCAKE_MASTER),
        ports=[
            {"name": "rpc", "port": MOONCAKE_MASTER_RPC_PORT, "targetPort": "rpc", "protocol": "TCP"},
            {"name": "metrics", "port": MOONCAKE_MASTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
        ],
    )
    return workload(epd, MOONCAKE_MASTER, placement, pod, {}, service, pdb=False)
