"""render/vllm: whole `vllm serve` argument lists written out for each tier, with the defaults of every
branch (model from a claim, served name, memory, batched tokens, encoder speed-ups, parallelism, multi-node
pods) — vLLM's own parser checks the examples' lines in tests/e2e/test_vllm_parser.py."""

from __future__ import annotations

import pytest

from epd_operator.api.spec import EPDDeployment
from epd_operator.render.transfer import TierTransfer, tier_transfer
from epd_operator.render.vllm import (
    encoder_performance_args,
    model_path,
    parallel_args,
    serve_args,
    serve_command,
    served_model_name,
)
from tests.support.epd_specs import epd

MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"


def args_of(deployment: EPDDeployment, role: str, node: str | None = None) -> list[str]:
    """A tier's args with the transfer pieces its render plan computes."""
    return serve_args(deployment, role, tier_transfer(deployment, role), node=node)  # type: ignore[arg-type]


SHARED_EC = '{"ec_connector":"ECExampleConnector","ec_connector_extra_config":{"shared_storage_path":"/ec-cache"},'


def test_model_path_and_served_name():
    assert (model_path(epd().spec), served_model_name(epd().spec)) == (MODEL, MODEL)
    claim = epd(spec__model={"name": "qwen", "source": {"pvc": {"claimName": "w", "subPath": "/models/qwen/"}}})
    assert model_path(claim.spec) == "/models/models/qwen"
    assert served_model_name(claim.spec) == "/models/models/qwen"
    x_dir = epd(spec__model={"name": "qwen", "source": {"pvc": {"claimName": "w", "subPath": "X/"}}})
    assert model_path(x_dir.spec) == "/models/X"
    root = epd(spec__model={"name": "qwen", "source": {"pvc": {"claimName": "w"}}})
    assert model_path(root.spec) == "/models"
    named = epd(spec__model={"name": "qwen", "servedModelName": "vl"})
    assert (model_path(named.spec), served_model_name(named.spec)) == ("qwen", "vl")


def test_e_pd_defaults_whole_lines():
    deployment = epd()
    assert serve_command(deployment, "encoder") == [
        "vllm",
        "serve",
        MODEL,
        "--port",
        "8000",
        "--tensor-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.35",
        "--enable-request-id-headers",
        "--shutdown-timeout",
        "120",
        "--mm-encoder-only",
        "--no-enable-prefix-caching",
        "--max-num-batched-tokens",
        "114688",
        "--ec-transfer-config",
        SHARED_EC + '"ec_role":"ec_producer"}',
    ]
    assert args_of(deployment, "decode") == [
        MODEL,
        "--port",
        "8000",
        "--tensor-parallel-size",
        "1",
        "--enable-request-id-headers",
        "--shutdown-timeout",
        "120",
        "--enable-mm-embeds",
        "--ec-transfer-config",
        SHARED_EC + '"ec_role":"ec_consumer"}',
    ]


def test_every_common_setting_in_its_place_and_extra_args_last():
    deployment = epd(
        spec__model={"name": "m", "servedModelName": "vl", "maxModelLen": 4096},
        spec__drainSeconds=0,
        spec__encoder={
            "tensorParallelSize": 2,
            "pipelineParallelSize": 2,
            "gpuMemoryUtilization": 0.5,
            "maxNumBatchedTokens": 8192,
            "extraArgs": ["--seed", "1"],
        },
        spec__decode={
            "pipelineParallelSize": 1,
            "gpuMemoryUtilization": 0.8,
            "maxNumBatchedTokens": 2048,
            "extraArgs": ["--max-num-seqs", "8"],
        },
    )
    assert args_of(deployment, "encoder") == [
        "m",
        "--port",
        "8000",
        "--served-model-name",
        "vl",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.5",
        "--enable-request-id-headers",
        "--mm-encoder-only",
        "--no-enable-prefix-caching",
        "--max-num-batched-tokens",
        "8192",
        "--ec-transfer-config",
        SHARED_EC + '"ec_role":"ec_producer"}',
        "--seed",
        "1",
    ]
    assert args_of(deployment, "decode") == [
        "m",
        "--port",
        "8000",
        "--served-model-name",
        "vl",
        "--tensor-parallel-size",
        "1",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.8",
        "--enable-request-id-headers",
        "--enable-mm-embeds",
        "--max-num-batched-tokens",
        "2048",
        "--ec-transfer-config",
        SHARED_EC + '"ec_role":"ec_consumer"}',
        "--max-num-seqs",
        "8",
    ]


