"""The `EPDDeployment` spec (serving.epd.dev/v1alpha1) as pydantic models.

These models are the API: the CRD's schema is generated from them (`epd_operator.api.crd`), the
renderer reads them, and the README documents their fields. Every model forbids unknown fields, so
a typo in a spec is refused with its path instead of being dropped silently. Kubernetes types we pass
through to pods and HPAs (affinity, tolerations, volumes, security contexts, HPA metrics, env
`valueFrom`, ...) carry the upstream Kubernetes schemas, generated in `kube_schemas`, so a typo inside
them is refused too, by `epdctl validate` and by the API server alike.

Over 400 lines on purpose: the whole API in one file, in the order the README reference reads it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from . import kube_schemas
from .quantity import Quantity

GROUP: Final = "serving.epd.dev"
VERSION: Final = "v1alpha1"
# Spelled out, not an f-string, so that type checkers see the literal the model's apiVersion field takes.
API_VERSION: Final = "serving.epd.dev/v1alpha1"
assert f"{GROUP}/{VERSION}" == API_VERSION
KIND: Final = "EPDDeployment"
PLURAL = "epddeployments"
SHORT_NAME = "epd"

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
DEFAULT_ROUTER_IMAGE = "ghcr.io/epd-operator/epd-operator:0.1.0"
VLLM_PORT = 8000

# A free-form Kubernetes object kept as is (the status, which only the operator writes).
KubeObject = dict[str, Any]

# Labels and annotations the operator puts on every pod it renders: the router discovers its backends
# and Deployments select their pods by these, so a tier's `podLabels`/`podAnnotations` may not set them.
# Volume names and mount paths the operator renders into some pod (the shared-storage path aside,
# which the spec chooses): a tier's `volumes`/`volumeMounts` may not reuse them. A render test checks
# this list covers everything rendered.
OPERATOR_VOLUMES = ("dshm", "models", "ec-cache", "mooncake-store", "tmp")
OPERATOR_MOUNT_PATHS = ("/dev/shm", "/models", "/etc/epd/mooncake", "/tmp")
# Bounds on the pass-through lists: they keep the CEL rules that walk them within the API server's cost limits.
MAX_LIST_ITEMS = 64
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def _kube_check(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def check(value: dict[str, Any]) -> dict[str, Any]:
        problems = kube_schemas.validate(name, value)
        if problems:
            raise PydanticCustomError(
                "kube_schema",
                "{summary}",
                {"summary": "; ".join(f"{p or '.'}: {m}" for p, m in problems), "problems": problems},
            )
        return value

    return check


@dataclass(frozen=True)
class KubeType:
    """An upstream Kubernetes type (`"Affinity"`, `"MetricSpec"`, ...) on a `dict[str, Any]` field: its
    generated schema in the CRD, the same schema checked in Python with a path for every problem, and
    its name in the API reference."""

    name: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(_kube_check(self.name), handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return copy.deepcopy(kube_schemas.schema(self.name))  # a cached document: the caller may add to it


# The upstream types fields embed (type aliases a type checker reads as plain dicts).
Affinity = Annotated[KubeObject, KubeType("Affinity")]
EnvFromSource = Annotated[KubeObject, KubeType("EnvFromSource")]
EnvVarSource = Annotated[KubeObject, KubeType("EnvVarSource")]
HorizontalPodAutoscalerBehavior = Annotated[KubeObject, KubeType("HorizontalPodAutoscalerBehavior")]
MetricSpec = Annotated[KubeObject, KubeType("MetricSpec")]
PodSecurityContext = Annotated[KubeObject, KubeType("PodSecurityContext")]
SecurityContext = Annotated[KubeObject, KubeType("SecurityContext")]
Toleration = Annotated[KubeObject, KubeType("Toleration")]
TopologySpreadConstraint = Annotated[KubeObject, KubeType("TopologySpreadConstraint")]
Volume = Annotated[KubeObject, KubeType("Volume")]
VolumeMount = Annotated[KubeObject, KubeType("VolumeMount")]


LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]


class Strict(BaseModel):
    # strict: no coercion (`replicas: "2"`), because the CRD's schema refuses it too and
    # `epdctl validate` must not pass what `kubectl apply` rejects.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, strict=True)


# ----------------------------------------------------------------------------- model


class PVCSource(Strict):
    claimName: str = Field(min_length=1, description="PersistentVolumeClaim holding the model weights.")
    subPath: str | None = Field(None, description="Directory inside the claim where the model lives.")


class ModelSource(Strict):
    pvc: PVCSource = Field(description="Load the model from a PVC instead of downloading it from the hub.")


class SecretKeyRef(Strict):
    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key inside the Secret.")


class ModelSpec(Strict):
    name: str = Field(min_length=1, description="What `vllm serve` loads: a hub id, or a path when `source` is set.")
    servedModelName: str | None = Field(
        None, min_length=1, description="Name clients use in `model` (`--served-model-name`)."
    )
    source: ModelSource | None = Field(None, description="Where the weights come from; default: hub download.")
    hfTokenSecret: SecretKeyRef | None = Field(
        None, description="Secret with a Hugging Face token, exposed as HF_TOKEN."
    )
    maxModelLen: int | None = Field(None, ge=1, description="`--max-model-len` for every tier.")


# ----------------------------------------------------------------------------- tiers


class EnvVar(Strict):
    name: str = Field(min_length=1, description="Variable name.")
    value: str | None = Field(None, description="Literal value.")
    valueFrom: EnvVarSource | None = Field(
        None, description="core/v1 EnvVarSource (`secretKeyRef`, `configMapKeyRef`, `fieldRef`, ...)."
    )


class Resources(Strict):
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Container limits, e.g. `nvidia.com/gpu: 1`.")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="Container requests.")


class Autoscaling(Strict):
    minReplicas: int = Field(1, ge=1, description="Lower bound for the HPA.")
    maxReplicas: int = Field(ge=1, description="Upper bound for the HPA.")
    metrics: list[MetricSpec] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="autoscaling/v2 MetricSpecs. Empty: 70% average CPU utilisation, which needs the tier to "
        "request CPU (`resources.requests.cpu`); without one, `metrics` is required.",
    )
    behavior: HorizontalPodAutoscalerBehavior | None = Field(
        None, description="autoscaling/v2 HorizontalPodAutoscalerBehavior."
    )


class Placement(Strict):
    """Where and how a tier's pods run: fields shared by the vLLM tiers and the router."""

    replicas: int = Field(1, ge=0, description="Pod count; ignored while `autoscaling` is set (the HPA owns it).")
    image: str | None = Field(
        None, min_length=1, description="Container image; default: `spec.image` (router: the operator image)."
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="Container resources; vLLM tiers on GPUs need `limits: {nvidia.com/gpu: N}` with N = "
        "tensorParallelSize x pipelineParallelSize x dataParallelSize / nodesPerReplica.",
    )
    extraArgs: list[str] = Field(default_factory=list, description="Appended verbatim to the container's arguments.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables.")
    nodeSelector: dict[str, str] = Field(
        default_factory=dict, description="Pod nodeSelector, e.g. a GPU product label."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS, description="Pod tolerations, e.g. for tainted GPU nodes."
    )
    affinity: Affinity | None = Field(None, description="Pod affinity (node, pod, anti-affinity).")
    topologySpreadConstraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS, description="Pod topologySpreadConstraints."
    )
    podLabels: dict[str, LabelValue] = Field(
        default_factory=dict,
        description="Extra pod labels (Kueue queues, service meshes); the operator's own "
        "labels (`app.kubernetes.io/*`, `serving.epd.dev/role`) are refused.",
    )
    podAnnotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    priorityClassName: str | None = Field(None, min_length=1, description="Pod priorityClassName.")
    runtimeClassName: str | None = Field(None, min_length=1, description="Pod runtimeClassName, e.g. `nvidia`.")
    schedulerName: str | None = Field(None, min_length=1, description="Pod schedulerName; default: the cluster's.")
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Extra pod volumes; names the operator uses ("
        + ", ".join(f"`{v}`" for v in OPERATOR_VOLUMES)
        + ") are refused.",
    )
    volumeMounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Extra mounts in the main container (vLLM or router) of a volume of `volumes` (or of one the "
        "operator renders); paths the operator mounts ("
        + ", ".join(f"`{p}`" for p in OPERATOR_MOUNT_PATHS)
        + ", the shared-storage path) are refused.",
    )
    envFrom: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="Environment from ConfigMaps/Secrets for the main container.",
    )
    podSecurityContext: PodSecurityContext | None = Field(
        None,
        description="Pod securityContext; its fields replace the operator's (`seccompProfile: RuntimeDefault`, "
        "the router's non-root user) one by one.",
    )
    securityContext: SecurityContext | None = Field(
        None,
        description="Main container securityContext; its fields replace the operator's one by one "
        "(`capabilities` as a whole).",
    )
    autoscaling: Autoscaling | None = Field(
        None, description="Present: an HPA scales this tier and the operator never writes its replicas."
    )


