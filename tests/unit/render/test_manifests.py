"""The renderer's contract: names, labels, order, vLLM command lines, transfer wiring, hashes, scaling."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from epd_operator.api import parse_epd
from epd_operator.api.tiers import OPERATOR_MOUNT_PATHS, OPERATOR_VOLUMES
from epd_operator.render import render, tier_hashes
from epd_operator.render.naming import CONFIG_HASH_ANNOTATION
from tests.support.render_examples import (
    BEHIND_GATEWAY,
    CPU_CONNECTOR,
    DP_EP_MOE,
    KEDA_SCALE_TO_ZERO,
    LOCAL_CPU,
    LOCAL_CPU_MULTINODE,
    LOCAL_CPU_NIXL,
    MOONCAKE,
    MULTI_NODE,
    NIXL_AUTOSCALED,
    SHARED_STORAGE,
    container,
    env_of,
    example,
    example_document,
    example_files,
    find,
    flag,
    maybe_find,
    overlay,
    pod_spec,
    rendered_examples,
    serve_argvs,
    variants,
)

KIND_ORDER = [
    "ConfigMap",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "Service",
    "Deployment",
    "HorizontalPodAutoscaler",
    "ScaledObject",  # a tier's autoscaler: an HPA or (engine KEDA) a ScaledObject
    "PodDisruptionBudget",
    "HTTPRoute",
]
LABEL_KEYS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "serving.epd.dev/role",
}


@pytest.fixture(scope="module")
def examples() -> dict[str, list[dict]]:
    return rendered_examples()


def vllm(objects: list[dict], deployment: str) -> dict:
    return container(find(objects, "Deployment", deployment), "vllm")


def transfer_config(c: dict, name: str) -> dict[str, Any]:
    raw = flag(c["args"], name)
    assert raw, f"no {name} on {c['name']}"
    return json.loads(raw)


def ec_config(c: dict) -> dict[str, Any]:
    return transfer_config(c, "--ec-transfer-config")


def kv_config(c: dict) -> dict[str, Any]:
    return transfer_config(c, "--kv-transfer-config")


# ----------------------------------------------------------------------------- shape of the output


def test_every_example_is_rendered(examples):
    assert set(examples) == {
        SHARED_STORAGE,
        NIXL_AUTOSCALED,
        MOONCAKE,
        CPU_CONNECTOR,
        DP_EP_MOE,
        MULTI_NODE,
        LOCAL_CPU,
        LOCAL_CPU_NIXL,
        LOCAL_CPU_MULTINODE,
        BEHIND_GATEWAY,
        KEDA_SCALE_TO_ZERO,
    }
    assert all(example_document(path.name)["kind"] == "EPDDeployment" for path in example_files())


def test_objects_come_in_contract_order_in_the_spec_namespace(examples):
    for name, objects in examples.items():
        namespace = example_document(name)["metadata"]["namespace"]
        # A tier's workload is a Deployment or (multi-node) a LeaderWorkerSet: both take the workloads' place.
        kinds = ["Deployment" if obj["kind"] == "LeaderWorkerSet" else obj["kind"] for obj in objects]
        assert kinds == sorted(kinds, key=KIND_ORDER.index), name
        assert {obj["metadata"]["namespace"] for obj in objects} == {namespace}
        assert not any("ownerReferences" in obj["metadata"] for obj in objects)


def test_objects_are_plain_json_and_survive_a_yaml_round_trip(examples):
    for objects in examples.values():
        assert json.loads(json.dumps(objects)) == objects
        assert list(yaml.safe_load_all(yaml.safe_dump_all(objects))) == objects


def test_rendering_is_deterministic():
    first = render(example(MOONCAKE))
    assert render(example(MOONCAKE)) == first
    assert json.dumps(render(example(MOONCAKE))) == json.dumps(first)  # key order too


def test_every_object_and_pod_template_carries_the_labels_and_selectors_use_instance_and_role(examples):
    for objects in examples.values():
        for obj in objects:
            labels = obj["metadata"]["labels"]
            assert set(labels) == LABEL_KEYS, obj["metadata"]["name"]
            assert labels["app.kubernetes.io/managed-by"] == "epd-operator"
            if obj["kind"] == "Deployment":
                role = labels["serving.epd.dev/role"]
                pod_labels = dict(obj["spec"]["template"]["metadata"]["labels"])
                # vLLM pods also carry their compatibility generation (the router pairs by it).
                generation = pod_labels.pop("serving.epd.dev/compat-generation", None)
                assert (generation is not None) == (role in ("encoder", "prefill", "decode")), obj["metadata"]["name"]
                assert pod_labels == labels
                assert obj["spec"]["selector"]["matchLabels"] == {
                    "app.kubernetes.io/instance": labels["app.kubernetes.io/instance"],
                    "serving.epd.dev/role": role,
                }


def test_names_follow_the_topology(examples):
    def names(objects, kind):
        return [obj["metadata"]["name"] for obj in objects if obj["kind"] == kind]

    e_pd = examples[SHARED_STORAGE]
    assert names(e_pd, "Deployment") == ["qwen-vl-encoder", "qwen-vl-decode", "qwen-vl-router"]
    assert names(e_pd, "Service") == ["qwen-vl-encoder", "qwen-vl-decode", "qwen-vl"]
    assert names(e_pd, "ConfigMap") == ["qwen-vl-transfer"]
    assert names(e_pd, "ServiceAccount") == names(e_pd, "Role") == names(e_pd, "RoleBinding") == ["qwen-vl-router"]
    e_p_d = examples[NIXL_AUTOSCALED]
    assert names(e_p_d, "Deployment") == [
        "qwen-vl-epd-encoder",
        "qwen-vl-epd-prefill",
        "qwen-vl-epd-decode",
        "qwen-vl-epd-router",
    ]
    assert names(e_p_d, "PodDisruptionBudget") == names(e_p_d, "Deployment")
    assert names(e_p_d, "HorizontalPodAutoscaler") == ["qwen-vl-epd-encoder"]
    assert names(examples[MOONCAKE], "Deployment")[-1] == "qwen-vl-mooncake-mooncake-master"


# ----------------------------------------------------------------------------- vLLM tiers


def test_encoder_command_line():
    objects = render(example(SHARED_STORAGE, **{"spec.encoder.extraArgs": ["--max-num-seqs", "64"]}))
    c = vllm(objects, "qwen-vl-encoder")
    args = c["args"]
    assert c["command"] == ["vllm", "serve"]
    assert args[:3] == ["Qwen/Qwen2.5-VL-7B-Instruct", "--port", "8000"]
    for present in ("--mm-encoder-only", "--no-enable-prefix-caching", "--enable-request-id-headers"):
        assert present in args
    assert flag(args, "--max-num-batched-tokens") == "114688"
    assert flag(args, "--served-model-name") == "qwen-vl"
    assert flag(args, "--max-model-len") == "32768"
    assert flag(args, "--tensor-parallel-size") == "1"
    assert flag(args, "--gpu-memory-utilization") == "0.3"
    assert args[-2:] == ["--max-num-seqs", "64"]  # extraArgs last, so they win
    assert ec_config(c) == {
        "ec_connector": "ECExampleConnector",
        "ec_role": "ec_producer",
        "ec_connector_extra_config": {"shared_storage_path": "/ec-cache"},
    }
    assert flag(c["args"], "--kv-transfer-config") is None


def test_transfer_configs_are_compact_and_key_sorted(examples):
    for objects in examples.values():
        for argv in serve_argvs(objects):
            for name in ("--ec-transfer-config", "--kv-transfer-config"):
                raw = flag(argv, name)
                if raw:
                    assert raw == json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"))


def test_e_pd_consumer_reads_the_same_claim_at_the_same_path(examples):
    objects = examples[SHARED_STORAGE]
    encoder, decode = (find(objects, "Deployment", f"qwen-vl-{r}") for r in ("encoder", "decode"))
    pd = container(decode, "vllm")
    assert ec_config(pd)["ec_role"] == "ec_consumer"
    assert ec_config(pd)["ec_connector_extra_config"] == {"shared_storage_path": "/ec-cache"}
    assert "--enable-mm-embeds" in pd["args"] and flag(pd["args"], "--kv-transfer-config") is None
    assert "--mm-encoder-only" not in pd["args"]
    for deployment in (encoder, decode):
        assert {"name": "ec-cache", "persistentVolumeClaim": {"claimName": "ec-cache"}} in pod_spec(deployment)[
            "volumes"
        ]
        assert {"name": "ec-cache", "mountPath": "/ec-cache"} in container(deployment, "vllm")["volumeMounts"]
    assert [c["name"] for c in pod_spec(decode)["containers"]] == ["vllm"]


def test_cache_janitor_sidecar_bounds_the_shared_cache(examples):
    encoder = find(examples[SHARED_STORAGE], "Deployment", "qwen-vl-encoder")
    janitor = container(encoder, "cache-janitor")
    assert janitor["image"] == "ghcr.io/epd-operator/epd-operator:0.1.0"
    assert janitor["command"] == ["epdctl", "janitor"]
    assert janitor["args"] == [
        "--path",
        "/ec-cache",
        "--ttl-seconds",
        "600",
        "--max-size",
        str(50 * 2**30),
        "--interval",
        "30",
    ]
    assert janitor["volumeMounts"] == [{"name": "ec-cache", "mountPath": "/ec-cache"}]
    security = janitor["securityContext"]
    # vLLM's user (root in its image), so it may delete vLLM's files, and nothing more.
    assert security == {
        "runAsUser": 0,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    router = container(find(examples[SHARED_STORAGE], "Deployment", "qwen-vl-router"), "router")
    assert 0 < float(flag(router["args"], "--reuse-ttl") or "nan") < 600
    # Beside a janitor, a consumer must be able to encode an item whose cache file is gone.
    assert flag(router["args"], "--rewrite") == "pinned"


def test_janitor_uses_the_router_image_override():
    objects = render(example(SHARED_STORAGE, **{"spec.router.image": "registry.local/epd:dev"}))
    encoder = find(objects, "Deployment", "qwen-vl-encoder")
    assert container(encoder, "cache-janitor")["image"] == "registry.local/epd:dev"


def test_operator_image_is_the_default_router_and_janitor_image():
    objects = render(example(SHARED_STORAGE), default_router_image="registry.local/operator:9")
    assert (
        container(find(objects, "Deployment", "qwen-vl-encoder"), "cache-janitor")["image"]
        == "registry.local/operator:9"
    )
    assert container(find(objects, "Deployment", "qwen-vl-router"), "router")["image"] == "registry.local/operator:9"
    # A spec that names a router image keeps it.
    objects = render(
        example(SHARED_STORAGE, **{"spec.router.image": "registry.local/epd:dev"}),
        default_router_image="registry.local/operator:9",
    )
    assert container(find(objects, "Deployment", "qwen-vl-router"), "router")["image"] == "registry.local/epd:dev"


def test_e_p_d_prefill_and_decode_transfer_roles(examples):
    objects = examples[NIXL_AUTOSCALED]
    prefill, decode = vllm(objects, "qwen-vl-epd-prefill"), vllm(objects, "qwen-vl-epd-decode")
    assert ec_config(prefill)["ec_role"] == "ec_consumer"
    assert kv_config(prefill) == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert flag(decode["args"], "--ec-transfer-config") is None
    assert kv_config(decode) == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    assert "--enable-mm-embeds" in prefill["args"] and "--enable-mm-embeds" in decode["args"]
    assert flag(decode["args"], "--tensor-parallel-size") == "2"
    assert flag(prefill["args"], "--max-num-batched-tokens") == "16384"
    # D reads no embeddings: it neither mounts the cache nor runs a janitor.
    assert all(m["name"] != "ec-cache" for m in decode["volumeMounts"])


def test_nixl_env_and_port_on_prefill_and_decode(examples):
    objects = examples[NIXL_AUTOSCALED]
    for deployment in ("qwen-vl-epd-prefill", "qwen-vl-epd-decode"):
        c = vllm(objects, deployment)
        env = env_of(c)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
        assert env["UCX_TLS"] == "all" and env["UCX_NET_DEVICES"] == "all"
        assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in c["ports"]
    assert "VLLM_NIXL_SIDE_CHANNEL_HOST" not in env_of(vllm(objects, "qwen-vl-epd-encoder"))


def test_kv_transfer_defaults_to_nixl_when_a_prefill_tier_exists():
    objects = render(example(NIXL_AUTOSCALED, **{"spec.kvTransfer": None}))
    assert kv_config(vllm(objects, "qwen-vl-epd-prefill"))["kv_connector"] == "NixlConnector"
    assert env_of(vllm(objects, "qwen-vl-epd-decode"))["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"


def test_pod_ip_is_declared_before_any_env_that_uses_it(examples):
    for objects in examples.values():
        for obj in objects:
            if obj["kind"] != "Deployment":
                continue
            for c in pod_spec(obj)["containers"]:
                names = [e["name"] for e in c.get("env", [])]
                users = [i for i, e in enumerate(c.get("env", [])) if "$(POD_IP)" in e.get("value", "")]
                if users or any("$(POD_IP)" in arg for arg in c.get("args", [])):
                    assert names.index("POD_IP") < min(users, default=len(names))
                    assert c["env"][names.index("POD_IP")]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_vllm_container_probes_ports_and_security(examples):
    for objects in examples.values():
        for argv_owner in (o for o in objects if o["kind"] == "Deployment"):
            if argv_owner["metadata"]["labels"]["serving.epd.dev/role"] not in ("encoder", "prefill", "decode"):
                continue
            spec = pod_spec(argv_owner)
            c = container(argv_owner, "vllm")
            assert c["ports"][0] == {"name": "http", "containerPort": 8000, "protocol": "TCP"}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
            startup = c["startupProbe"]
            assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert "runAsUser" not in c["securityContext"]  # the image's user
            assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"  # a crash's last log lines
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert spec["automountServiceAccountToken"] is False
            shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
            assert shm["emptyDir"]["medium"] == "Memory"
            assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_model_from_a_claim_is_mounted_read_only(examples):
    objects = examples[NIXL_AUTOSCALED]
    for role in ("encoder", "prefill", "decode"):
        deployment = find(objects, "Deployment", f"qwen-vl-epd-{role}")
        c = container(deployment, "vllm")
        assert c["args"][0] == "/models/qwen2.5-vl-7b"
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
        assert {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod_spec(
            deployment
        )["volumes"]
        assert "HF_TOKEN" not in env_of(c)


def test_hf_token_comes_from_the_secret(examples):
    env = env_of(vllm(examples[MOONCAKE], "qwen-vl-mooncake-decode"))
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}


def test_tier_env_comes_after_ours_and_placement_is_applied():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]
            }
        }
    }
    objects = render(
        example(
            SHARED_STORAGE,
            **{
                "spec.decode.env": [
                    {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                    {"name": "MC_FORCE_TCP", "value": "0"},
                ],
                "spec.decode.nodeSelector": {"pool": "gpu"},
                "spec.decode.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "spec.decode.affinity": affinity,
                "spec.imagePullSecrets": ["regcred"],
                "spec.decode.image": "vllm/vllm-openai:nightly",
            },
        )
    )
    decode = find(objects, "Deployment", "qwen-vl-decode")
    names = [e["name"] for e in container(decode, "vllm")["env"]]
    assert names[-2:] == ["VLLM_LOGGING_LEVEL", "MC_FORCE_TCP"]
    spec = pod_spec(decode)
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == affinity
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert container(decode, "vllm")["image"] == "vllm/vllm-openai:nightly"
    assert container(find(objects, "Deployment", "qwen-vl-encoder"), "vllm")["image"] == "vllm/vllm-openai:v0.33.0"
    assert "nodeSelector" not in pod_spec(find(objects, "Deployment", "qwen-vl-encoder"))


def test_served_model_name_absent_means_the_model_name():
    objects = render(example(SHARED_STORAGE, **{"spec.model.servedModelName": None}))
    assert "--served-model-name" not in vllm(objects, "qwen-vl-decode")["args"]


# ----------------------------------------------------------------------------- connectors


def test_mooncake_consumer_listens_on_its_pod_ip_one_port_per_tp_rank():
    objects = render(example(MOONCAKE, **{"spec.decode.tensorParallelSize": 2}))
    pd = vllm(objects, "qwen-vl-mooncake-decode")
    config = ec_config(pd)
    assert config["ec_connector"] == "ECMooncakeConnector" and config["ec_role"] == "ec_consumer"
    assert config["ec_ip"] == "$(POD_IP)" and config["ec_port"] == 14579
    assert config["ec_connector_extra_config"] == {"mooncake_protocol": "tcp"}
    assert [(p["name"], p["containerPort"]) for p in pd["ports"]] == [
        ("http", 8000),
        ("mooncake-0", 14579),
        ("mooncake-1", 14580),
    ]
    assert env_of(pd)["MC_FORCE_TCP"] == "1"
    router = container(find(objects, "Deployment", "qwen-vl-mooncake-router"), "router")
    assert flag(router["args"], "--ec-consumer-port") == "14579"


def test_mooncake_producer_advertises_its_pod_ip(examples):
    encoder = vllm(examples[MOONCAKE], "qwen-vl-mooncake-encoder")
    assert env_of(encoder)["VLLM_HOST_IP"] == "$(POD_IP)"
    assert "ec_ip" not in ec_config(encoder)


def test_cross_encoder_cache_adds_a_master_and_the_store_config(examples):
    objects = examples[MOONCAKE]
    encoder = find(objects, "Deployment", "qwen-vl-mooncake-encoder")
    c = container(encoder, "vllm")
    assert ec_config(c)["ec_connector_extra_config"] == {"mooncake_protocol": "tcp", "cross_encoder_cache": True}
    assert float(flag(c["args"], "--mm-processor-cache-gb") or "nan") > 0
    env = env_of(c)
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert env["MOONCAKE_CONFIG_PATH"] == "/etc/epd/mooncake/mooncake-store.json"
    assert {"name": "mooncake-store", "mountPath": "/etc/epd/mooncake", "readOnly": True} in c["volumeMounts"]
    store = json.loads(find(objects, "ConfigMap", "qwen-vl-mooncake-transfer")["data"]["mooncake-store.json"])
    assert store["master_server_address"] == "qwen-vl-mooncake-mooncake-master.default.svc:50051"
    assert store["protocol"] == "tcp" and store["metadata_server"] == "P2PHANDSHAKE"
    # Only encoders use the store; consumers get no cross_encoder_cache (vLLM refuses it there).
    assert "MOONCAKE_CONFIG_PATH" not in env_of(vllm(objects, "qwen-vl-mooncake-decode"))
    master = find(objects, "Deployment", "qwen-vl-mooncake-mooncake-master")
    mc = container(master, "mooncake-master")
    assert mc["command"] == ["mooncake_master"]
    assert mc["args"] == ["--rpc_port", "50051", "--rpc_address", "$(POD_IP)", "--metrics_port", "9003"]
    assert mc["readinessProbe"]["tcpSocket"] == {"port": "rpc"}
    assert master["spec"]["replicas"] == 1
    service = find(objects, "Service", "qwen-vl-mooncake-mooncake-master")
    assert [p["port"] for p in service["spec"]["ports"]] == [50051, 9003]


def test_plain_mooncake_needs_no_master():
    objects = render(example(MOONCAKE, **{"spec.ecTransfer.mooncake": {"protocol": "rdma"}}))
    assert maybe_find(objects, "Deployment", "qwen-vl-mooncake-mooncake-master") is None
    assert "mooncake-store.json" not in find(objects, "ConfigMap", "qwen-vl-mooncake-transfer")["data"]
    encoder = vllm(objects, "qwen-vl-mooncake-encoder")
    assert "cross_encoder_cache" not in ec_config(encoder)["ec_connector_extra_config"]
    assert "MC_FORCE_TCP" not in env_of(encoder)
    assert encoder["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_cpu_connector_region_side_channel_and_shm(examples):
    objects = examples[CPU_CONNECTOR]
    encoder, decode = (find(objects, "Deployment", f"qwen-vl-cpu-{r}") for r in ("encoder", "decode"))
    for deployment in (encoder, decode):
        c = container(deployment, "vllm")
        assert ec_config(c)["ec_connector"] == "ECCPUConnector"
        assert ec_config(c)["ec_connector_extra_config"] == {"ec_cpu_bytes": 8 * 2**30, "ec_enable_nixl": True}
        assert env_of(c)["VLLM_USE_V2_MODEL_RUNNER"] == "1"
        shm = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == "dshm")
        assert int(shm["emptyDir"]["sizeLimit"].removesuffix("Gi")) * 2**30 >= 8 * 2**30
    producer = container(encoder, "vllm")
    assert env_of(producer)["VLLM_EC_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
    assert env_of(producer)["VLLM_EC_SIDE_CHANNEL_PORT"] == "5601"
    assert {"name": "ec-side", "containerPort": 5601, "protocol": "TCP"} in producer["ports"]
    assert "VLLM_EC_SIDE_CHANNEL_HOST" not in env_of(container(decode, "vllm"))


def test_configmap_holds_every_generated_transfer_config(examples):
    data = find(examples[NIXL_AUTOSCALED], "ConfigMap", "qwen-vl-epd-transfer")["data"]
    assert sorted(data) == [
        "decode.kv-transfer.json",
        "encoder.ec-transfer.json",
        "prefill.ec-transfer.json",
        "prefill.kv-transfer.json",
    ]
    prefill = vllm(examples[NIXL_AUTOSCALED], "qwen-vl-epd-prefill")
    assert data["prefill.kv-transfer.json"] == flag(prefill["args"], "--kv-transfer-config")


# ----------------------------------------------------------------------------- router


def test_router_deployment_rbac_and_service(examples):
    objects = examples[NIXL_AUTOSCALED]
    router = find(objects, "Deployment", "qwen-vl-epd-router")
    c = container(router, "router")
    args = c["args"]
    assert c["command"] == ["epd-router"]
    assert flag(args, "--discovery") == "kubernetes" and flag(args, "--namespace") == "inference"
    for role in ("encoder", "prefill", "decode"):
        assert flag(args, f"--{role}-selector") == f"app.kubernetes.io/instance=qwen-vl-epd,serving.epd.dev/role={role}"
    assert flag(args, "--encoder-policy") == "cache-aware" and flag(args, "--pd-policy") == "least-loaded"
    spec = pod_spec(router)
    assert spec["serviceAccountName"] == "qwen-vl-epd-router"
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # Liveness waits for the router's first answer, for up to 300 s.
    assert c["startupProbe"] == {
        "httpGet": {"path": "/livez", "port": "http"},
        "periodSeconds": 2,
        "failureThreshold": 150,
    }
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    rbac = find(objects, "Role", "qwen-vl-epd-router")
    assert rbac["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    ]
    binding = find(objects, "RoleBinding", "qwen-vl-epd-router")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "qwen-vl-epd-router", "namespace": "inference"}]
    service = find(objects, "Service", "qwen-vl-epd")
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]


def test_e_pd_router_disables_prefill(examples):
    args = container(find(examples[SHARED_STORAGE], "Deployment", "qwen-vl-router"), "router")["args"]
    assert flag(args, "--prefill-servers-urls") == "disable"
    assert "--prefill-selector" not in args


def test_router_service_annotations_and_workers_per_cpu():
    objects = render(
        example(
            SHARED_STORAGE,
            **{
                "spec.router.service": {"type": "ClusterIP", "port": 8080, "annotations": {"a.example/b": "c"}},
                "spec.router.resources": {"limits": {"cpu": "3500m"}},
            },
        )
    )
    service = find(objects, "Service", "qwen-vl")
    assert service["metadata"]["annotations"] == {"a.example/b": "c"}
    assert service["spec"]["ports"][0]["port"] == 8080
    assert flag(container(find(objects, "Deployment", "qwen-vl-router"), "router")["args"], "--workers") == "4"


@pytest.mark.parametrize(
    ("extra", "deadline", "grace"),
    [
        ([], "30", 40),  # 5 s preStop sleep + 30 s drain + 5 s to exit
        (["--drain-timeout", "90"], "90", 100),  # extraArgs come last: theirs wins, and sizes the grace period
        (["--drain-timeout=2.5"], "2.5", 13),
    ],
)
def test_router_drains_before_it_goes(extra, deadline, grace):
    from epd_operator.router.main import build_parser, config_from_args

    objects = render(example(SHARED_STORAGE, **{"spec.router.extraArgs": extra}))
    router = find(objects, "Deployment", "qwen-vl-router")
    c = container(router, "router")
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert pod_spec(router)["terminationGracePeriodSeconds"] == grace
    assert config_from_args(build_parser().parse_args(c["args"])).drain_timeout == float(deadline)


def test_vllm_tier_services_are_headless(examples):
    for objects in examples.values():
        for obj in objects:
            if obj["kind"] == "Service" and obj["metadata"]["labels"]["serving.epd.dev/role"] in (
                "encoder",
                "prefill",
                "decode",
            ):
                assert obj["spec"]["clusterIP"] == "None" and obj["spec"]["publishNotReadyAddresses"] is False
                # vLLM's API first; a Mooncake EC consumer adds one control port per DP rank (ec-dp<d>)
                assert obj["spec"]["ports"][0] == {
                    "name": "http",
                    "port": 8000,
                    "targetPort": "http",
                    "protocol": "TCP",
                }
                assert all(p["name"].startswith("ec-dp") for p in obj["spec"]["ports"][1:])


# ----------------------------------------------------------------------------- scaling, hashes


def test_autoscaled_tier_has_an_hpa_and_no_replicas(examples):
    objects = examples[NIXL_AUTOSCALED]
    assert "replicas" not in find(objects, "Deployment", "qwen-vl-epd-encoder")["spec"]
    assert find(objects, "Deployment", "qwen-vl-epd-decode")["spec"]["replicas"] == 2
    hpa = find(objects, "HorizontalPodAutoscaler", "qwen-vl-epd-encoder")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen-vl-epd-encoder"}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    assert hpa["metrics"] == [encoder_demand("qwen-vl-epd", "4")]
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600


def encoder_demand(deployment: str, target: str) -> dict:
    """The encoder HPA's load: its deployment's demand, an Object metric divided by the tier's pods."""
    return {
        "type": "Object",
        "object": {
            "describedObject": {"apiVersion": "serving.epd.dev/v1alpha1", "kind": "EPDDeployment", "name": deployment},
            "metric": {"name": "epd_router_encoder_demand"},
            "target": {"type": "AverageValue", "averageValue": target},
        },
    }


