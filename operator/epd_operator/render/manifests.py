"""EPDDeployment -> Kubernetes objects: assembles the vLLM tiers, the router and the transfer extras.

Pure: the same spec always gives the same objects in the same order, with no I/O, clock or
randomness, so the controller's server-side apply is a no-op in steady state.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..api.labels import GENERATION_LABEL
from ..api.spec import (
    DEFAULT_ROUTER_IMAGE,
    VLLM_PORT,
    Autoscaling,
    EPDDeployment,
    EPDDeploymentSpec,
    Mooncake,
    MooncakeMaster,
    Placement,
)
from .generation import compatibility_generation
from .lws import multi_node_workload
from .naming import (
    CONFIG_HASH_ANNOTATION,
    ENCODER,
    MOONCAKE_MASTER,
    ROLE_LABEL,
    ROUTER,
    TRANSFER,
    labels,
    object_name,
    router_service_name,
    selector_labels,
    tier_of,
    transfer_configmap_name,
    vllm_roles,
)
from .router_args import ROUTER_HEALTH_PATH, ROUTER_LIVENESS_PATH, ROUTER_METRICS_PORT, router_args
from .templating import render_documents, render_one
from .tracing import vllm_tracing_env
from .transfer import (
    EC_CACHE_VOLUME,
    MOONCAKE_MASTER_METRICS_PORT,
    MOONCAKE_MASTER_RPC_PORT,
    TierTransfer,
    configmap_data,
    container_port,
    janitor_args,
    mooncake_store_config,
    tier_transfer,
)
from .vllm import MODELS_DIR, serve_args

JSON = dict[str, Any]

# NCCL and torch's shared-memory tensors live in /dev/shm; give each TP rank room for them.
SHM_PER_TP_RANK = 2 * 2**30
# Model load (a hub download on first start) may take long; the startup probe allows 30 minutes.
STARTUP_PROBE_FAILURES = 180  # x 10 s
# The Deployment controller calls a rollout stuck after progressDeadlineSeconds (default 600 s); a
# vLLM tier's must outlast the startup probe's budget, plus time to pull a multi-GB image.
IMAGE_PULL_ALLOWANCE_S = 600
VLLM_PROGRESS_DEADLINE_S = STARTUP_PROBE_FAILURES * 10 + IMAGE_PULL_ALLOWANCE_S
# A vLLM pod going away keeps serving this long before SIGTERM, so that every router has seen its
# endpoint turn terminating (EndpointSlice watch) and a decode can still pull the KV of a prefill that
# just answered; then vLLM drains for `spec.drainSeconds`.
PRE_STOP_SECONDS = 10
# After the drain, room for the process to exit before the kubelet's SIGKILL.
EXIT_ALLOWANCE_S = 30
NONROOT_UID = 65532
# The user vLLM's upstream image runs as, and so owns the shared cache's files.
VLLM_IMAGE_UID = 0
RUNTIME_DEFAULT_SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}
# The router's writable scratch (its root filesystem is read-only): TMPDIR, and the directory its
# worker processes share their metrics through (prometheus_client's multiprocess mode).
ROUTER_SCRATCH_VOLUME = "tmp"
ROUTER_SCRATCH_PATH = "/tmp"
ROUTER_SCRATCH_ENV = {
    "TMPDIR": ROUTER_SCRATCH_PATH,
    "PROMETHEUS_MULTIPROC_DIR": ROUTER_SCRATCH_PATH + "/epd-router-metrics",
}
DEFAULT_HPA_METRICS = [
    {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}},
]


@dataclass
class Workload:
    """One Deployment and what belongs to it."""

    deployment: JSON
    service: JSON
    hpa: JSON | None
    pdb: JSON | None


def render(epd: EPDDeployment, *, default_router_image: str = DEFAULT_ROUTER_IMAGE) -> list[JSON]:
    """Every object `epd` becomes: ConfigMap, router RBAC, Services, Deployments, HPAs, PDBs.

    `default_router_image` is the image of the router and janitor when the spec names none; the
    operator passes its own image, so upgrading the operator chart upgrades the data plane with it.
    """
    roles = vllm_roles(epd)
    config = configmap_data(epd, roles)
    image = epd.spec.router.image or default_router_image
    workloads = [multi_node_workload(epd, role, _vllm_workload(epd, role, config, image)) for role in roles]
    workloads.append(_router_workload(epd, image))
    if mooncake_store_config(epd) is not None:
        workloads.append(_mooncake_master_workload(epd))
    return [
        render_one("configmap.yaml.j2", **_meta(epd, transfer_configmap_name(epd), TRANSFER), data=config),
        *render_documents("router-rbac.yaml.j2", **_meta(epd, object_name(epd, ROUTER), ROUTER)),
        *(w.service for w in workloads),
        *(w.deployment for w in workloads),
        *(w.hpa for w in workloads if w.hpa is not None),
        *(w.pdb for w in workloads if w.pdb is not None),
        *_gateway_route(epd),
    ]


def _gateway_route(epd: EPDDeployment) -> list[JSON]:
    """The HTTPRoute from the user's Gateways to the router Service, when asked for."""
    gateway = epd.spec.router.gateway
    if gateway is None:
        return []
    parents = [
        {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": p.name,
            **({"namespace": p.namespace} if p.namespace else {}),
            **({"sectionName": p.sectionName} if p.sectionName else {}),
        }
        for p in gateway.parentRefs
    ]
    matches = [{"path": {"type": "PathPrefix", "value": prefix}} for prefix in gateway.pathPrefixes]
    return [
        render_one(
            "httproute.yaml.j2",
            **_meta(epd, router_service_name(epd), ROUTER),
            parent_refs=parents,
            hostnames=gateway.hostnames,
            matches=matches,
            service=router_service_name(epd),
            port=epd.spec.router.service.port,
        )
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


# ----------------------------------------------------------------------------- shared shapes


def _meta(epd: EPDDeployment, name: str, role: str) -> JSON:
    return {"name": name, "namespace": epd.namespace, "labels": labels(epd, role)}


def config_hash(pod_labels: dict[str, str], pod_spec: JSON, config: dict[str, str]) -> str:
    """A digest of everything a tier's pods run with: their template and the ConfigMap keys they mount."""
    payload = json.dumps(
        {"labels": pod_labels, "spec": pod_spec, "config": config},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _workload(
    epd: EPDDeployment,
    role: str,
    placement: Placement,
    pod: JSON,
    config: dict[str, str],
    service: JSON,
    pdb: bool = True,
    own_pod_labels: dict[str, str] | None = None,
) -> Workload:
    name = object_name(epd, role)
    meta = _meta(epd, name, role)
    autoscaling = placement.autoscaling
    # The user's pod labels and annotations beside ours (the API refuses keys that would replace ours).
    pod_labels = {**placement.podLabels, **meta["labels"], **(own_pod_labels or {})}
    pod_annotations = dict(placement.podAnnotations)
    pod_annotations[CONFIG_HASH_ANNOTATION] = config_hash(pod_labels, {"annotations": pod_annotations, **pod}, config)
    deployment = render_one(
        "deployment.yaml.j2",
        **meta,
        replicas=None if autoscaling else placement.replicas,  # the HPA owns replicas when present
        progress_deadline=VLLM_PROGRESS_DEADLINE_S if role in vllm_roles(epd) else None,
        selector=selector_labels(epd, role),
        pod_labels=pod_labels,
        annotations=pod_annotations,
        pod=pod,
    )
    return Workload(
        deployment=deployment,
        service=service,
        hpa=_hpa(meta, autoscaling) if autoscaling else None,
        pdb=render_one("pdb.yaml.j2", **meta, selector=selector_labels(epd, role)) if pdb else None,
    )


def _hpa(meta: JSON, autoscaling: Autoscaling) -> JSON:
    return render_one(
        "hpa.yaml.j2",
        **meta,
        min_replicas=autoscaling.minReplicas,
        max_replicas=autoscaling.maxReplicas,
        metrics=autoscaling.metrics or DEFAULT_HPA_METRICS,
        behavior=autoscaling.behavior,
    )


def _pod(
    placement: Placement | MooncakeMaster,
    containers: list[JSON],
    volumes: list[JSON],
    image_pull_secrets: list[str],
    security_context: JSON,
    service_account: str | None = None,
    termination_grace_seconds: int | None = None,
) -> JSON:
    """A pod spec: our containers and volumes, then the tier's placement and overlay fields."""
    user_security = getattr(placement, "podSecurityContext", None) or {}
    return render_one(
        "pod.yaml.j2",
        service_account=service_account,
        security_context={**security_context, **user_security},  # the user's fields replace ours one by one
        termination_grace_seconds=termination_grace_seconds,
        containers=containers,
        volumes=volumes + list(getattr(placement, "volumes", [])),
        node_selector=placement.nodeSelector,
        tolerations=placement.tolerations,
        affinity=placement.affinity,
        topology_spread_constraints=list(getattr(placement, "topologySpreadConstraints", [])),
        priority_class_name=placement.priorityClassName,
        runtime_class_name=getattr(placement, "runtimeClassName", None),
        scheduler_name=getattr(placement, "schedulerName", None),
        image_pull_secrets=[{"name": secret} for secret in image_pull_secrets],
    )


def _overlay_container(container: JSON, placement: Placement) -> JSON:
    """The tier's env, envFrom, volumeMounts and securityContext on its main container (vLLM or router).

    A user env var named like one of ours replaces ours in place: server-side apply refuses a list
    with two entries of one name. Volume names and mount paths cannot collide (the API refuses them).
    """
    env = list(container.get("env", []))
    index = {var["name"]: i for i, var in enumerate(env)}
    for var in _env(placement):
        if var["name"] in index:
            env[index[var["name"]]] = var
        else:
            index[var["name"]] = len(env)
            env.append(var)
    if env:
        container["env"] = env
    if placement.envFrom:
        container["envFrom"] = list(placement.envFrom)
    if placement.volumeMounts:
        container["volumeMounts"] = [*container.get("volumeMounts", []), *placement.volumeMounts]
    if placement.securityContext:
        container["securityContext"] = {**container.get("securityContext", {}), **placement.securityContext}
    return container


def _resources(placement: Placement | MooncakeMaster) -> JSON:
    return {key: value for key, value in placement.resources.model_dump(mode="json").items() if value}


def _env(placement: Placement) -> list[JSON]:
    return [var.model_dump(mode="json", exclude_none=True) for var in placement.env]


def _bytes_quantity(size: int) -> str:
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{suffix}"
    return str(size)


# ----------------------------------------------------------------------------- vLLM tiers


def _vllm_workload(epd: EPDDeployment, role: str, config: dict[str, str], router_image: str) -> Workload:
    spec = epd.spec
    tier = tier_of(epd, role)
    transfer = tier_transfer(epd, role)
    volumes, mounts = _vllm_volumes(epd, role, transfer)
    env: list[JSON] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    if spec.model.hfTokenSecret:
        secret = spec.model.hfTokenSecret
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})
    capabilities: JSON = {"drop": ["ALL"]}
    if transfer.add_capabilities:
        capabilities["add"] = transfer.add_capabilities
    containers = [
        _overlay_container(
            render_one(
                "vllm-container.yaml.j2",
                image=tier.image or spec.image,
                args=serve_args(epd, role, transfer),
                env=env + transfer.env + vllm_tracing_env(epd, role),
                ports=[container_port("http", VLLM_PORT), *transfer.ports],
                resources=_resources(tier),
                mounts=mounts,
                startup_failures=STARTUP_PROBE_FAILURES,
                pre_stop_seconds=PRE_STOP_SECONDS,
                capabilities=capabilities,
            ),
            tier,
        )
    ]
    if role == ENCODER and spec.ecTransfer.connector == "SharedStorage":
        containers.append(_janitor_container(epd, router_image))
    pod = _pod(
        tier,
        containers,
        volumes,
        spec.imagePullSecrets,
        RUNTIME_DEFAULT_SECCOMP,
        termination_grace_seconds=vllm_termination_grace_seconds(spec),
    )
    name = object_name(epd, role)
    service = render_one(
        "service.yaml.j2",
        **_meta(epd, name, role),
        annotations={},
        headless=True,
        selector=selector_labels(epd, role),
        ports=[{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}, *transfer.service_ports],
    )
    mounted = {key: config[key] for key in transfer.configmap_keys}
    # Pod labels, not the Deployment's selector (immutable): a new generation rolls the pods.
    return _workload(
        epd, role, tier, pod, mounted, service, own_pod_labels={GENERATION_LABEL: compatibility_generation(epd)}
    )