# An encode-only instance allocates no KV cache, so it needs a fraction of the GPU a consumer does
# (vLLM's EPD examples run encoders at 0.01-0.35); vLLM's own default (0.9) would starve co-located pods.
ENCODER_GPU_MEMORY_UTILIZATION = 0.35
# Long enough for a typical streamed answer to finish while its pod is replaced.
DEFAULT_DRAIN_SECONDS = 120


class Tier(Placement):
    tensorParallelSize: int = Field(1, ge=1, description="`--tensor-parallel-size`.")
    pipelineParallelSize: int = Field(1, ge=1, description="`--pipeline-parallel-size`.")
    gpuMemoryUtilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description=f"`--gpu-memory-utilization`; default per role: encoder "
        f"{ENCODER_GPU_MEMORY_UTILIZATION}, prefill and decode vLLM's own (0.9).",
    )
    maxNumBatchedTokens: int | None = Field(
        None, ge=1, description="`--max-num-batched-tokens`; default per role (encoder: 114688)."
    )

    @property
    def ranks_per_pod(self) -> int:
        """GPU worker processes in one pod (and so GPUs it needs)."""
        return self.tensorParallelSize * self.pipelineParallelSize


# vLLM's default port for the torch.distributed rendezvous of a multi-node replica (`--master-port`).
MULTI_NODE_MASTER_PORT = 29501
MAX_DATA_PARALLEL_SIZE = 64


