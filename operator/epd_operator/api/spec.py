"""The `EPDDeployment` spec (serving.epd.dev/v1alpha1) as pydantic models.

These models are the API: the CRD's schema is generated from them (`epd_operator.api.crd`), the
renderer reads them, and the README documents their fields. Every model forbids unknown fields, so
a typo in a spec is refused with its path instead of being dropped silently. Kubernetes-typed blobs
that we pass through untouched (affinity, HPA metrics, env `valueFrom`) keep unknown fields, as the
Kubernetes schemas validate them where they land.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from .quantity import Quantity

GROUP = "serving.epd.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "EPDDeployment"
PLURAL = "epddeployments"
SHORT_NAME = "epd"

DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
DEFAULT_ROUTER_IMAGE = "ghcr.io/epd-operator/epd-operator:0.1.0"
VLLM_PORT = 8000

# A free-form Kubernetes object kept as is (validated by Kubernetes where it is used).
KubeObject = dict[str, Any]
PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}


class Strict(BaseModel):
    # strict: no coercion (`replicas: "2"`), because the CRD's schema refuses it too and
    # `epdctl validate` must not pass what `kubectl apply` rejects.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_default=True, strict=True)


# ----------------------------------------------------------------------------- model


class PVCSource(Strict):
    claimName: str = Field(min_length=1, description="PersistentVolumeClaim holding the model weights.")
    subPath: Optional[str] = Field(None, description="Directory inside the claim where the model lives.")


class ModelSource(Strict):
    pvc: PVCSource = Field(description="Load the model from a PVC instead of downloading it from the hub.")


class SecretKeyRef(Strict):
    name: str = Field(min_length=1, description="Secret name.")
    key: str = Field("token", min_length=1, description="Key inside the Secret.")


class ModelSpec(Strict):
    name: str = Field(min_length=1, description="What `vllm serve` loads: a hub id, or a path when `source` is set.")
    servedModelName: Optional[str] = Field(None, min_length=1, description="Name clients use in `model` (`--served-model-name`).")
    source: Optional[ModelSource] = Field(None, description="Where the weights come from; default: hub download.")
    hfTokenSecret: Optional[SecretKeyRef] = Field(None, description="Secret with a Hugging Face token, exposed as HF_TOKEN.")
    maxModelLen: Optional[int] = Field(None, ge=1, description="`--max-model-len` for every tier.")


# ----------------------------------------------------------------------------- tiers


class Toleration(Strict):
    key: Optional[str] = Field(None, description="Taint key to tolerate; empty with `operator: Exists` tolerates every taint.")
    operator: Optional[Literal["Exists", "Equal"]] = Field(None, description="`Equal` (Kubernetes' default) compares `value`; `Exists` ignores it.")
    value: Optional[str] = Field(None, description="Taint value to match with `operator: Equal`.")
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(
        None, description="Taint effect to tolerate; empty: every effect.")
    tolerationSeconds: Optional[int] = Field(None, description="With `NoExecute`: how long the pod stays after the taint appears.")


class EnvVar(Strict):
    name: str = Field(min_length=1, description="Variable name.")
    value: Optional[str] = Field(None, description="Literal value.")
    valueFrom: Optional[KubeObject] = Field(
        None, description="core/v1 EnvVarSource (`secretKeyRef`, `configMapKeyRef`, `fieldRef`, ...), passed through.",
        json_schema_extra=PRESERVE)


class Resources(Strict):
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Container limits, e.g. `nvidia.com/gpu: 1`.")
    requests: dict[str, Quantity] = Field(default_factory=dict, description="Container requests.")


class Autoscaling(Strict):
    minReplicas: int = Field(1, ge=1, description="Lower bound for the HPA.")
    maxReplicas: int = Field(ge=1, description="Upper bound for the HPA.")
    metrics: list[KubeObject] = Field(
        default_factory=list,
        description="autoscaling/v2 MetricSpecs; default: 70% average CPU utilisation.",
        json_schema_extra={"items": PRESERVE},
    )
    behavior: Optional[KubeObject] = Field(None, description="autoscaling/v2 HorizontalPodAutoscalerBehavior.",
                                           json_schema_extra=PRESERVE)


class Placement(Strict):
    """Where and how a tier's pods run: fields shared by the vLLM tiers and the router."""

    replicas: int = Field(1, ge=0, description="Pod count; ignored while `autoscaling` is set (the HPA owns it).")
    image: Optional[str] = Field(None, min_length=1, description="Container image; default: `spec.image` (router: the operator image).")
    resources: Resources = Field(default_factory=Resources, description="Container resources; vLLM tiers on GPUs need `limits: {nvidia.com/gpu: N}` with N = tensorParallelSize.")
    extraArgs: list[str] = Field(default_factory=list, description="Appended verbatim to the container's arguments.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Pod nodeSelector, e.g. a GPU product label.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Pod tolerations, e.g. for tainted GPU nodes.")
    affinity: Optional[KubeObject] = Field(None, description="core/v1 Affinity for the pods, passed through.",
                                           json_schema_extra=PRESERVE)
    autoscaling: Optional[Autoscaling] = Field(None, description="Present: an HPA scales this tier and the operator never writes its replicas.")


class Tier(Placement):
    tensorParallelSize: int = Field(1, ge=1, description="`--tensor-parallel-size`.")
    gpuMemoryUtilization: Optional[float] = Field(None, gt=0, le=1, description="`--gpu-memory-utilization`; default per role.")
    maxNumBatchedTokens: Optional[int] = Field(None, ge=1, description="`--max-num-batched-tokens`; default per role (encoder: 114688).")


# ----------------------------------------------------------------------------- transfer