CPU_70 = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}
MEMORY_METRIC = {
    "type": "Resource",
    "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "1Gi"}},
}


def hpa_metrics_of(tier: str, autoscaling: dict, **more) -> list[dict]:
    objects = render(example(SHARED_STORAGE, **{f"spec.{tier}.autoscaling": autoscaling}, **more))
    return find(objects, "HorizontalPodAutoscaler", f"qwen-vl-{tier}")["spec"]["metrics"]


def test_encoder_hpa_defaults_to_its_load():
    assert hpa_metrics_of("encoder", {"maxReplicas": 4}) == [encoder_demand("qwen-vl", "4")]


def test_hpa_on_load_with_a_target_per_pod():
    (metric,) = hpa_metrics_of("encoder", {"maxReplicas": 4, "load": {"targetPerPod": 2}})
    assert metric == encoder_demand("qwen-vl", "2")
    (metric,) = hpa_metrics_of("decode", {"maxReplicas": 4, "load": {"targetPerPod": 64}})
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "epd_router_decode_inflight"},
            "target": {"type": "AverageValue", "averageValue": "64"},
        },
    }
    objects = render(
        example(NIXL_AUTOSCALED, **{"spec.prefill.autoscaling": {"maxReplicas": 3, "load": {"targetPerPod": 8}}})
    )
    (metric,) = find(objects, "HorizontalPodAutoscaler", "qwen-vl-epd-prefill")["spec"]["metrics"]
    assert metric["pods"]["metric"] == {"name": "epd_router_prefill_inflight"}


