"""Data-parallel and multi-node consumer tiers as rendered: vLLM's DP/EP and multi-node flags, every
port that shifts with the DP rank declared on the pod, and a multi-node tier as a LeaderWorkerSet.

Expected values are written out by hand from vLLM 0.32's rules (mooncake/config.py: ec_port + d*TP + r;
nixl: VLLM_NIXL_SIDE_CHANNEL_PORT + d) and LWS v1's API, not recomputed with the renderer's helpers.
"""

from __future__ import annotations

import pytest

from epd_operator.render import render, tier_hashes
from epd_operator.render.router_args import router_args
from epd_operator.render.vllm import parallel_args
from epd_operator.router.main import build_parser, config_from_args
from tests.support.render_examples import (
    MOONCAKE,
    NIXL_AUTOSCALED,
    SHARED_STORAGE,
    container,
    example,
    find,
    maybe_find,
    serve_argvs,
)


def ports(c: dict) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c["ports"]}


def dshm(deployment_pod: dict) -> str:
    return next(v["emptyDir"]["sizeLimit"] for v in deployment_pod["volumes"] if v["name"] == "dshm")


# ----------------------------------------------------------------------------- data parallel


def test_dp4_ep_decode_gets_vllms_flags_and_one_mooncake_port_per_rank():
    objects = render(example(MOONCAKE, **{"spec.decode.dataParallelSize": 4, "spec.decode.expertParallel": True}))
    decode = container(find(objects, "Deployment", "qwen-vl-mooncake-decode"), "vllm")
    args = decode["args"]
    i = args.index("--data-parallel-size")
    assert args[i : i + 3] == ["--data-parallel-size", "4", "--enable-expert-parallel"]
    assert ports(decode) == {
        "http": 8000,
        "mooncake-0": 14579,
        "mooncake-1": 14580,
        "mooncake-2": 14581,
        "mooncake-3": 14582,
    }
    # NCCL/shm room for four engines: 4 x 2Gi
    assert dshm(find(objects, "Deployment", "qwen-vl-mooncake-decode")["spec"]["template"]["spec"]) == "8Gi"


def test_mooncake_ports_are_ec_port_plus_rank_times_tp_plus_tp_rank():
    objects = render(
        example(
            MOONCAKE,
            **{
                "spec.decode.dataParallelSize": 2,
                "spec.decode.tensorParallelSize": 3,
                "spec.ecTransfer.mooncake": {"ecPort": 20000},
            },
        )
    )
    decode = container(find(objects, "Deployment", "qwen-vl-mooncake-decode"), "vllm")
    # d=0: 20000..20002, d=1: 20003..20005
    assert ports(decode) == {
        "http": 8000,
        "mooncake-0": 20000,
        "mooncake-1": 20001,
        "mooncake-2": 20002,
        "mooncake-3": 20003,
        "mooncake-4": 20004,
        "mooncake-5": 20005,
    }
    assert "--data-parallel-size" in decode["args"] and "--enable-expert-parallel" not in decode["args"]


def test_nixl_side_channel_ports_shift_by_dp_index_on_prefill_and_decode():
    objects = render(
        example(
            NIXL_AUTOSCALED,
            **{
                "spec.prefill.dataParallelSize": 2,
                "spec.decode.dataParallelSize": 3,
                "spec.kvTransfer.nixl.sideChannelPort": 7000,
            },
        )
    )
    prefill = container(find(objects, "Deployment", "qwen-vl-epd-prefill"), "vllm")
    decode = container(find(objects, "Deployment", "qwen-vl-epd-decode"), "vllm")
    assert ports(prefill) == {"http": 8000, "nixl": 7000, "nixl-1": 7001}
    assert ports(decode) == {"http": 8000, "nixl": 7000, "nixl-1": 7001, "nixl-2": 7002}
    assert prefill["args"][prefill["args"].index("--data-parallel-size") + 1] == "2"
    assert decode["args"][decode["args"].index("--data-parallel-size") + 1] == "3"


def test_a_single_rank_tier_renders_no_parallel_flags():
    for argv in serve_argvs(render(example(NIXL_AUTOSCALED))):
        assert not {
            "--data-parallel-size",
            "--enable-expert-parallel",
            "--nnodes",
            "--headless",
            "--pipeline-parallel-size",
        } & set(argv)


def test_pipeline_parallel_size_reaches_vllm():
    objects = render(example(SHARED_STORAGE, **{"spec.decode.pipelineParallelSize": 2}))
    args = container(find(objects, "Deployment", "qwen-vl-decode"), "vllm")["args"]
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"


# ----------------------------------------------------------------------------- multi-node


@pytest.fixture  # rendered per test: a mutation run attributes a module-scoped render to its first test only
def multi_node() -> list[dict]:
    return render(
        example(
            NIXL_AUTOSCALED,
            **{
                "spec.decode.nodesPerReplica": 2,
                "spec.decode.tensorParallelSize": 4,
                "spec.decode.pipelineParallelSize": 2,
                "spec.decode.replicas": 3,
                "spec.decode.autoscaling": {"minReplicas": 1, "maxReplicas": 4},
            },
        )
    )


def test_a_multi_node_tier_is_a_leader_worker_set_with_gang_semantics(multi_node):
    assert maybe_find(multi_node, "Deployment", "qwen-vl-epd-decode") is None
    lws = find(multi_node, "LeaderWorkerSet", "qwen-vl-epd-decode")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = lws["spec"]
    assert "replicas" not in spec  # the HPA owns it
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    # the other tiers stay Deployments
    assert find(multi_node, "Deployment", "qwen-vl-epd-prefill")


