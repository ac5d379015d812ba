"""The model and the vLLM tiers of an `EPDDeployment`: what every tier serves, where and how its pods run
(`Placement`, shared with the router), and the encoder and consumer tiers' own settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .autoscaling import Autoscaling, VLLMAutoscaling
from .fields import (
    MAX_EXTRA_ARGS,
    MAX_LIST_ITEMS,
    Affinity,
    EnvFromSource,
    EnvVar,
    ExtraArg,
    LabelValue,
    PodSecurityContext,
    Resources,
    SecretKeyRef,
    SecurityContext,
    Strict,
    Toleration,
    TopologySpreadConstraint,
    Volume,
    VolumeMount,
)

# The port every vLLM container serves its API (and /metrics) on.
VLLM_PORT = 8000
# Volume names and mount paths the operator renders into some pod (the shared-storage path aside,
# which the spec chooses): a tier's `volumes`/`volumeMounts` may not reuse them. A render test checks
# this list covers everything rendered.
OPERATOR_VOLUMES = ("dshm", "models", "ec-cache", "mooncake-store", "tmp")
OPERATOR_MOUNT_PATHS = ("/dev/shm", "/models", "/etc/epd/mooncake", "/tmp")


# ----------------------------------------------------------------------------- model


class PVCSource(Strict):
    claimName: str = Field(min_length=1, description="PersistentVolumeClaim holding the model weights.")
    subPath: str | None = Field(None, description="Directory inside the claim where the model lives.")


class ModelSource(Strict):
    pvc: PVCSource = Field(description="Load the model from a PVC instead of downloading it from the hub.")


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


class Placement(Strict):
    """Where and how a tier's pods run: fields shared by the vLLM tiers and the router."""

    replicas: int = Field(
        1, ge=0, description="Pod count; ignored while `autoscaling` is set (the autoscaler owns it)."
    )
    image: str | None = Field(
        None, min_length=1, description="Container image; default: `spec.image` (router: the operator image)."
    )
    resources: Resources = Field(
        default_factory=Resources,
        description="Container resources; vLLM tiers on GPUs need `limits: {nvidia.com/gpu: N}` with N = "
        "tensorParallelSize x pipelineParallelSize x dataParallelSize / nodesPerReplica.",
    )
    extraArgs: list[ExtraArg] = Field(
        default_factory=list,
        max_length=MAX_EXTRA_ARGS,
        description="Appended verbatim to the container's arguments.",
    )
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
    autoscaling: VLLMAutoscaling | None = Field(
        None,
        description="Present: an HPA (or KEDA, `engine: KEDA`) scales this tier and the operator never writes its "
        "replicas.",
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