def test_the_encoder_tier_has_no_per_pod_load_metric():
    from epd_operator.render.autoscaling import load_metric_name

    with pytest.raises(ValueError, match=r"^no per-pod load metric for the encoder tier$"):
        load_metric_name("encoder")


def test_raw_metrics_stay_as_written_and_follow_the_load():
    assert hpa_metrics_of("encoder", {"maxReplicas": 4, "metrics": [MEMORY_METRIC]}) == [MEMORY_METRIC]
    both = {"maxReplicas": 4, "load": {"targetPerPod": 4}, "metrics": [MEMORY_METRIC]}
    assert hpa_metrics_of("encoder", both) == [encoder_demand("qwen-vl", "4"), MEMORY_METRIC]


def test_hpa_of_prefill_decode_and_router_defaults_to_cpu_utilisation():
    objects = render(example(SHARED_STORAGE, **{"spec.decode.autoscaling": {"maxReplicas": 4}}))
    hpa = find(objects, "HorizontalPodAutoscaler", "qwen-vl-decode")["spec"]
    assert hpa["metrics"] == [CPU_70]
    assert hpa["minReplicas"] == 1 and "behavior" not in hpa
    assert "replicas" not in find(objects, "Deployment", "qwen-vl-decode")["spec"]
    objects = render(example(SHARED_STORAGE, **{"spec.router.autoscaling": {"maxReplicas": 4}}))
    assert find(objects, "HorizontalPodAutoscaler", "qwen-vl-router")["spec"]["metrics"] == [CPU_70]


