"""The shipped examples as parsed EPDDeployments and rendered objects, plus ways to look into them.

Shared by the renderer's tests (and any test that wants realistic specs): every spec here is one
of `examples/*.yaml`, or one of them with a few fields changed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from dev.local.argv import expand_vars
from dev.local.runner import load_spec
from epd_operator.api import EPDDeployment, parse_epd
from epd_operator.render import render

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

SHARED_STORAGE = "epd-shared-storage.yaml"
NIXL_AUTOSCALED = "epd-nixl-autoscaled.yaml"
MOONCAKE = "epd-mooncake.yaml"
CPU_CONNECTOR = "epd-cpu-connector.yaml"
DP_EP_MOE = "epd-dp-ep-moe.yaml"
MULTI_NODE = "epd-multi-node.yaml"
LOCAL_CPU = "epd-local-cpu.yaml"
LOCAL_CPU_NIXL = "epd-local-cpu-nixl.yaml"
LOCAL_CPU_MULTINODE = "epd-local-cpu-multinode.yaml"
BEHIND_GATEWAY = "epd-behind-gateway.yaml"
KEDA_SCALE_TO_ZERO = "epd-keda-scale-to-zero.yaml"


def example_files() -> list[Path]:
    return sorted(EXAMPLES_DIR.glob("*.yaml"))


def example_document(name: str) -> dict[str, Any]:
    """The example's EPDDeployment (a local example carries its namespace and volumes beside it)."""
    return load_spec(EXAMPLES_DIR / name)


def example(name: str, **changes: Any) -> EPDDeployment:
    """An example with `changes` applied, keyed by dotted path into the document:
    `example(NIXL_AUTOSCALED, **{"spec.decode.replicas": 3})`. A value of `None` removes the field.
    """
    doc = copy.deepcopy(example_document(name))
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return parse_epd(doc)


def find(objects: list[dict], kind: str, name: str) -> dict:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise LookupError(f"no {kind} {name} among {[(o['kind'], o['metadata']['name']) for o in objects]}")


def maybe_find(objects: list[dict], kind: str, name: str) -> dict | None:
    try:
        return find(objects, kind, name)
    except LookupError:
        return None


def container(deployment: dict, name: str) -> dict:
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise LookupError(f"no container {name} in {deployment['metadata']['name']}")


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def env_of(c: dict) -> dict[str, Any]:
    """A container's env by name: the literal value, or the `valueFrom` mapping."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def flag(args: list[str], name: str) -> str | None:
    """The value following `name` in an argv (the last occurrence wins, as in argparse)."""
    value = None
    for i, arg in enumerate(args[:-1]):
        if arg == name:
            value = args[i + 1]
    return value


# What LeaderWorkerSet's pod webhook puts in a group's containers (a worker's index, the leader's
# address), so that the kubelet's `$(VAR)` expansion can be played on a rendered command line.
LWS_WORKER_ENV = {"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "qwen-vl-decode-0.qwen-vl-decode-0.ns"}
LWS_LEADER_ENV = {**LWS_WORKER_ENV, "LWS_WORKER_INDEX": "0"}


def pod_templates(obj: dict) -> list[tuple[dict, dict[str, str]]]:
    """The pod templates of a Deployment or a LeaderWorkerSet (leader, then worker), each with the
    environment its controller adds."""
    if obj["kind"] == "Deployment":
        return [(obj["spec"]["template"], {})]
    if obj["kind"] == "LeaderWorkerSet":
        lws = obj["spec"]["leaderWorkerTemplate"]
        return [(lws["leaderTemplate"], LWS_LEADER_ENV), (lws["workerTemplate"], LWS_WORKER_ENV)]
    return []


def serve_argvs(objects: list[dict]) -> list[list[str]]:
    """Every `vllm serve` command line among the rendered Deployments and LeaderWorkerSets, with the
    LeaderWorkerSet's `$(VAR)` references expanded as the kubelet would."""
    return [
        c["command"] + [expand_vars(arg, env) for arg in c["args"]]
        for obj in objects
        for template, env in pod_templates(obj)
        for c in template["spec"]["containers"]
        if c["name"] == "vllm"
    ]


