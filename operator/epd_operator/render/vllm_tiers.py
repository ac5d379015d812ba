"""The vLLM tiers (encoder, prefill, decode or PD): their Deployment, headless Service and pod, and
the encoder's cache janitor beside vLLM when the SharedStorage connector keeps embeddings on disk.

What a vLLM process is started with (its command line) is `vllm.serve_args`; how a tier moves
embeddings and KV is `transfer.tier_transfer`. This module puts them into a pod.
"""

from __future__ import annotations

from ..api.labels import GENERATION_LABEL
from ..api.spec import EPDDeployment, EPDDeploymentSpec
from ..api.tiers import VLLM_PORT, Tier
from .naming import ENCODER, VllmRole, selector_labels
from .plan import RenderPlan
from .pods import (
    JSON,
    RUNTIME_DEFAULT_SECCOMP,
    Workload,
    bytes_quantity,
    meta,
    overlay_container,
    pod_spec,
    resources,
    workload,
)
from .templating import render_one
from .tracing import vllm_tracing_env
from .transfer import EC_CACHE_VOLUME, TierTransfer, container_port, janitor_args
from .vllm import MODELS_DIR, serve_args

# NCCL and torch's shared-memory tensors live in /dev/shm; give each TP rank room for them.
SHM_PER_TP_RANK = 2 * 2**30
# Model load (a hub download on first start) may take long; the startup probe allows 30 minutes. It
# probes every 2 s, and readiness every 2 s after it, so that a new pod (an encoder the HPA just
# added) is Ready within about 2 s of vLLM listening, not up to 15 s (10 s startup + 5 s readiness periods).
STARTUP_PROBE_PERIOD_S = 2
STARTUP_PROBE_FAILURES = 900  # x 2 s
READINESS_PROBE_PERIOD_S = 2
# The Deployment controller calls a rollout stuck after progressDeadlineSeconds (default 600 s); a
# vLLM tier's must outlast the startup probe's budget, plus time to pull a multi-GB image.
IMAGE_PULL_ALLOWANCE_S = 600
VLLM_PROGRESS_DEADLINE_S = STARTUP_PROBE_FAILURES * STARTUP_PROBE_PERIOD_S + IMAGE_PULL_ALLOWANCE_S
# A vLLM pod going away keeps serving this long before SIGTERM, so that every router has seen its
# endpoint turn terminating (EndpointSlice watch) and a decode can still pull the KV of a prefill that
# just answered; then vLLM drains for `spec.drainSeconds`.
PRE_STOP_SECONDS = 10
# After the drain, room for the process to exit before the kubelet's SIGKILL.
EXIT_ALLOWANCE_S = 30
# The user vLLM's upstream image runs as, and so owns the shared cache's files.
VLLM_IMAGE_UID = 0


def vllm_workload(plan: RenderPlan, role: VllmRole) -> Workload:
    epd, spec = plan.epd, plan.epd.spec
    tier, transfer = plan.tier(role).spec, plan.tier(role).transfer
    volumes, mounts = _vllm_volumes(epd, tier, transfer)
    env: list[JSON] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    if spec.model.hfTokenSecret:
        secret = spec.model.hfTokenSecret
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})
    capabilities: JSON = {"drop": ["ALL"]}
    if transfer.add_capabilities:
        capabilities["add"] = transfer.add_capabilities
    containers = [
        overlay_container(
            render_one(
                "vllm-container.yaml.j2",
                image=tier.image or spec.image,
                args=serve_args(epd, role, transfer),
                env=env + transfer.env + vllm_tracing_env(epd, role),
                ports=[container_port("http", VLLM_PORT), *transfer.ports],
                resources=resources(tier),
                mounts=mounts,
                startup_period=STARTUP_PROBE_PERIOD_S,
                startup_failures=STARTUP_PROBE_FAILURES,
                readiness_period=READINESS_PROBE_PERIOD_S,
                pre_stop_seconds=PRE_STOP_SECONDS,
                capabilities=capabilities,
            ),
            tier,
        )
    ]
    if role == ENCODER and spec.ecTransfer.connector == "SharedStorage":
        containers.append(_janitor_container(epd, plan.router_image))
    pod = pod_spec(
        tier,
        containers,
        volumes,
        spec.imagePullSecrets,
        RUNTIME_DEFAULT_SECCOMP,
        termination_grace_seconds=vllm_termination_grace_seconds(spec),
    )
    service = render_one(
        "service.yaml.j2",
        **meta(epd, plan.tier(role).name, role),
        headless=True,
        selector=selector_labels(epd, role),
        ports=[{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}, *transfer.service_ports],
    )
    mounted = {key: plan.config[key] for key in transfer.configmap_keys}
    # Pod labels, not the Deployment's selector (immutable): a new generation rolls the pods.
    return workload(
        epd,
        role,
        tier,
        pod,
        mounted,
        service,
        own_pod_labels={GENERATION_LABEL: plan.generation},
        progress_deadline=VLLM_PROGRESS_DEADLINE_S,
    )


def vllm_termination_grace_seconds(spec: EPDDeploymentSpec) -> int:
    return PRE_STOP_SECONDS + spec.drainSeconds + EXIT_ALLOWANCE_S


def _vllm_volumes(epd: EPDDeployment, tier: Tier, transfer: TierTransfer) -> tuple[list[JSON], list[JSON]]:
    shm = SHM_PER_TP_RANK * tier.ranks_per_pod + transfer.shm_bytes
    volumes: list[JSON] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": bytes_quantity(shm)}}]
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
