"""The `vllm serve` command line of each tier (vLLM 0.32 flags, checked by vLLM's own parser in tests/e2e/test_vllm_parser.py).

Order of the arguments: model and port, what every tier shares, the role's own flags, the transfer
configs, then the user's `extraArgs` last so they win over anything generated (argparse keeps the
last occurrence of a flag).
"""

from __future__ import annotations

import json

from ..api.spec import EPDDeployment, EPDDeploymentSpec
from ..api.tiers import (
    ENCODER_GPU_MEMORY_UTILIZATION,
    MULTI_NODE_MASTER_PORT,
    VLLM_PORT,
    ConsumerTier,
    EncoderTier,
    Tier,
)
from .naming import DECODE, ENCODER, PREFILL, VllmRole, tier_of
from .tracing import vllm_tracing_args
from .transfer import TierTransfer, tier_transfer

SERVE_COMMAND = ["vllm", "serve"]
MODELS_DIR = "/models"
# The encoder's budget really comes from its encoder-cache manager; the batched-token cap must only
# be large enough never to bind (vLLM's EPD examples use this value).
ENCODER_MAX_NUM_BATCHED_TOKENS = 114688
# The two kinds of pod of a multi-node replica, and what LeaderWorkerSet's pod webhook puts in the
# environment of every container of a group (sigs.k8s.io/lws api/leaderworkerset/v1).
LEADER, WORKER = "leader", "worker"
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX_ENV = "LWS_WORKER_INDEX"


def model_path(spec: EPDDeploymentSpec) -> str:
    """What `vllm serve` loads: the hub id, or the directory inside the mounted model claim."""
    pvc = spec.model.source.pvc if spec.model.source else None
    if pvc is None:
        return spec.model.name
    return f"{MODELS_DIR}/{pvc.subPath.strip('/')}" if pvc.subPath else MODELS_DIR


def served_model_name(spec: EPDDeploymentSpec) -> str:
    """The `model` clients (and the router) send: `servedModelName`, else what vLLM names it by default."""
    return spec.model.servedModelName or model_path(spec)


def _common_args(spec: EPDDeploymentSpec, tier: Tier, gpu_memory_utilization: float | None = None) -> list[str]:
    args = [model_path(spec), "--port", str(VLLM_PORT)]
    if spec.model.servedModelName:
        args += ["--served-model-name", spec.model.servedModelName]
    args += ["--tensor-parallel-size", str(tier.tensorParallelSize)]
    if tier.pipelineParallelSize > 1:
        args += ["--pipeline-parallel-size", str(tier.pipelineParallelSize)]
    if spec.model.maxModelLen:
        args += ["--max-model-len", str(spec.model.maxModelLen)]
    memory = tier.gpuMemoryUtilization if tier.gpuMemoryUtilization is not None else gpu_memory_utilization
    if memory is not None:
        args += ["--gpu-memory-utilization", str(memory)]
    # The router tags every sub-request with x-request-id; vLLM echoes it only with this flag.
    args.append("--enable-request-id-headers")
    # A pod being replaced finishes what it has (vLLM's drain mode) instead of aborting it.
    if spec.drainSeconds:
        args += ["--shutdown-timeout", str(spec.drainSeconds)]
    return args + vllm_tracing_args(spec)


def _max_num_batched_tokens(tier: Tier, default: int | None) -> list[str]:
    value = tier.maxNumBatchedTokens or default
    return ["--max-num-batched-tokens", str(value)] if value else []


def encoder_args(epd: EPDDeployment, transfer: TierTransfer) -> list[str]:
    """E: an encode-only EC producer; it never samples, and its cache is the connector's, not prefix caching."""
    spec, tier = epd.spec, epd.spec.encoder
    return (
        _common_args(spec, tier, ENCODER_GPU_MEMORY_UTILIZATION)
        + ["--mm-encoder-only", "--no-enable-prefix-caching"]
        + _max_num_batched_tokens(tier, ENCODER_MAX_NUM_BATCHED_TOKENS)
        + encoder_performance_args(tier)
        + transfer.args
        + tier.extraArgs
    )