def rendered_examples() -> dict[str, list[dict]]:
    return {path.name: render(parse_epd(example_document(path.name))) for path in example_files()}


def overlay(tag: str) -> dict[str, Any]:
    """Every per-tier pod overlay field, set (values differ per tier by `tag`)."""
    return {
        "podLabels": {"kueue.x-k8s.io/queue-name": f"q-{tag}"},
        "podAnnotations": {"sidecar.istio.io/inject": "false", "example.com/tier": tag},
        "priorityClassName": f"prio-{tag}",
        "runtimeClassName": "nvidia",
        "schedulerName": "volcano",
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"example.com/tier": tag}},
            }
        ],
        "volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "certs", "secret": {"secretName": f"tls-{tag}"}},
        ],
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "certs", "mountPath": "/certs", "readOnly": True},
        ],
        "envFrom": [{"configMapRef": {"name": f"env-{tag}"}}],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIPs"}}},
            {"name": f"EXTRA_{tag.upper()}", "value": "1"},
        ],
        "podSecurityContext": {"fsGroup": 2000, "supplementalGroups": [3000]},
        "securityContext": {"readOnlyRootFilesystem": True},
    }


def with_overlay(tier: dict[str, Any], tag: str) -> dict[str, Any]:
    return {**tier, **overlay(tag)}


KEDA_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"