def test_encoder_speed_ups():
    deployment = epd(
        spec__encoder={
            "cudaGraphs": {"tokenBudgets": [4096, 1024], "maxVisionItemsPerBatch": 0, "maxFramesPerBatch": 16},
            "preprocessing": "gpu",
            "mmEncoderTPMode": "data",
        }
    )
    assert encoder_performance_args(deployment.spec.encoder) == [
        "--compilation-config",
        '{"cudagraph_mm_encoder":true,"encoder_cudagraph_max_frames_per_batch":16,'
        '"encoder_cudagraph_max_vision_items_per_batch":0,"encoder_cudagraph_token_budgets":[1024,4096]}',
        "--mm-tensor-ipc",
        "torch_shm",
        "--mm-processor-device",
        "auto",
        "--mm-encoder-tp-mode",
        "data",
    ]
    bare = epd(spec__encoder={"cudaGraphs": {}})
    assert encoder_performance_args(bare.spec.encoder) == ["--compilation-config", '{"cudagraph_mm_encoder":true}']
    assert encoder_performance_args(epd().spec.encoder) == []
    assert "--compilation-config" in args_of(bare, "encoder")


def test_data_and_expert_parallel_consumers():
    deployment = epd(spec__decode={"dataParallelSize": 4, "expertParallel": True})
    assert parallel_args(deployment.spec.decode) == ["--data-parallel-size", "4", "--enable-expert-parallel"]
    assert parallel_args(epd().spec.decode) == []
    args = args_of(deployment, "decode")
    assert args[args.index("--enable-request-id-headers") + 3 : args.index("--enable-mm-embeds")] == [
        "--data-parallel-size",
        "4",
        "--enable-expert-parallel",
    ]


def test_a_multi_node_replica_per_pod():
    tier = epd(spec__decode={"nodesPerReplica": 2, "tensorParallelSize": 4}).spec.decode
    assert parallel_args(tier, "leader") == [
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
    ]
    assert parallel_args(tier, "worker") == [
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
        "--headless",
    ]
    assert parallel_args(tier) == parallel_args(tier, "leader")
    for node in (None, "follower"):
        with pytest.raises(ValueError) as caught:
            parallel_args(tier, node)
        assert str(caught.value) == f"a node of a multi-node replica is 'leader' or 'worker', not {node!r}"


def test_e_p_d_prefill_and_decode_lines():
    deployment = epd(spec__prefill={})
    kv = '{"kv_connector":"NixlConnector","kv_role":"kv_%s"}'
    assert args_of(deployment, "prefill")[-4:] == [
        "--ec-transfer-config",
        SHARED_EC + '"ec_role":"ec_consumer"}',
        "--kv-transfer-config",
        kv % "producer",
    ]
    assert args_of(deployment, "decode")[-3:] == ["--enable-mm-embeds", "--kv-transfer-config", kv % "consumer"]


def test_only_vllm_tiers_have_a_command_line():
    with pytest.raises(ValueError) as caught:
        serve_args(epd(), "router", TierTransfer())  # type: ignore[arg-type]  # what a caller outside the type system may pass
    assert str(caught.value) == "'router' is not a vLLM tier"


def test_two_data_parallel_ranks_and_expert_parallel_on_several_nodes():
    assert parallel_args(epd(spec__decode={"dataParallelSize": 2}).spec.decode) == ["--data-parallel-size", "2"]
    tier = epd(spec__decode={"nodesPerReplica": 2, "tensorParallelSize": 2, "expertParallel": True}).spec.decode
    assert parallel_args(tier, "worker")[:4] == [
        "--enable-expert-parallel",
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
    ]


def test_a_given_transfer_and_node_reach_the_line():
    deployment = epd(spec__decode={"nodesPerReplica": 2, "tensorParallelSize": 2})
    given = TierTransfer(args=["--given"])
    assert serve_args(deployment, "encoder", given)[-1] == "--given"
    assert serve_args(deployment, "decode", given, node="worker")[-2:] == ["--enable-mm-embeds", "--given"]
    assert "--headless" in args_of(deployment, "decode", node="worker")
    assert "--headless" in serve_command(deployment, "decode", node="worker")
    assert "--headless" not in serve_command(deployment, "decode")