def test_pdb_per_tier(examples):
    pdb = find(examples[SHARED_STORAGE], "PodDisruptionBudget", "qwen-vl-decode")["spec"]
    assert pdb == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/instance": "qwen-vl", "serving.epd.dev/role": "decode"}},
    }


@pytest.mark.parametrize(
    ("changes", "rolled"),
    [
        ({"spec.decode.gpuMemoryUtilization": 0.8}, {"decode"}),
        ({"spec.prefill.extraArgs": ["--max-num-seqs", "32"]}, {"prefill"}),
        ({"spec.encoder.env": [{"name": "A", "value": "1"}]}, {"encoder"}),
        ({"spec.router.encoderPolicy": "round-robin"}, {"router"}),
        ({"spec.kvTransfer.nixl.sideChannelPort": 5700}, {"prefill", "decode"}),
        # the janitor's TTL and the router's reuse TTL follow it; P reads the same files regardless
        ({"spec.ecTransfer.sharedStorage.ttlSeconds": 1200}, {"encoder", "router"}),
        ({"spec.model.maxModelLen": 16384}, {"encoder", "prefill", "decode"}),
        ({"spec.decode.replicas": 5}, set()),  # scaling is not a rollout
        # a new compatibility generation: every vLLM tier rolls, so none keeps talking to the other build
        ({"spec.image": "vllm/vllm-openai:v0.33.1"}, {"encoder", "prefill", "decode"}),
        ({"spec.decode.image": "vllm/vllm-openai:v0.33.1"}, {"encoder", "prefill", "decode"}),
        ({"spec.kvTransfer.nixl.ucxTls": "rc,cuda_copy"}, {"encoder", "prefill", "decode"}),
        ({"spec.encoder.autoscaling.maxReplicas": 12}, set()),
    ],
)
def test_a_change_rolls_only_the_tiers_it_touches(changes, rolled):
    before = tier_hashes(render(example(NIXL_AUTOSCALED)))
    after = tier_hashes(render(example(NIXL_AUTOSCALED, **changes)))
    assert set(before) == {"encoder", "prefill", "decode", "router"}
    assert {role for role in before if before[role] != after[role]} == rolled