def test_leader_serves_the_api_and_workers_run_headless_at_the_leaders_address(multi_node):
    template = find(multi_node, "LeaderWorkerSet", "qwen-vl-epd-decode")["spec"]["leaderWorkerTemplate"]
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    tail = ["--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank"]
    i, j = (
        leader["args"].index("--distributed-executor-backend"),
        worker["args"].index("--distributed-executor-backend"),
    )
    assert leader["args"][i : i + 10] == tail + [
        "0",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
    ]
    assert worker["args"][j : j + 11] == tail + [
        "$(LWS_WORKER_INDEX)",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        "29501",
        "--headless",
    ]
    assert "--headless" not in leader["args"]
    assert ports(leader) == {"http": 8000, "nixl": 5600, "rendezvous": 29501}
    assert ports(worker) == {"nixl": 5600}
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(worker)
    # 4 x 2 ranks over 2 nodes: 4 GPU processes per pod, each given 2Gi of shared memory
    assert dshm(template["leaderTemplate"]["spec"]) == dshm(template["workerTemplate"]["spec"]) == "8Gi"
    assert template["leaderTemplate"]["metadata"] == template["workerTemplate"]["metadata"]


def test_the_router_only_ever_sees_leaders_and_the_hpa_scales_groups(multi_node):
    service = find(multi_node, "Service", "qwen-vl-epd-decode")
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/instance": "qwen-vl-epd",
        "serving.epd.dev/role": "decode",
        "leaderworkerset.sigs.k8s.io/worker-index": "0",
    }
    hpa = find(multi_node, "HorizontalPodAutoscaler", "qwen-vl-epd-decode")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "qwen-vl-epd-decode",
    }


def test_a_multi_node_tier_has_a_config_hash_that_rolls_with_it(multi_node):
    before = tier_hashes(multi_node)
    assert set(before) == {"encoder", "prefill", "decode", "router"}
    after = tier_hashes(
        render(
            example(
                NIXL_AUTOSCALED,
                **{
                    "spec.decode.nodesPerReplica": 2,
                    "spec.decode.tensorParallelSize": 4,
                    "spec.decode.pipelineParallelSize": 2,
                    "spec.decode.replicas": 3,
                    "spec.decode.autoscaling": {"minReplicas": 1, "maxReplicas": 4},
                    "spec.decode.extraArgs": ["--max-num-seqs", "8"],
                },
            )
        )
    )
    assert {role for role in before if before[role] != after[role]} == {"decode"}


def test_a_node_is_a_leader_or_a_worker():
    tier = example(
        SHARED_STORAGE, **{"spec.decode.nodesPerReplica": 2, "spec.decode.tensorParallelSize": 2}
    ).spec.decode
    with pytest.raises(ValueError, match="leader"):
        parallel_args(tier, "master")
    assert parallel_args(tier)[-5:] == ["0", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", "29501"]


# ----------------------------------------------------------------------------- the router's view


def test_the_router_is_told_each_tiers_dp_size_and_the_mooncake_rank_stride():
    args = router_args(example(MOONCAKE, **{"spec.decode.dataParallelSize": 4, "spec.decode.tensorParallelSize": 2}))
    assert args[args.index("--decode-dp-size") : args.index("--decode-dp-size") + 4] == [
        "--decode-dp-size",
        "4",
        "--ec-consumer-tp-size",
        "2",
    ]
    assert "--prefill-dp-size" not in args
    args = router_args(
        example(NIXL_AUTOSCALED, **{"spec.prefill.dataParallelSize": 2, "spec.decode.dataParallelSize": 3})
    )
    assert args[args.index("--prefill-dp-size") : args.index("--prefill-dp-size") + 4] == [
        "--prefill-dp-size",
        "2",
        "--decode-dp-size",
        "3",
    ]
    assert "--ec-consumer-tp-size" not in args  # NIXL: D's KV handle names P's port itself


def test_single_rank_tiers_add_nothing_to_the_routers_command_line():
    for spec in (
        example(MOONCAKE),
        example(NIXL_AUTOSCALED),
        example(MOONCAKE, **{"spec.decode.tensorParallelSize": 2}),
    ):
        args = router_args(spec)
        assert not {"--prefill-dp-size", "--decode-dp-size", "--ec-consumer-tp-size"} & set(args)


def test_rendered_dp_flags_parse_into_the_routers_config():
    args = router_args(example(MOONCAKE, **{"spec.decode.dataParallelSize": 4, "spec.decode.tensorParallelSize": 2}))
    cfg = config_from_args(build_parser().parse_args(args))
    assert (cfg.decode_dp_size, cfg.prefill_dp_size, cfg.ec_consumer_tp_size, cfg.ec_consumer_port) == (4, 1, 2, 14579)


def test_the_ec_consumers_service_declares_each_ranks_control_port_for_the_router():
    objects = render(example(MOONCAKE, **{"spec.decode.dataParallelSize": 3, "spec.decode.tensorParallelSize": 2}))
    service = find(objects, "Service", "qwen-vl-mooncake-decode")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"},
        {"name": "ec-dp0", "port": 14579, "targetPort": "mooncake-0", "protocol": "TCP"},
        {"name": "ec-dp1", "port": 14581, "targetPort": "mooncake-2", "protocol": "TCP"},
        {"name": "ec-dp2", "port": 14583, "targetPort": "mooncake-4", "protocol": "TCP"},
    ]
    # the encoder is no EC consumer: nothing to declare
    assert [p["name"] for p in find(objects, "Service", "qwen-vl-mooncake-encoder")["spec"]["ports"]] == ["http"]