def encoder_performance_args(tier: EncoderTier) -> list[str]:
    """The encoder's speed-ups as vLLM 0.32 spells them (its `CompilationConfig` and multimodal flags)."""
    args: list[str] = []
    graphs = tier.cudaGraphs
    if graphs is not None:
        config: dict[str, object] = {"cudagraph_mm_encoder": True}
        if graphs.tokenBudgets:
            config["encoder_cudagraph_token_budgets"] = sorted(graphs.tokenBudgets)
        if graphs.maxVisionItemsPerBatch is not None:
            config["encoder_cudagraph_max_vision_items_per_batch"] = graphs.maxVisionItemsPerBatch
        if graphs.maxFramesPerBatch is not None:
            config["encoder_cudagraph_max_frames_per_batch"] = graphs.maxFramesPerBatch
        args += ["--compilation-config", json.dumps(config, separators=(",", ":"), sort_keys=True)]
    if tier.preprocessing == "gpu":
        args += ["--mm-tensor-ipc", "torch_shm", "--mm-processor-device", "auto"]
    if tier.mmEncoderTPMode is not None:
        args += ["--mm-encoder-tp-mode", tier.mmEncoderTPMode]
    return args


def parallel_args(tier: ConsumerTier, node: str | None = LEADER) -> list[str]:
    """Data/expert parallelism and, for a multi-node replica, this pod's place in it.

    DP ranks run as engines inside one pod behind its API server (vLLM's internal load balancing;
    the router pins each request to a rank with `X-data-parallel-rank`). A multi-node replica is a
    LeaderWorkerSet group: `node` is `leader` (rank 0, the API server) or `worker` (headless, its
    rank the LWS worker index); both meet at the leader's address, which LWS gives every pod.
    """
    args: list[str] = []
    if tier.dataParallelSize > 1:
        args += ["--data-parallel-size", str(tier.dataParallelSize)]
    if tier.expertParallel:
        args.append("--enable-expert-parallel")
    if tier.nodesPerReplica > 1:
        if node not in (LEADER, WORKER):
            raise ValueError(f"a node of a multi-node replica is {LEADER!r} or {WORKER!r}, not {node!r}")
        # The multiprocessing executor is the one vLLM spans nodes with given --nnodes (Ray needs a cluster).
        args += [
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            str(tier.nodesPerReplica),
            "--node-rank",
            "0" if node == LEADER else f"$({LWS_WORKER_INDEX_ENV})",
            "--master-addr",
            f"$({LWS_LEADER_ADDRESS_ENV})",
            "--master-port",
            str(MULTI_NODE_MASTER_PORT),
        ]
        if node == WORKER:
            args.append("--headless")
    return args


def consumer_args(epd: EPDDeployment, role: VllmRole, transfer: TierTransfer, node: str | None = None) -> list[str]:
    """PD (E+PD), P and D (E/P/D): they take metadata-only `*_embeds` parts from the router.

    The EC and KV roles (and so the transfer flags) come from the topology: see `transfer`.
    """
    spec = epd.spec
    tier = tier_of(epd, role)
    assert isinstance(tier, ConsumerTier)
    return (
        _common_args(spec, tier)
        + parallel_args(tier, node or LEADER)
        + ["--enable-mm-embeds"]
        + _max_num_batched_tokens(tier, None)
        + transfer.args
        + tier.extraArgs
    )


def serve_args(epd: EPDDeployment, role: VllmRole, transfer: TierTransfer, node: str | None = None) -> list[str]:
    """The container `args` of a vLLM tier (what follows `vllm serve`) with its transfer pieces (the render
    plan's: computed once); `node` only for a multi-node tier."""
    if role == ENCODER:
        return encoder_args(epd, transfer)
    if role in (PREFILL, DECODE):
        return consumer_args(epd, role, transfer, node)
    raise ValueError(f"{role!r} is not a vLLM tier")


def serve_command(epd: EPDDeployment, role: VllmRole, node: str | None = None) -> list[str]:
    """The full argv, `vllm serve <model> ...`, as the container runs it."""
    return SERVE_COMMAND + serve_args(epd, role, tier_transfer(epd, role), node=node)