def vllm_termination_grace_seconds(spec: EPDDeploymentSpec) -> int:
    return PRE_STOP_SECONDS + spec.drainSeconds + EXIT_ALLOWANCE_S


def _vllm_volumes(epd: EPDDeployment, role: str, transfer: TierTransfer) -> tuple[list[JSON], list[JSON]]:
    tier = tier_of(epd, role)
    shm = SHM_PER_TP_RANK * tier.ranks_per_pod + transfer.shm_bytes
    volumes: list[JSON] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _bytes_quantity(shm)}}]
    mounts: list[JSON] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    source = epd.spec.model.source
    if source is not None:
        volumes.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": source.pvc.claimName, "readOnly": True}}
        )
        mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
    return volumes + transfer.volumes, mounts + transfer.mounts


def _janitor_container(epd: EPDDeployment, router_image: str) -> JSON:
    storage = epd.spec.ecTransfer.sharedStorage
    assert storage is not None
    return render_one(
        "janitor-container.yaml.j2",
        image=router_image,  # `epdctl janitor` ships in the operator image, beside the router
        args=janitor_args(storage),
        mounts=[{"name": EC_CACHE_VOLUME, "mountPath": storage.path}],
        run_as_user=VLLM_IMAGE_UID,
    )


# ----------------------------------------------------------------------------- router