def test_store_config_change_rolls_the_encoders_that_mount_it():
    before = render(example(MOONCAKE))
    after = render(example(MOONCAKE, **{"metadata.namespace": "other"}))  # the master's address moves
    # Nothing else in the encoder pods names the namespace: the mounted store config made the difference.
    assert tier_hashes(before)["encoder"] != tier_hashes(after)["encoder"]
    assert tier_hashes(before)["decode"] == tier_hashes(after)["decode"]
    deployment = find(before, "Deployment", "qwen-vl-mooncake-encoder")
    assert len(deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]) == 16


def test_router_and_janitor_accept_their_rendered_arguments(examples):
    # Their own parsers are the authority on their flags (argparse exits on an unknown one).
    from epd_operator.janitor import build_parser as janitor_parser
    from epd_operator.router.main import build_parser as router_parser
    from epd_operator.router.main import config_from_args

    seen = set()
    for objects in examples.values():
        for obj in objects:
            if obj["kind"] != "Deployment":
                continue
            for c in pod_spec(obj)["containers"]:
                if c["name"] == "router":
                    config = config_from_args(router_parser().parse_args(c["args"]))
                    assert config.discovery == "kubernetes"
                elif c["name"] == "cache-janitor":
                    assert janitor_parser().parse_args(c["args"]).ttl_seconds > 0
                seen.add(c["name"])
    assert {"router", "cache-janitor"} <= seen