class ConsumerTier(Tier):
    """A prefill or decode tier: these may run data-parallel engines and span several nodes."""

    dataParallelSize: int = Field(
        1,
        ge=1,
        le=MAX_DATA_PARALLEL_SIZE,
        description="`--data-parallel-size`: engines per pod, each on tensorParallelSize x pipelineParallelSize GPUs, "
        "behind one API server; the router pins every request to one rank (`X-data-parallel-rank`), "
        "balancing ranks by load. GPUs per pod: tensorParallelSize x pipelineParallelSize x dataParallelSize.",
    )
    expertParallel: bool = Field(
        False,
        description="`--enable-expert-parallel`: MoE experts sharded across the "
        "dataParallelSize x tensorParallelSize ranks instead of replicated.",
    )
    nodesPerReplica: int = Field(
        1,
        ge=1,
        le=64,
        description="Nodes one replica spans (`--nnodes`): above 1 the tier is a LeaderWorkerSet "
        "(leaderworkerset.x-k8s.io/v1, which must be installed) whose leader runs the API server and whose "
        "workers run headless; tensorParallelSize x pipelineParallelSize is split evenly across the nodes. "
        f"The replica's rendezvous uses port {MULTI_NODE_MASTER_PORT} on the leader.",
    )

    @property
    def ranks_per_pod(self) -> int:
        return self.tensorParallelSize * self.pipelineParallelSize * self.dataParallelSize // self.nodesPerReplica