class SharedStorage(Strict):
    claimName: str = Field(min_length=1, description="ReadWriteMany PVC mounted by the encoder and every consumer.")
    path: str = Field("/ec-cache", pattern=r"^/.*", description="Mount path; the connector's `shared_storage_path`.")
    maxSize: Optional[Quantity] = Field(
        None, description="Size bound for the cache janitor: while the cache is larger, it deletes the oldest entries "
                          "older than `ttlSeconds` (never younger ones). Absent: entries go when older than `ttlSeconds`.")
    ttlSeconds: Optional[int] = Field(
        600, ge=1, description="Guaranteed minimum lifetime of a cached embedding (age counts from its last write): "
                               "no entry younger is deleted. Without `maxSize`, older entries are deleted.")


class Mooncake(Strict):
    protocol: Literal["tcp", "rdma"] = Field("tcp", description="`mooncake_protocol`; producer and consumers must match.")
    ecPort: int = Field(14579, ge=1024, le=65000, description="Consumer control port (`ec_port`; TP ranks use the next ports).")
    crossEncoderCache: bool = Field(False, description="Share embeddings across encoders through a Mooncake store (adds a master).")


class CPUConnector(Strict):
    bytes: Quantity = Field(description="`ec_cpu_bytes`: the shared-memory region; /dev/shm is sized to hold it.")
    nixl: bool = Field(True, description="`ec_enable_nixl`: consumers pull over NIXL.")
    sideChannelPort: int = Field(5601, ge=1024, le=65535, description="`VLLM_EC_SIDE_CHANNEL_PORT` on the encoder.")


class ECTransfer(Strict):
    connector: Literal["SharedStorage", "Mooncake", "CPU"] = Field(
        description="SharedStorage = ECExampleConnector, Mooncake = ECMooncakeConnector, CPU = ECCPUConnector.")
    sharedStorage: Optional[SharedStorage] = Field(None, description="SharedStorage settings; required with that connector.")
    mooncake: Optional[Mooncake] = Field(None, description="Mooncake settings; optional with that connector (defaults apply).")
    cpu: Optional[CPUConnector] = Field(None, description="CPU connector settings; required with that connector.")


class Nixl(Strict):
    ucxTls: str = Field("all", min_length=1, description="`UCX_TLS`.")
    ucxNetDevices: str = Field("all", min_length=1, description="`UCX_NET_DEVICES`.")
    sideChannelPort: int = Field(5600, ge=1024, le=65535, description="`VLLM_NIXL_SIDE_CHANNEL_PORT` (declared on the pod).")
    bufferDevice: Optional[Literal["cuda", "cpu"]] = Field(None, description="`kv_buffer_device`; default: the platform's.")


class KVTransfer(Strict):
    connector: Literal["Nixl"] = Field("Nixl", description="P->D KV transfer; NixlConnector (what vLLM's EPD proxy drives).")
    nixl: Nixl = Field(default_factory=Nixl, description="NixlConnector settings (UCX transports, side channel).")


# ----------------------------------------------------------------------------- router


class RouterService(Strict):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP", description="Service type.")
    port: int = Field(8000, ge=1, le=65535, description="Port clients send OpenAI-compatible requests to.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Service annotations, e.g. for a cloud load balancer.")


class Router(Placement):
    replicas: int = Field(2, ge=0, description="Router pods; ignored while `autoscaling` is set.")
    service: RouterService = Field(default_factory=RouterService, description="The Service clients call: the deployment's one endpoint.")
    encoderPolicy: Literal["cache-aware", "round-robin", "least-loaded"] = Field(
        "cache-aware", description="Which encoder gets an image: `cache-aware` hashes the item so repeats land where "
                                   "it was encoded (bounded load), `least-loaded` picks the fewest in-flight requests.")
    pdPolicy: Literal["least-loaded", "prefix-aware", "round-robin"] = Field(
        "least-loaded", description="Which prefill/decode instance gets a request: `prefix-aware` hashes the prompt's "
                                    "prefix for KV prefix-cache hits (bounded load), `least-loaded` picks the fewest in-flight.")


# ----------------------------------------------------------------------------- top level


class EPDDeploymentSpec(Strict):
    model: ModelSpec = Field(description="The model every tier serves.")
    image: str = Field(DEFAULT_VLLM_IMAGE, min_length=1, description="Default image for every vLLM tier.")
    imagePullSecrets: list[str] = Field(default_factory=list, description="Secret names for pulling images.")
    encoder: Tier = Field(description="The encoder tier (`--mm-encoder-only`, EC producer).")
    prefill: Optional[Tier] = Field(None, description="Present: E/P/D (prefill hands KV to decode); absent: E+PD.")
    decode: Tier = Field(description="Decode tier: the combined PD tier in E+PD, D in E/P/D.")
    ecTransfer: ECTransfer = Field(description="How the encoder's embeddings reach the prefill/decode tiers (the EC connector).")
    kvTransfer: Optional[KVTransfer] = Field(None, description="P->D KV transfer; E/P/D only (default there: Nixl).")
    router: Router = Field(default_factory=Router, description="The EPD router (endpoint picker) in front of the tiers.")

    @property
    def topology(self) -> str:
        return "E/P/D" if self.prefill is not None else "E+PD"


class ObjectMeta(BaseModel):
    # Server-populated metadata passes through; only what the operator reads is typed.
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    namespace: Optional[str] = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: Optional[str] = None
    generation: Optional[int] = None


class EPDDeployment(Strict):
    apiVersion: Literal["serving.epd.dev/v1alpha1"] = API_VERSION
    kind: Literal["EPDDeployment"] = KIND
    metadata: ObjectMeta
    spec: EPDDeploymentSpec
    status: Optional[KubeObject] = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"