def variants() -> dict[str, EPDDeployment]:
    """Examples changed to reach what the examples themselves leave out, by a descriptive name."""
    gpu_prefill = {"tensorParallelSize": 2, "resources": {"limits": {"nvidia.com/gpu": 2}}}
    nixl = example_document(NIXL_AUTOSCALED)["spec"]
    mooncake = example_document(MOONCAKE)["spec"]
    return {
        "nixl-overlay-on-every-tier": example(
            NIXL_AUTOSCALED,
            **{
                f"spec.{role}": with_overlay(nixl.get(role, {}), role)
                for role in ("encoder", "prefill", "decode", "router")
            },
        ),
        "mooncake-master-placement-and-overlays": example(
            MOONCAKE,
            **{
                "spec.ecTransfer.mooncake": {
                    **mooncake["ecTransfer"]["mooncake"],
                    "master": {
                        "nodeSelector": {"pool": "cpu"},
                        "priorityClassName": "infra",
                        "tolerations": [
                            {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}
                        ],
                        "affinity": {
                            "nodeAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 1,
                                        "preference": {
                                            "matchExpressions": [{"key": "pool", "operator": "In", "values": ["cpu"]}]
                                        },
                                    }
                                ]
                            }
                        },
                        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "3Gi"}},
                    },
                },
                "spec.encoder": with_overlay(mooncake["encoder"], "encoder"),
                "spec.decode": with_overlay(mooncake["decode"], "decode"),
            },
        ),
        "mooncake-rdma-tp2-no-store": example(
            MOONCAKE, **{"spec.ecTransfer.mooncake": {"protocol": "rdma"}, "spec.decode.tensorParallelSize": 2}
        ),
        "mooncake-e-p-d": example(MOONCAKE, **{"spec.prefill": gpu_prefill}),
        "nixl-network-policy-widened-and-narrowed": example(
            NIXL_AUTOSCALED,
            **{
                "spec.networkPolicy": {
                    "scrapers": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                            "podSelector": {"matchExpressions": [{"key": "scraper", "operator": "Exists"}]},
                        }
                    ],
                    "routerFrom": [{"namespaceSelector": {"matchLabels": {"gateway": "true"}}, "podSelector": {}}],
                    "egressTo": [{"cidr": "10.96.0.1/32", "ports": [443]}, {"namespaceSelector": {}}],
                }
            },
        ),
        "mooncake-dp4-ep-tp2-decode": example(
            MOONCAKE,
            **{
                "spec.decode.dataParallelSize": 4,
                "spec.decode.expertParallel": True,
                "spec.decode.tensorParallelSize": 2,
            },
        ),
        "nixl-dp-prefill-and-decode": example(
            NIXL_AUTOSCALED,
            **{
                "spec.prefill.dataParallelSize": 2,
                "spec.decode.dataParallelSize": 4,
                "spec.decode.expertParallel": True,
            },
        ),
        "nixl-multi-node-decode-tp4-pp2": example(
            NIXL_AUTOSCALED,
            **{
                "spec.decode.nodesPerReplica": 2,
                "spec.decode.tensorParallelSize": 4,
                "spec.decode.pipelineParallelSize": 2,
                "spec.decode.autoscaling": {"maxReplicas": 3},
            },
        ),
        "shared-storage-multi-node-pd": example(
            SHARED_STORAGE, **{"spec.decode.nodesPerReplica": 4, "spec.decode.tensorParallelSize": 16}
        ),
        "cpu-e-p-d-tp2-encoder": example(
            CPU_CONNECTOR, **{"spec.prefill": gpu_prefill, "spec.encoder.tensorParallelSize": 2}
        ),
        "nixl-default-kv-all-autoscaled": example(
            NIXL_AUTOSCALED,
            **{
                "spec.kvTransfer": None,
                "spec.prefill.autoscaling": {"maxReplicas": 4},
                "spec.decode.autoscaling": {"minReplicas": 2, "maxReplicas": 6},
                "spec.router.autoscaling": {"maxReplicas": 3},
                "spec.router.env": [{"name": "LOG", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}],
            },
        ),
        "keda-encoder-scale-to-zero": example(
            SHARED_STORAGE,
            **{
                "spec.encoder.autoscaling": {
                    "engine": "KEDA",
                    "minReplicas": 0,
                    "maxReplicas": 4,
                    "keda": {"prometheusAddress": KEDA_PROMETHEUS, "cooldownPeriod": 600},
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
                }
            },
        ),
        "keda-every-tier-multi-node-decode": example(
            NIXL_AUTOSCALED,
            **{
                "spec.encoder.autoscaling": {
                    "engine": "KEDA",
                    "minReplicas": 1,
                    "maxReplicas": 8,
                    "load": {"targetPerPod": 6},
                    "keda": {
                        "prometheusAddress": KEDA_PROMETHEUS,
                        "activationThreshold": 2.5,
                        "pollingInterval": 15,
                        "triggers": [
                            {
                                "type": "cron",
                                "metadata": {
                                    "timezone": "UTC",
                                    "start": "0 8 * * *",
                                    "end": "0 18 * * *",
                                    "desiredReplicas": "3",
                                },
                            }
                        ],
                        "fallback": {"failureThreshold": 3, "replicas": 2},
                    },
                },
                "spec.prefill.autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 4,
                    "load": {"targetPerPod": 8},
                    "keda": {"prometheusAddress": KEDA_PROMETHEUS},
                },
                "spec.decode.nodesPerReplica": 2,
                "spec.decode.tensorParallelSize": 4,
                "spec.decode.autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 3,
                    "keda": {
                        "triggers": [
                            {
                                "type": "prometheus",
                                "name": "queue",
                                "metadata": {
                                    "serverAddress": KEDA_PROMETHEUS,
                                    "query": "sum(vllm:num_requests_waiting)",
                                    "threshold": "5",
                                },
                            }
                        ]
                    },
                },
            },
        ),
        "shared-storage-placement": example(
            SHARED_STORAGE,
            **{
                "spec.model.servedModelName": None,
                "spec.decode.tolerations": [
                    {"key": "gpu", "operator": "Equal", "value": "yes", "effect": "NoExecute", "tolerationSeconds": 60}
                ],
                "spec.decode.affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                        ]
                    }
                },
                "spec.imagePullSecrets": ["regcred"],
                "spec.router.service": {"type": "NodePort", "port": 30080, "annotations": {"x": "y"}},
                "spec.ecTransfer.sharedStorage": {"claimName": "ec", "path": "/cache/ec"},
            },
        ),
    }