# ----------------------------------------------------------------------------- pod overlays, defaults


def _pods(objects: list[dict]) -> dict[str, dict]:
    return {obj["metadata"]["labels"]["serving.epd.dev/role"]: obj for obj in objects if obj["kind"] == "Deployment"}


def _main(deployment: dict) -> dict:
    return pod_spec(deployment)["containers"][0]


def test_overlay_fields_land_on_every_pod_of_their_tier():
    objects = render(variants()["nixl-overlay-on-every-tier"])
    deployments = _pods(objects)
    assert set(deployments) == {"encoder", "prefill", "decode", "router"}
    for role, deployment in deployments.items():
        expected = overlay(role)
        template = deployment["spec"]["template"]
        spec = template["spec"]
        main = _main(deployment)
        assert main["name"] == ("router" if role == "router" else "vllm")
        # labels beside ours; the selector is untouched
        assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == f"q-{role}"
        assert template["metadata"]["labels"]["serving.epd.dev/role"] == role
        assert deployment["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/instance": "qwen-vl-epd",
            "serving.epd.dev/role": role,
        }
        assert "kueue.x-k8s.io/queue-name" not in deployment["metadata"]["labels"]
        annotations = template["metadata"]["annotations"]
        assert annotations["example.com/tier"] == role and CONFIG_HASH_ANNOTATION in annotations
        assert spec["priorityClassName"] == f"prio-{role}"
        assert spec["runtimeClassName"] == "nvidia" and spec["schedulerName"] == "volcano"
        assert spec["topologySpreadConstraints"] == expected["topologySpreadConstraints"]
        assert spec["volumes"][-2:] == expected["volumes"]
        assert main["volumeMounts"][-2:] == expected["volumeMounts"]
        assert main["envFrom"] == expected["envFrom"]
        # pod securityContext: ours kept, theirs added; container: field by field
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["securityContext"]["fsGroup"] == 2000
        assert main["securityContext"]["readOnlyRootFilesystem"] is True
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
        # sidecars get none of the main container's overlay
        for other in spec["containers"][1:]:
            assert "envFrom" not in other and all(m["name"] not in ("scratch", "certs") for m in other["volumeMounts"])