def _router_workload(epd: EPDDeployment, router_image: str) -> Workload:
    router = epd.spec.router
    container = _overlay_container(
        render_one(
            "router-container.yaml.j2",
            image=router_image,
            args=router_args(epd),
            resources=_resources(router),
            env=_router_env(router),
            health_path=ROUTER_HEALTH_PATH,
            liveness_path=ROUTER_LIVENESS_PATH,
            metrics_port=ROUTER_METRICS_PORT,
            scratch_volume=ROUTER_SCRATCH_VOLUME,
            scratch_path=ROUTER_SCRATCH_PATH,
        ),
        router,
    )  # envFrom, volumeMounts, securityContext (its env, already in, is replaced in place)
    security = {"runAsNonRoot": True, "runAsUser": NONROOT_UID, "runAsGroup": NONROOT_UID, **RUNTIME_DEFAULT_SECCOMP}
    scratch = {"name": ROUTER_SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}
    pod = _pod(
        router, [container], [scratch], epd.spec.imagePullSecrets, security, service_account=object_name(epd, ROUTER)
    )
    service = render_one(
        "service.yaml.j2",
        **_meta(epd, router_service_name(epd), ROUTER),
        annotations=router.service.annotations,
        headless=False,
        type=router.service.type,
        selector=selector_labels(epd, ROUTER),
        ports=[{"name": "http", "port": router.service.port, "targetPort": "http", "protocol": "TCP"}],
    )
    return _workload(epd, ROUTER, router, pod, {}, service)