class EncoderCudaGraphs(Strict):
    """Encoder CUDA graphs (vLLM 0.32 `cudagraph_mm_encoder`): captured per token budget, replayed for batches that fit."""

    tokenBudgets: list[int] = Field(
        default_factory=list,
        max_length=MAX_LIST_ITEMS,
        description="`encoder_cudagraph_token_budgets`: the encoder-token counts graphs are "
        "captured for; empty: vLLM's own choice.",
    )
    maxVisionItemsPerBatch: int | None = Field(
        None, ge=0, description="`encoder_cudagraph_max_vision_items_per_batch` (0: automatic)."
    )
    maxFramesPerBatch: int | None = Field(None, ge=1, description="`encoder_cudagraph_max_frames_per_batch` (video).")


class EncoderTier(Tier):
    cudaGraphs: EncoderCudaGraphs | None = Field(
        None,
        description="Capture encoder CUDA graphs (`--compilation-config` with `cudagraph_mm_encoder`); absent: vLLM's "
        "default for encoders (no encoder graphs).",
    )
    preprocessing: Literal["cpu", "gpu"] = Field(
        "cpu",
        description="Where HF media preprocessing runs: `gpu` passes tensors through shared memory "
        "(`--mm-tensor-ipc torch_shm`) so vLLM preprocesses on the encoder's GPU (`--mm-processor-device "
        "auto`, only allowed on an encode-only instance).",
    )
    mmEncoderTPMode: Literal["weights", "data"] | None = Field(
        None,
        description="`--mm-encoder-tp-mode`: shard the vision encoder's weights across TP ranks (`weights`, vLLM's "
        "default) or run a full copy per rank on a share of the items (`data`).",
    )


# ----------------------------------------------------------------------------- transfer


class SharedStorage(Strict):
    claimName: str = Field(min_length=1, description="ReadWriteMany PVC mounted by the encoder and every consumer.")
    path: str = Field(
        "/ec-cache", pattern=r"^/.*", max_length=4096, description="Mount path; the connector's `shared_storage_path`."
    )
    maxSize: Quantity | None = Field(
        None,
        description="Size bound for the cache janitor: while the cache is larger, it deletes the oldest entries "
        "older than `ttlSeconds` (never younger ones). Absent: entries go when older than `ttlSeconds`.",
    )
    ttlSeconds: int | None = Field(
        600,
        ge=1,
        description="Guaranteed minimum lifetime of a cached embedding (age counts from its last write): "
        "no entry younger is deleted. Without `maxSize`, older entries are deleted.",
    )


def _master_resources() -> Resources:
    return Resources(requests={"cpu": "500m", "memory": "1Gi"}, limits={"memory": "2Gi"})


class MooncakeMaster(Strict):
    """Where the Mooncake master runs (the cross-encoder cache's metadata service)."""

    resources: Resources = Field(
        default_factory=_master_resources,
        description="Master container resources; default: requests `cpu: 500m`, `memory: 1Gi`, limit `memory: 2Gi`.",
        json_schema_extra={"default": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
    )
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS, description="Pod tolerations."
    )
    affinity: Affinity | None = Field(None, description="Pod affinity.")
    priorityClassName: str | None = Field(None, min_length=1, description="Pod priorityClassName.")


class Mooncake(Strict):
    protocol: Literal["tcp", "rdma"] = Field(
        "tcp", description="`mooncake_protocol`; producer and consumers must match."
    )
    ecPort: int = Field(
        14579,
        ge=1024,
        le=65000,
        description="Consumer control port (`ec_port`): data-parallel rank d, "
        "tensor-parallel rank r of the EC consumer listens on ecPort + d x tensorParallelSize + r.",
    )
    crossEncoderCache: bool = Field(
        False, description="Share embeddings across encoders through a Mooncake store (adds a master)."
    )
    master: MooncakeMaster = Field(
        default_factory=MooncakeMaster,
        description="The Mooncake master's resources and placement (with `crossEncoderCache`).",
    )


class CPUConnector(Strict):
    bytes: Quantity = Field(description="`ec_cpu_bytes`: the shared-memory region; /dev/shm is sized to hold it.")
    nixl: bool = Field(True, description="`ec_enable_nixl`: consumers pull over NIXL.")
    sideChannelPort: int = Field(5601, ge=1024, le=65535, description="`VLLM_EC_SIDE_CHANNEL_PORT` on the encoder.")