def test_a_user_env_var_named_like_ours_replaces_it_in_place():
    objects = render(variants()["nixl-overlay-on-every-tier"])
    for role, deployment in _pods(objects).items():
        env = _main(deployment)["env"]
        names = [e["name"] for e in env]
        assert len(names) == len(set(names)), f"{role}: duplicate env names {names}"  # SSA refuses duplicates
        assert names[-1] == f"EXTRA_{role.upper()}"
        pod_ip = env[names.index("POD_IP")]
        assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIPs"}}
        if role != "router":
            assert names.index("POD_IP") == 0  # still declared before every var that refers to it


def test_overlay_labels_change_the_config_hash_only_of_their_tier():
    base = tier_hashes(render(example(SHARED_STORAGE)))
    changed = tier_hashes(render(example(SHARED_STORAGE, **{"spec.decode.podLabels": {"team": "a"}})))
    assert {role for role in base if base[role] != changed[role]} == {"decode"}


def test_router_has_default_requests_and_a_memory_limit(examples):
    for objects in examples.values():
        router = find(objects, "Deployment", f"{objects[0]['metadata']['labels']['app.kubernetes.io/instance']}-router")
        resources = container(router, "router")["resources"]
        assert resources["requests"]["cpu"] and resources["requests"]["memory"]  # not BestEffort
        assert resources["limits"]["memory"]
        assert "cpu" not in resources["limits"]  # no CPU throttling; one worker on the 500m request
        assert "--workers" not in container(router, "router")["args"]


def test_mooncake_master_has_a_memory_limit_and_takes_placement(examples):
    master = find(examples[MOONCAKE], "Deployment", "qwen-vl-mooncake-mooncake-master")
    assert container(master, "mooncake-master")["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }
    objects = render(variants()["mooncake-master-placement-and-overlays"])
    master = find(objects, "Deployment", "qwen-vl-mooncake-mooncake-master")
    spec = pod_spec(master)
    assert spec["nodeSelector"] == {"pool": "cpu"} and spec["priorityClassName"] == "infra"
    assert spec["tolerations"][0]["key"] == "dedicated" and "nodeAffinity" in spec["affinity"]
    assert container(master, "mooncake-master")["resources"]["limits"] == {"memory": "3Gi"}
    assert "runtimeClassName" not in spec  # the encoder's overlay is not the master's


def test_the_api_reserves_every_volume_and_mount_path_the_operator_renders():
    """A user volume or mount colliding with ours is refused by the API (rules.py); that only holds
    while OPERATOR_VOLUMES / OPERATOR_MOUNT_PATHS list everything the renderer emits."""
    specs = {**{p.name: parse_epd(example_document(p.name)) for p in example_files()}, **variants()}
    for case, epd in specs.items():
        storage = epd.spec.ecTransfer.sharedStorage
        for deployment in _pods(render(epd)).values():
            spec = pod_spec(deployment)
            user = {v["name"] for v in _placement_volumes(epd, deployment)}
            for volume in spec.get("volumes", []):
                assert volume["name"] in OPERATOR_VOLUMES or volume["name"] in user, (case, volume["name"])
            for c in spec["containers"]:
                for mount in c.get("volumeMounts", []):
                    if mount["name"] in user:
                        continue
                    assert mount["mountPath"] in OPERATOR_MOUNT_PATHS or (
                        storage is not None and mount["mountPath"] == storage.path
                    ), (case, mount)


def _placement_volumes(epd, deployment: dict) -> list[dict]:
    role = deployment["metadata"]["labels"]["serving.epd.dev/role"]
    placement = getattr(epd.spec, role, None) if role != "mooncake-master" else None
    return list(placement.volumes) if placement is not None else []


@pytest.mark.parametrize(
    "trust, flags",
    [
        ({}, []),
        ({"immutableMediaURLs": True}, ["--immutable-media-urls"]),
        (
            {"clientEmbeds": True, "clientUUIDs": True, "immutableMediaURLs": True},
            ["--allow-client-embeds", "--trust-client-uuids", "--immutable-media-urls"],
        ),
    ],
)
def test_the_router_trusts_clients_only_as_far_as_the_spec_declares(trust, flags):
    doc = example_document(SHARED_STORAGE)
    doc["spec"].setdefault("router", {})["trust"] = trust
    objects = render(parse_epd(doc))
    name = doc["metadata"]["name"]
    args = container(find(objects, "Deployment", f"{name}-router"), "router")["args"]
    trust_flags = {"--allow-client-embeds", "--trust-client-uuids", "--immutable-media-urls"}
    assert [a for a in args if a in trust_flags] == flags


@pytest.mark.parametrize(
    "spill, encoder_load, decode_load, flags",
    [
        ({}, None, None, {"--spill-encoder-inflight": "8"}),  # 2 x the encoder's default target (4)
        ({}, 3, None, {"--spill-encoder-inflight": "6"}),
        ({}, 3, 16, {"--spill-encoder-inflight": "6", "--spill-consumer-inflight": "16"}),
        (
            {"encoderInflight": 5, "consumerInflight": 2},
            3,
            16,
            {"--spill-encoder-inflight": "5", "--spill-consumer-inflight": "2"},
        ),
        ({"enabled": False, "encoderInflight": 5}, 3, 16, {}),
    ],
)
def test_the_spill_over_bounds_come_from_the_spec_or_the_tiers_load_targets(spill, encoder_load, decode_load, flags):
    doc = example_document(SHARED_STORAGE)
    spec = doc["spec"]
    spec.setdefault("router", {})["spillOver"] = spill
    for tier, target in (("encoder", encoder_load), ("decode", decode_load)):
        spec[tier]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4}
        if target is not None:
            spec[tier]["autoscaling"]["load"] = {"targetPerPod": target}
        else:
            spec[tier]["autoscaling"]["metrics"] = [
                {
                    "type": "Resource",
                    "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
                }
            ]
    objects = render(parse_epd(doc))
    args = container(find(objects, "Deployment", f"{doc['metadata']['name']}-router"), "router")["args"]
    spill_flags = ("--spill-encoder-inflight", "--spill-consumer-inflight")
    assert {a: args[i + 1] for i, a in enumerate(args) if a in spill_flags} == flags