def _router_env(router: Placement) -> list[JSON]:
    """The scratch variables, unless the spec sets them itself, then the spec's env."""
    own = _env(router)
    names = {var["name"] for var in own}
    return [{"name": k, "value": v} for k, v in ROUTER_SCRATCH_ENV.items() if k not in names] + own


# ----------------------------------------------------------------------------- Mooncake master


def _mooncake_master_workload(epd: EPDDeployment) -> Workload:
    """The Mooncake store master the cross-encoder cache needs (one replica: it holds only metadata)."""
    spec = epd.spec
    master = (spec.ecTransfer.mooncake or Mooncake()).master
    container = render_one(
        "mooncake-master-container.yaml.j2",
        image=spec.encoder.image or spec.image,  # the vLLM EPD image ships mooncake_master
        rpc_port=MOONCAKE_MASTER_RPC_PORT,
        metrics_port=MOONCAKE_MASTER_METRICS_PORT,
        resources=_resources(master),
    )
    placement = Placement(replicas=1)
    pod = _pod(master, [container], [], spec.imagePullSecrets, RUNTIME_DEFAULT_SECCOMP)
    service = render_one(
        "service.yaml.j2",
        **_meta(epd, object_name(epd, MOONCAKE_MASTER), MOONCAKE_MASTER),
        annotations={},
        headless=False,
        type="ClusterIP",
        selector=selector_labels(epd, MOONCAKE_MASTER),
        ports=[
            {"name": "rpc", "port": MOONCAKE_MASTER_RPC_PORT, "targetPort": "rpc", "protocol": "TCP"},
            {"name": "metrics", "port": MOONCAKE_MASTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
        ],
    )
    return _workload(epd, MOONCAKE_MASTER, placement, pod, {}, service, pdb=False)