class ECTransfer(Strict):
    connector: Literal["SharedStorage", "Mooncake", "CPU"] = Field(
        description="SharedStorage = ECExampleConnector, Mooncake = ECMooncakeConnector, CPU = ECCPUConnector."
    )
    sharedStorage: SharedStorage | None = Field(
        None, description="SharedStorage settings; required with that connector."
    )
    mooncake: Mooncake | None = Field(
        None, description="Mooncake settings; optional with that connector (defaults apply)."
    )
    cpu: CPUConnector | None = Field(None, description="CPU connector settings; required with that connector.")


class Nixl(Strict):
    ucxTls: str = Field("all", min_length=1, description="`UCX_TLS`.")
    ucxNetDevices: str = Field("all", min_length=1, description="`UCX_NET_DEVICES`.")
    sideChannelPort: int = Field(
        5600,
        ge=1024,
        le=65535,
        description="`VLLM_NIXL_SIDE_CHANNEL_PORT`; data-parallel "
        "rank d listens on sideChannelPort + d (all declared on the pod).",
    )
    bufferDevice: Literal["cuda", "cpu"] | None = Field(
        None, description="`kv_buffer_device`; default: the platform's."
    )


class KVTransfer(Strict):
    connector: Literal["Nixl"] = Field(
        "Nixl", description="P->D KV transfer; NixlConnector (what vLLM's EPD proxy drives)."
    )
    nixl: Nixl = Field(default_factory=Nixl, description="NixlConnector settings (UCX transports, side channel).")


# ----------------------------------------------------------------------------- router


class RouterService(Strict):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: int = Field(8000, ge=1, le=65535, description="Port clients send OpenAI-compatible requests to.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Service annotations, e.g. for a cloud load balancer."
    )


def _router_resources() -> Resources:
    return Resources(requests={"cpu": "500m", "memory": "256Mi"}, limits={"memory": "1Gi"})


class RouterTrust(Strict):
    """What the router may take from clients it does not otherwise trust. Everything is off by default:
    transfer parameters are always the router's own, and none of these widen that."""

    clientEmbeds: bool = Field(
        False,
        description="Accept client `*_embeds` content parts and `prompt_embeds` (a "
        "metadata-only part whose embedding is absent can kill a vLLM consumer engine).",
    )
    clientUUIDs: bool = Field(
        False,
        description="Honour a client's media `uuid` as the item's identity (it keys the "
        "encoder cache and the router's reuse: one client could alias another's media).",
    )
    immutableMediaURLs: bool = Field(
        False,
        description="Media URLs never change content, so an http(s) URL may identify "
        "its item for reuse; otherwise only content-addressed items (data: URLs, inline "
        "bytes) are reused.",
    )


class GatewayParent(Strict):
    name: str = Field(min_length=1, max_length=253, description="The Gateway's name.")
    namespace: str | None = Field(
        None, min_length=1, max_length=63, description="The Gateway's namespace; default: the EPDDeployment's."
    )
    sectionName: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="A listener of that Gateway (e.g. `https`); default: every listener.",
    )


class RouterGateway(Strict):
    """An HTTPRoute (Gateway API, standard channel) attaching the router Service to user-named Gateways."""

    parentRefs: list[GatewayParent] = Field(min_length=1, max_length=32, description="Gateways the route attaches to.")
    hostnames: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Host names the route answers (e.g. `vl.example.com`); empty: any.",
    )
    pathPrefixes: list[str] = Field(
        default_factory=lambda: ["/v1"],
        min_length=1,
        max_length=16,
        description="Path prefixes sent to the router; default `/v1` (the OpenAI-compatible API).",
        json_schema_extra={"default": ["/v1"]},
    )