@pytest.mark.parametrize("flag", ["--language-model-only", "--language-model-only=true"])
def test_no_spill_over_to_consumers_without_the_vision_encoder(flag):
    """A consumer run with vLLM's --language-model-only cannot encode the raw media a spill would send."""
    doc = example_document(SHARED_STORAGE)
    doc["spec"].setdefault("router", {})["spillOver"] = {"enabled": True, "encoderInflight": 5}
    router = f"{doc['metadata']['name']}-router"
    args = container(find(render(parse_epd(doc)), "Deployment", router), "router")["args"]
    assert "--spill-encoder-inflight" in args
    doc["spec"]["decode"]["extraArgs"] = [*doc["spec"]["decode"].get("extraArgs", []), flag]
    args = container(find(render(parse_epd(doc)), "Deployment", router), "router")["args"]
    assert not [a for a in args if a.startswith("--spill-")]


def test_the_encoder_gets_its_own_gpu_memory_default_and_consumers_keep_vllms():
    from epd_operator.api.tiers import ENCODER_GPU_MEMORY_UTILIZATION

    doc = example_document(SHARED_STORAGE)
    for tier in ("encoder", "decode"):
        doc["spec"][tier].pop("gpuMemoryUtilization", None)
    objects = render(parse_epd(doc))
    name = doc["metadata"]["name"]
    assert flag(vllm(objects, f"{name}-encoder")["args"], "--gpu-memory-utilization") == str(
        ENCODER_GPU_MEMORY_UTILIZATION
    )
    assert "--gpu-memory-utilization" not in vllm(objects, f"{name}-decode")["args"]
    doc["spec"]["encoder"]["gpuMemoryUtilization"] = 0.05  # the spec wins
    objects = render(parse_epd(doc))
    assert flag(vllm(objects, f"{name}-encoder")["args"], "--gpu-memory-utilization") == "0.05"


def test_encoder_performance_settings_become_vllms_flags_on_the_encoder_only():
    doc = example_document(SHARED_STORAGE)
    doc["spec"]["encoder"].update(
        cudaGraphs={"tokenBudgets": [4096, 1024], "maxVisionItemsPerBatch": 8, "maxFramesPerBatch": 32},
        preprocessing="gpu",
        mmEncoderTPMode="data",
    )
    objects = render(parse_epd(doc))
    name = doc["metadata"]["name"]
    args = vllm(objects, f"{name}-encoder")["args"]
    assert json.loads(flag(args, "--compilation-config") or "null") == {
        "cudagraph_mm_encoder": True,
        "encoder_cudagraph_token_budgets": [1024, 4096],
        "encoder_cudagraph_max_vision_items_per_batch": 8,
        "encoder_cudagraph_max_frames_per_batch": 32,
    }
    assert (flag(args, "--mm-tensor-ipc"), flag(args, "--mm-processor-device")) == ("torch_shm", "auto")
    assert flag(args, "--mm-encoder-tp-mode") == "data"
    decode = vllm(objects, f"{name}-decode")["args"]
    assert not {"--compilation-config", "--mm-tensor-ipc", "--mm-encoder-tp-mode"} & set(decode)
    plain = render(parse_epd(example_document(SHARED_STORAGE)))
    assert not {"--compilation-config", "--mm-tensor-ipc", "--mm-encoder-tp-mode"} & set(
        vllm(plain, f"{name}-encoder")["args"]
    )


def test_encoder_only_settings_are_refused_on_a_consumer_tier():
    from epd_operator.api import SpecError

    doc = example_document(SHARED_STORAGE)
    doc["spec"]["decode"]["cudaGraphs"] = {}
    with pytest.raises(SpecError) as refused:
        parse_epd(doc)
    assert "spec.decode.cudaGraphs" in [e.path for e in refused.value.errors]


def test_a_gateway_renders_an_httproute_to_the_router_service():
    doc = example_document(SHARED_STORAGE)
    doc["spec"].setdefault("router", {})["gateway"] = {
        "parentRefs": [{"name": "inference", "namespace": "gateways", "sectionName": "https"}, {"name": "internal"}],
        "hostnames": ["vl.example.com"],
    }
    objects = render(parse_epd(doc))
    name, ns = doc["metadata"]["name"], doc["metadata"]["namespace"]
    route = find(objects, "HTTPRoute", name)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["metadata"]["namespace"] == ns
    assert route["spec"] == {
        "parentRefs": [
            {
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": "inference",
                "namespace": "gateways",
                "sectionName": "https",
            },
            {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "internal"},
        ],
        "hostnames": ["vl.example.com"],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                "backendRefs": [
                    {
                        "group": "",
                        "kind": "Service",
                        "name": name,
                        "port": find(objects, "Service", name)["spec"]["ports"][0]["port"],
                    }
                ],
            }
        ],
    }
    assert route["metadata"]["labels"]["serving.epd.dev/role"] == "router"
    assert not [o for o in render(parse_epd(example_document(SHARED_STORAGE))) if o["kind"] == "HTTPRoute"]