class Router(Placement):
    replicas: int = Field(2, ge=0, description="Router pods; ignored while `autoscaling` is set.")
    resources: Resources = Field(
        default_factory=_router_resources,
        description="Router container resources; default: requests `cpu: 500m`, `memory: 256Mi`, limit "
        "`memory: 1Gi` (Burstable). The router runs one worker process per CPU of its limit, else "
        "its request.",
        json_schema_extra={"default": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}},
    )
    service: RouterService = Field(
        default_factory=RouterService, description="The Service clients call: the deployment's one endpoint."
    )
    encoderPolicy: Literal["cache-aware", "round-robin", "least-loaded"] = Field(
        "cache-aware",
        description="Which encoder gets an image: `cache-aware` hashes the item so repeats land where "
        "it was encoded (bounded load), `least-loaded` picks the fewest in-flight requests.",
    )
    pdPolicy: Literal["least-loaded", "prefix-aware", "round-robin"] = Field(
        "least-loaded",
        description="Which prefill/decode instance gets a request: `prefix-aware` hashes the prompt's "
        "prefix for KV prefix-cache hits (bounded load), `least-loaded` picks the fewest in-flight.",
    )
    gateway: RouterGateway | None = Field(
        None,
        description="Also expose the router through a Gateway API "
        "HTTPRoute (needs the Gateway API CRDs in the cluster).",
    )
    trust: RouterTrust = Field(
        default_factory=RouterTrust,
        description="What the router may take from clients (all off by default; see the README's router trust model).",
    )


# ----------------------------------------------------------------------------- traces


class Tracing(Strict):
    """OpenTelemetry traces: the router and every vLLM tier export their spans to one OTLP/HTTP endpoint,
    and the router passes each request's trace context to the tiers, so one trace shows every stage."""

    otlpEndpoint: str = Field(
        min_length=1,
        max_length=2048,
        pattern=r"^https?://[^\s]+$",
        description="OTLP/HTTP (protobuf) traces URL, e.g. `http://otel-collector.observability:4318/v1/traces`: "
        "`--otlp-traces-endpoint` of the router and of every vLLM tier (which are told to "
        "speak OTLP/HTTP, not their default gRPC).",
    )
    sampleRatio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of requests traced when the client sent no sampling "
        "decision (`traceparent`); the vLLM tiers follow the router's decision.",
    )


# ----------------------------------------------------------------------------- top level


class EPDDeploymentSpec(Strict):
    model: ModelSpec = Field(description="The model every tier serves.")
    image: str = Field(DEFAULT_VLLM_IMAGE, min_length=1, description="Default image for every vLLM tier.")
    imagePullSecrets: list[str] = Field(default_factory=list, description="Secret names for pulling images.")
    encoder: EncoderTier = Field(description="The encoder tier (`--mm-encoder-only`, EC producer).")
    prefill: ConsumerTier | None = Field(None, description="Present: E/P/D (prefill hands KV to decode); absent: E+PD.")
    decode: ConsumerTier = Field(description="Decode tier: the combined PD tier in E+PD, D in E/P/D.")
    ecTransfer: ECTransfer = Field(
        description="How the encoder's embeddings reach the prefill/decode tiers (the EC connector)."
    )
    kvTransfer: KVTransfer | None = Field(None, description="P->D KV transfer; E/P/D only (default there: Nixl).")
    router: Router = Field(
        default_factory=Router, description="The EPD router (endpoint picker) in front of the tiers."
    )
    tracing: Tracing | None = Field(
        None, description="OpenTelemetry traces from the router and every vLLM tier; absent: off."
    )
    drainSeconds: int = Field(
        DEFAULT_DRAIN_SECONDS,
        ge=0,
        le=3600,
        description="How long a vLLM pod that is being replaced or scaled down keeps finishing its in-flight requests "
        "(`--shutdown-timeout`; 0: abort them). The router stops sending it new work first, and the pod's "
        "terminationGracePeriodSeconds covers the wait.",
    )

    @property
    def topology(self) -> str:
        return "E/P/D" if self.prefill is not None else "E+PD"


class ObjectMeta(BaseModel):
    # Server-populated metadata passes through; only what the operator reads is typed.
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: str | None = None
    generation: int | None = None


class EPDDeployment(Strict):
    apiVersion: Literal["serving.epd.dev/v1alpha1"] = API_VERSION
    kind: Literal["EPDDeployment"] = KIND
    metadata: ObjectMeta
    spec: EPDDeploymentSpec
    status: KubeObject | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"
