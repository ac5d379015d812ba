"""Bad EPDDeployment specs, refused with their field path by every door: `parse_epd` (the operator),
`epdctl validate` / `epdctl render`, and the generated CRD's schema + CEL rules (the API server).

The Python validation and the CRD must agree on every row, accept or refuse: the cross-field rules
are written once (api/rules.py) precisely so that they cannot drift.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.local.runner import load_spec
from epd_operator.api import SpecError, parse_epd
from epd_operator.api.crd import build_crd
from epd_operator.cli import main as epdctl
from tests.support.crd_schema import default_and_prune, unknown_fields, validate_custom_object

EXAMPLES = sorted((Path(__file__).resolve().parents[3] / "examples").glob("*.yaml"))
CRD = build_crd()


def minimal() -> dict[str, Any]:
    """The smallest valid spec: E+PD over shared storage."""
    return {
        "apiVersion": "serving.epd.dev/v1alpha1",
        "kind": "EPDDeployment",
        "metadata": {"name": "qwen-vl"},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-VL-3B-Instruct"},
            "encoder": {},
            "decode": {},
            "ecTransfer": {"connector": "SharedStorage", "sharedStorage": {"claimName": "ec-cache"}},
        },
    }


def _set(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value


_DELETE = object()


def spec_with(*changes: dict[str, Any]) -> dict[str, Any]:
    """`minimal()` with dotted-path changes (`{"metadata.name": "x"}`); `_DELETE` removes a field."""
    doc = minimal()
    for change in changes:
        for dotted, value in change.items():
            _set(doc, dotted, value)
    return doc


CPU_WITHOUT_SHARED = {"spec.ecTransfer": {"connector": "CPU", "cpu": {"bytes": "4Gi"}}}
MOONCAKE = {"spec.ecTransfer": {"connector": "Mooncake"}}


def case(id: str, path: str, *changes: dict[str, Any]) -> Any:
    return pytest.param(spec_with(*changes), path, id=id)


# Each row: a spec that must be refused, and the field path the refusal must name.
BAD_SPECS = [
    case("missing-encoder", "spec.encoder", {"spec.encoder": _DELETE}),
    case("missing-decode", "spec.decode", {"spec.decode": _DELETE}),
    case("missing-ec-transfer", "spec.ecTransfer", {"spec.ecTransfer": _DELETE}),
    case("missing-model", "spec.model", {"spec.model": _DELETE}),
    case("kv-transfer-without-prefill", "spec.kvTransfer", {"spec.kvTransfer": {}}),
    case("unknown-ec-connector", "spec.ecTransfer.connector", {"spec.ecTransfer.connector": "Nixl"}),
    case(
        "unknown-kv-connector",
        "spec.kvTransfer.connector",
        {"spec.prefill": {}, "spec.kvTransfer": {"connector": "LMCache"}},
    ),
    case(
        "shared-storage-without-claim-name",
        "spec.ecTransfer.sharedStorage.claimName",
        {"spec.ecTransfer.sharedStorage": {"path": "/cache"}},
    ),
    case(
        "shared-storage-without-settings",
        "spec.ecTransfer.sharedStorage",
        {"spec.ecTransfer": {"connector": "SharedStorage"}},
    ),
    case(
        "shared-storage-relative-path",
        "spec.ecTransfer.sharedStorage.path",
        {"spec.ecTransfer.sharedStorage.path": "cache"},
    ),
    case(
        "shared-storage-zero-ttl",
        "spec.ecTransfer.sharedStorage.ttlSeconds",
        {"spec.ecTransfer.sharedStorage.ttlSeconds": 0},
    ),
    case(
        "spill-over-zero-encoder-bound",
        "spec.router.spillOver.encoderInflight",
        {"spec.router": {"spillOver": {"encoderInflight": 0}}},
    ),
    case(
        "spill-over-negative-consumer-bound",
        "spec.router.spillOver.consumerInflight",
        {"spec.router": {"spillOver": {"consumerInflight": -1}}},
    ),
    case("cpu-without-bytes", "spec.ecTransfer.cpu.bytes", {"spec.ecTransfer": {"connector": "CPU", "cpu": {}}}),
    case("cpu-without-settings", "spec.ecTransfer.cpu", {"spec.ecTransfer": {"connector": "CPU"}}),
    case(
        "settings-of-another-connector", "spec.ecTransfer.mooncake", {"spec.ecTransfer.mooncake": {"protocol": "tcp"}}
    ),
    case(
        "mooncake-with-tensor-parallel-encoder",
        "spec.encoder.tensorParallelSize",
        MOONCAKE,
        {"spec.encoder.tensorParallelSize": 2},
    ),
    case(
        "mooncake-with-pipeline-parallel-encoder",
        "spec.encoder.pipelineParallelSize",
        MOONCAKE,
        {"spec.encoder.pipelineParallelSize": 2},
    ),
    case("encoder-has-no-data-parallel-size", "spec.encoder.dataParallelSize", {"spec.encoder.dataParallelSize": 2}),
    case("encoder-has-no-expert-parallel", "spec.encoder.expertParallel", {"spec.encoder.expertParallel": True}),
    case("data-parallel-size-zero", "spec.decode.dataParallelSize", {"spec.decode.dataParallelSize": 0}),
    case("data-parallel-size-above-64", "spec.decode.dataParallelSize", {"spec.decode.dataParallelSize": 65}),
    # ec_port + DP*TP must stay within 65536 (the last rank's port is one below): 65000 + 3*179 = 65537
    case(
        "mooncake-decode-ranks-past-65535",
        "spec.ecTransfer.mooncake.ecPort",
        {"spec.ecTransfer": {"connector": "Mooncake", "mooncake": {"ecPort": 65000}}},
        {"spec.decode.dataParallelSize": 3, "spec.decode.tensorParallelSize": 179},
    ),
    case(
        "mooncake-prefill-ranks-past-65535",
        "spec.ecTransfer.mooncake.ecPort",
        {"spec.ecTransfer": {"connector": "Mooncake", "mooncake": {"ecPort": 65000}}},
        {"spec.prefill": {"dataParallelSize": 3, "tensorParallelSize": 179}, "spec.kvTransfer": {}},
    ),
    case(
        "nixl-prefill-ranks-past-65535",
        "spec.kvTransfer.nixl.sideChannelPort",
        {"spec.prefill": {"dataParallelSize": 2}, "spec.kvTransfer": {"nixl": {"sideChannelPort": 65535}}},
    ),
    case(
        "nixl-decode-ranks-past-65535",
        "spec.kvTransfer.nixl.sideChannelPort",
        {
            "spec.prefill": {},
            "spec.decode.dataParallelSize": 3,
            "spec.kvTransfer": {"nixl": {"sideChannelPort": 65534}},
        },
    ),
    case(
        "nodes-not-dividing-tp-x-pp",
        "spec.decode.nodesPerReplica",
        {"spec.decode.nodesPerReplica": 4, "spec.decode.tensorParallelSize": 2, "spec.decode.pipelineParallelSize": 3},
    ),
    case(
        "nodes-without-tp-or-pp",
        "spec.prefill.nodesPerReplica",
        {"spec.prefill": {"nodesPerReplica": 2}, "spec.kvTransfer": {}},
    ),
    case(
        "multi-node-with-data-parallel",
        "spec.decode.dataParallelSize",
        {"spec.decode.nodesPerReplica": 2, "spec.decode.tensorParallelSize": 16, "spec.decode.dataParallelSize": 2},
    ),
    case(
        "mooncake-consumer-on-several-nodes",
        "spec.decode.nodesPerReplica",
        MOONCAKE,
        {"spec.decode.nodesPerReplica": 2, "spec.decode.tensorParallelSize": 16},
    ),
    case(
        "mooncake-prefill-consumer-on-several-nodes",
        "spec.prefill.nodesPerReplica",
        MOONCAKE,
        {"spec.prefill": {"nodesPerReplica": 2, "pipelineParallelSize": 2}, "spec.kvTransfer": {}},
    ),
    case(
        "mooncake-bad-protocol",
        "spec.ecTransfer.mooncake.protocol",
        {"spec.ecTransfer": {"connector": "Mooncake", "mooncake": {"protocol": "udp"}}},
    ),
    case(
        "min-replicas-above-max",
        "spec.encoder.autoscaling.minReplicas",
        {"spec.encoder.autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
    ),
    case(
        "router-min-replicas-above-max",
        "spec.router.autoscaling.minReplicas",
        {"spec.router.autoscaling": {"minReplicas": 5, "maxReplicas": 1}},
    ),
    case(
        "autoscaling-without-max",
        "spec.decode.autoscaling.maxReplicas",
        {"spec.decode.autoscaling": {"minReplicas": 1}},
    ),
    case("negative-replicas", "spec.decode.replicas", {"spec.decode.replicas": -1}),
    case("replicas-as-a-string", "spec.decode.replicas", {"spec.decode.replicas": "2"}),
    case("zero-tensor-parallel", "spec.decode.tensorParallelSize", {"spec.decode.tensorParallelSize": 0}),
    case("gpu-memory-above-one", "spec.decode.gpuMemoryUtilization", {"spec.decode.gpuMemoryUtilization": 1.5}),
    case("empty-model-name", "spec.model.name", {"spec.model.name": ""}),
    case("empty-image", "spec.image", {"spec.image": ""}),
    case("unknown-field-in-spec", "spec.encoders", {"spec.encoders": {}}),
    case("unknown-field-in-tier", "spec.encoder.replica", {"spec.encoder.replica": 2}),
    case(
        "unknown-field-in-connector-settings",
        "spec.ecTransfer.sharedStorage.claim",
        {"spec.ecTransfer.sharedStorage.claim": "x"},
    ),
    case("unknown-field-in-list-item", "spec.decode.env[0].valu", {"spec.decode.env": [{"name": "A", "valu": "1"}]}),
    case("unknown-field-in-router-service", "spec.router.service.prot", {"spec.router.service": {"prot": 80}}),
    case("unknown-top-level-field", "specs", {"specs": {}}),
    case(
        "quantity-with-space",
        "spec.encoder.resources.limits.memory",
        {"spec.encoder.resources.limits": {"memory": "8 GiB"}},
    ),
    case(
        "quantity-unknown-suffix",
        "spec.ecTransfer.sharedStorage.maxSize",
        {"spec.ecTransfer.sharedStorage.maxSize": "10GB"},
    ),
    case(
        "quantity-negative",
        "spec.ecTransfer.cpu.bytes",
        {"spec.ecTransfer": {"connector": "CPU", "cpu": {"bytes": "-1Gi"}}},
    ),
    case(
        "quantity-negative-number",
        "spec.decode.resources.requests.cpu",
        {"spec.decode.resources.requests": {"cpu": -2}},
    ),
    case(
        "quantity-not-a-scalar",
        "spec.decode.resources.requests.memory",
        {"spec.decode.resources.requests": {"memory": ["8Gi"]}},
    ),
    case("name-not-a-dns-label", "metadata.name", {"metadata.name": "Qwen_VL"}),
    case("name-starting-with-a-digit", "metadata.name", {"metadata.name": "2qwen"}),
    case("name-too-long-for-child-objects", "metadata.name", {"metadata.name": "a" * 48}),
    # Upstream Kubernetes types (generated schemas): typos, wrong types and bad enum values inside them.
    case("affinity-typo", "spec.encoder.affinity.nodeAffinityy", {"spec.encoder.affinity": {"nodeAffinityy": {}}}),
    case(
        "affinity-deep-typo",
        "spec.decode.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
        ".matchExpressions[0].operater",
        {
            "spec.decode.affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operater": "In", "values": ["a"]}]}]
                    }
                }
            }
        },
    ),
    case(
        "affinity-bad-selector-operator",
        "spec.router.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].podAffinityTerm"
        ".labelSelector.matchExpressions[0].operator",
        {
            "spec.router.affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Equals"}]},
                            },
                        }
                    ]
                }
            }
        },
    ),
    case(
        "affinity-weight-as-a-string",
        "spec.decode.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        {
            "spec.decode.affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": "10", "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                    ]
                }
            }
        },
    ),
    case("toleration-typo", "spec.decode.tolerations[0].efect", {"spec.decode.tolerations": [{"efect": "NoSchedule"}]}),
    case(
        "toleration-bad-operator",
        "spec.decode.tolerations[0].operator",
        {"spec.decode.tolerations": [{"key": "a", "operator": "In"}]},
    ),
    case(
        "env-value-from-typo",
        "spec.decode.env[0].valueFrom.secretKeyRefs",
        {"spec.decode.env": [{"name": "A", "valueFrom": {"secretKeyRefs": {"name": "s", "key": "k"}}}]},
    ),
    case(
        "env-value-from-missing-key",
        "spec.decode.env[0].valueFrom.secretKeyRef.key",
        {"spec.decode.env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s"}}}]},
    ),
    case(
        "metric-type-bogus",
        "spec.encoder.autoscaling.metrics[0].type",
        {"spec.encoder.autoscaling": {"maxReplicas": 4, "metrics": [{"type": "Bogus"}]}},
    ),
    case(
        "metric-target-typo",
        "spec.encoder.autoscaling.metrics[0].pods.target.averageValu",
        {
            "spec.encoder.autoscaling": {
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {"metric": {"name": "m"}, "target": {"type": "AverageValue", "averageValu": "4"}},
                    }
                ],
            }
        },
    ),
    case(
        "metric-target-bad-quantity",
        "spec.encoder.autoscaling.metrics[0].pods.target.averageValue",
        {
            "spec.encoder.autoscaling": {
                "maxReplicas": 4,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {"metric": {"name": "m"}, "target": {"type": "AverageValue", "averageValue": "4 pods"}},
                    }
                ],
            }
        },
    ),
    case(
        "behavior-typo",
        "spec.encoder.autoscaling.behavior.scaleDwn",
        {
            "spec.encoder.autoscaling": {"maxReplicas": 4, "metrics": [], "behavior": {"scaleDwn": {}}},
            "spec.encoder.resources": {"requests": {"cpu": "1"}},
        },
    ),
    case(
        "behavior-bad-select-policy",
        "spec.encoder.autoscaling.behavior.scaleUp.selectPolicy",
        {
            "spec.encoder.autoscaling": {"maxReplicas": 4, "behavior": {"scaleUp": {"selectPolicy": "Maximum"}}},
            "spec.encoder.resources": {"requests": {"cpu": "1"}},
        },
    ),
    # autoscaling needs a metric that can be computed
    case(
        "autoscaling-without-load-metrics-or-cpu-request",
        "spec.decode.autoscaling.load",
        {"spec.decode.autoscaling": {"maxReplicas": 4}},
    ),
    case(
        "load-target-below-one",
        "spec.encoder.autoscaling.load.targetPerPod",
        {"spec.encoder.autoscaling": {"maxReplicas": 4, "load": {"targetPerPod": 0}}},
    ),
    case(
        "router-autoscaling-on-load",
        "spec.router.autoscaling.load",
        {"spec.router.autoscaling": {"maxReplicas": 4, "load": {"targetPerPod": 4}}},
    ),
    case(
        "router-autoscaling-without-metrics-or-cpu",
        "spec.router.autoscaling.metrics",
        {"spec.router.autoscaling": {"maxReplicas": 4}, "spec.router.resources": {"limits": {"memory": "1Gi"}}},
    ),
    # pod overlay fields
    case(
        "pod-label-overrides-the-selector",
        "spec.decode.podLabels",
        {"spec.decode.podLabels": {"serving.epd.dev/role": "encoder"}},
    ),
    case(
        "pod-label-overrides-instance",
        "spec.router.podLabels",
        {"spec.router.podLabels": {"app.kubernetes.io/instance": "other"}},
    ),
    case(
        "pod-label-bad-value",
        "spec.decode.podLabels.kueue.x-k8s.io/queue-name",
        {"spec.decode.podLabels": {"kueue.x-k8s.io/queue-name": "not a label value"}},
    ),
    case(
        "pod-annotation-config-hash",
        "spec.encoder.podAnnotations",
        {"spec.encoder.podAnnotations": {"serving.epd.dev/config-hash": "x"}},
    ),
    case("empty-runtime-class", "spec.decode.runtimeClassName", {"spec.decode.runtimeClassName": ""}),
    case(
        "topology-spread-bad-when-unsatisfiable",
        "spec.decode.topologySpreadConstraints[0].whenUnsatisfiable",
        {
            "spec.decode.topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Never"}
            ]
        },
    ),
    case(
        "topology-spread-missing-max-skew",
        "spec.decode.topologySpreadConstraints[0].maxSkew",
        {"spec.decode.topologySpreadConstraints": [{"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
    ),
    case("volume-typo", "spec.decode.volumes[0].emptyDri", {"spec.decode.volumes": [{"name": "x", "emptyDri": {}}]}),
    case("volume-named-like-ours", "spec.decode.volumes", {"spec.decode.volumes": [{"name": "dshm", "emptyDir": {}}]}),
    case(
        "volume-names-repeated",
        "spec.decode.volumes",
        {"spec.decode.volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]},
    ),
    case(
        "volume-mount-at-our-path",
        "spec.encoder.volumeMounts",
        {
            "spec.encoder.volumes": [{"name": "x", "emptyDir": {}}],
            "spec.encoder.volumeMounts": [{"name": "x", "mountPath": "/dev/shm"}],
        },
    ),
    case(
        "volume-mount-at-the-shared-storage-path",
        "spec.decode.volumeMounts",
        {
            "spec.decode.volumes": [{"name": "x", "emptyDir": {}}],
            "spec.decode.volumeMounts": [{"name": "x", "mountPath": "/ec-cache"}],
        },
    ),
    case(
        "volume-mount-of-no-volume",
        "spec.router.volumeMounts",
        {"spec.router.volumeMounts": [{"name": "nowhere", "mountPath": "/data"}]},
    ),
    case(
        "volume-mount-missing-path",
        "spec.decode.volumeMounts[0].mountPath",
        {"spec.decode.volumes": [{"name": "x", "emptyDir": {}}], "spec.decode.volumeMounts": [{"name": "x"}]},
    ),
    case(
        "env-from-typo", "spec.decode.envFrom[0].configMapRf", {"spec.decode.envFrom": [{"configMapRf": {"name": "c"}}]}
    ),
    case(
        "pod-security-context-typo",
        "spec.decode.podSecurityContext.runAsUsr",
        {"spec.decode.podSecurityContext": {"runAsUsr": 1000}},
    ),
    case(
        "security-context-bad-seccomp",
        "spec.decode.securityContext.seccompProfile.type",
        {"spec.decode.securityContext": {"seccompProfile": {"type": "Default"}}},
    ),
    case(
        "security-context-wrong-type",
        "spec.router.securityContext.runAsNonRoot",
        {"spec.router.securityContext": {"runAsNonRoot": "yes"}},
    ),
    case(
        "mooncake-master-toleration-typo",
        "spec.ecTransfer.mooncake.master.tolerations[0].keys",
        {"spec.ecTransfer": {"connector": "Mooncake", "mooncake": {"master": {"tolerations": [{"keys": "a"}]}}}},
    ),
    # NetworkPolicies: what would make the API server refuse a policy, or lock the router out, is refused here.
    case(
        "network-policy-selector-bad-label-value",
        "spec.networkPolicy.scrapers[0].namespaceSelector.matchLabels.team",
        {"spec.networkPolicy": {"scrapers": [{"namespaceSelector": {"matchLabels": {"team": "not a value"}}}]}},
    ),
    case(
        "network-policy-selector-bad-requirement-key",
        "spec.networkPolicy.scrapers[0].podSelector.matchExpressions[0].key",
        {
            "spec.networkPolicy": {
                "scrapers": [{"podSelector": {"matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]}}]
            }
        },
    ),
    case(
        "network-policy-selector-unknown-operator",
        "spec.networkPolicy.routerFrom[0].podSelector.matchExpressions[0].operator",
        {
            "spec.networkPolicy": {
                "routerFrom": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "Is"}]}}]
            }
        },
    ),
    case(
        "network-policy-selector-in-without-values",
        "spec.networkPolicy.routerFrom[0].podSelector.matchExpressions[0].values",
        {
            "spec.networkPolicy": {
                "routerFrom": [{"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}]
            }
        },
    ),
    case(
        "network-policy-selector-exists-with-values",
        "spec.networkPolicy.scrapers[0].podSelector.matchExpressions[0].values",
        {
            "spec.networkPolicy": {
                "scrapers": [
                    {"podSelector": {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["a"]}]}}
                ]
            }
        },
    ),
    case(
        "network-policy-empty-router-from",
        "spec.networkPolicy.routerFrom",
        {"spec.networkPolicy": {"routerFrom": []}},
    ),
    case(
        "network-policy-router-peer-without-selector",
        "spec.networkPolicy.routerFrom[0].podSelector",
        {"spec.networkPolicy": {"routerFrom": [{}]}},
    ),
    case(
        "network-policy-egress-port-zero",
        "spec.networkPolicy.egressTo[0].ports[0]",
        {"spec.networkPolicy": {"egressTo": [{"cidr": "10.0.0.1/32", "ports": [0]}]}},
    ),
    case(
        "network-policy-egress-port-above-65535",
        "spec.networkPolicy.egressTo[0].ports[1]",
        {"spec.networkPolicy": {"egressTo": [{"cidr": "10.0.0.1/32", "ports": [443, 65536]}]}},
    ),
    case(
        "network-policy-egress-cidr-that-does-not-parse",
        "spec.networkPolicy.egressTo[0].cidr",
        {"spec.networkPolicy": {"egressTo": [{"cidr": "10.0.0.300/32"}]}},
    ),
    case(
        "network-policy-egress-cidr-and-selector",
        "spec.networkPolicy.egressTo[0].cidr",
        {"spec.networkPolicy": {"egressTo": [{"cidr": "10.0.0.1/32", "podSelector": {}}]}},
    ),
    case(
        "network-policy-egress-destination-of-nothing",
        "spec.networkPolicy.egressTo[0].cidr",
        {"spec.networkPolicy": {"egressTo": [{"ports": [443]}]}},
    ),
    case("network-policy-empty-egress", "spec.networkPolicy.egressTo", {"spec.networkPolicy": {"egressTo": []}}),
]


GOOD_SPECS = [
    pytest.param(minimal(), id="minimal-e+pd"),
    pytest.param(spec_with({"spec.prefill": {}, "spec.kvTransfer": {}}), id="e/p/d-with-default-nixl"),
    pytest.param(spec_with(CPU_WITHOUT_SHARED), id="cpu-connector"),
    pytest.param(spec_with(MOONCAKE), id="mooncake-defaults"),
    pytest.param(spec_with({"metadata.name": "a" * 47}), id="longest-name"),
    pytest.param(spec_with({"spec.networkPolicy": {"enabled": False}}), id="network-policy-off"),
    pytest.param(
        spec_with(
            {
                "spec.networkPolicy": {
                    "scrapers": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                            "podSelector": {
                                "matchExpressions": [
                                    {"key": "app.kubernetes.io/name", "operator": "In", "values": ["prometheus"]},
                                    {"key": "example.com/scraper", "operator": "Exists"},
                                ]
                            },
                        }
                    ],
                    "routerFrom": [{"namespaceSelector": {"matchLabels": {"gateway": "true"}}, "podSelector": {}}],
                    "egressTo": [
                        {"cidr": "10.96.0.1/32", "ports": [443]},
                        {"cidr": "fd00::/64"},
                        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "otel-collector"}}},
                    ],
                }
            }
        ),
        id="network-policy-widened-and-narrowed",
    ),
    pytest.param(spec_with({"spec.networkPolicy": {"scrapers": []}}), id="network-policy-no-scrapers"),
    pytest.param(spec_with({"spec.decode.dataParallelSize": 64, "spec.decode.expertParallel": True}), id="dp-64-ep"),
    # the last rank's ports sit exactly on 65535: 65000 + 8*67 - 1, and 65534 + 2 - 1
    pytest.param(
        spec_with(
            {
                "spec.ecTransfer": {"connector": "Mooncake", "mooncake": {"ecPort": 65000}},
                "spec.decode.dataParallelSize": 8,
                "spec.decode.tensorParallelSize": 67,
            }
        ),
        id="mooncake-last-rank-on-65535",
    ),
    pytest.param(
        spec_with(
            {
                "spec.prefill": {"dataParallelSize": 2},
                "spec.decode.dataParallelSize": 2,
                "spec.kvTransfer": {"nixl": {"sideChannelPort": 65534}},
            }
        ),
        id="nixl-last-rank-on-65535",
    ),
    pytest.param(
        spec_with(
            {
                "spec.decode.nodesPerReplica": 4,
                "spec.decode.tensorParallelSize": 8,
                "spec.decode.pipelineParallelSize": 2,
            }
        ),
        id="multi-node-tp-x-pp",
    ),
    pytest.param(
        spec_with(
            MOONCAKE,
            {
                "spec.prefill": {},
                "spec.kvTransfer": {},
                "spec.decode.nodesPerReplica": 2,
                "spec.decode.tensorParallelSize": 2,
            },
        ),
        id="mooncake-multi-node-decode-in-e/p/d",
    ),
    pytest.param(
        spec_with(
            {
                "spec.decode.autoscaling": {
                    "minReplicas": 2,
                    "maxReplicas": 2,
                    "metrics": [
                        {
                            "type": "Pods",
                            "pods": {"metric": {"name": "m"}, "target": {"type": "AverageValue", "averageValue": "4"}},
                        }
                    ],
                }
            }
        ),
        id="min-equals-max",
    ),
    pytest.param(
        spec_with({"spec.decode.autoscaling": {"maxReplicas": 3}, "spec.decode.resources": {"requests": {"cpu": "2"}}}),
        id="default-cpu-metric-with-a-cpu-request",
    ),
    pytest.param(
        spec_with({"spec.router.autoscaling": {"maxReplicas": 3}}),
        id="router-default-cpu-metric-on-its-default-request",
    ),
    pytest.param(
        spec_with(
            {
                "spec.decode.affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}
                            ]
                        }
                    }
                },
                "spec.decode.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "spec.decode.topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": {"a": "b"}},
                    }
                ],
                "spec.decode.podLabels": {"kueue.x-k8s.io/queue-name": "gpu-queue"},
                "spec.decode.podAnnotations": {"sidecar.istio.io/inject": "false"},
                "spec.decode.priorityClassName": "inference",
                "spec.decode.runtimeClassName": "nvidia",
                "spec.decode.schedulerName": "volcano",
                "spec.decode.volumes": [
                    {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
                    {"name": "certs", "secret": {"secretName": "tls", "defaultMode": 0o400}},
                ],
                "spec.decode.volumeMounts": [
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "certs", "mountPath": "/certs", "readOnly": True},
                ],
                "spec.decode.envFrom": [
                    {"configMapRef": {"name": "tuning"}},
                    {"secretRef": {"name": "keys"}, "prefix": "K_"},
                ],
                "spec.decode.podSecurityContext": {"fsGroup": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                "spec.decode.securityContext": {"readOnlyRootFilesystem": False, "capabilities": {"drop": ["ALL"]}},
                "spec.encoder.autoscaling": {
                    "maxReplicas": 4,
                    "metrics": [
                        {
                            "type": "External",
                            "external": {
                                "metric": {"name": "queue", "selector": {"matchLabels": {"q": "a"}}},
                                "target": {"type": "Value", "value": "100m"},
                            },
                        }
                    ],
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "selectPolicy": "Min",
                            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
                        }
                    },
                },
                "spec.router.env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}}}
                ],
            }
        ),
        id="every-overlay-field",
    ),
    pytest.param(
        spec_with(
            {
                "spec.ecTransfer": {
                    "connector": "Mooncake",
                    "mooncake": {
                        "crossEncoderCache": True,
                        "master": {
                            "nodeSelector": {"pool": "cpu"},
                            "priorityClassName": "p",
                            "tolerations": [{"key": "a", "operator": "Exists"}],
                            "resources": {"limits": {"memory": "4Gi"}},
                        },
                    },
                }
            }
        ),
        id="mooncake-master-placement",
    ),
    pytest.param(
        spec_with({"spec.decode.resources": {"limits": {"nvidia.com/gpu": 1, "memory": "64Gi", "cpu": "500m"}}}),
        id="quantities",
    ),
    pytest.param(
        spec_with({"spec.decode.env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}), id="env-source"
    ),
    *[pytest.param(load_spec(p), id=f"examples/{p.name}") for p in EXAMPLES],
]


def refusal_paths(obj: dict[str, Any]) -> list[str]:
    try:
        parse_epd(obj)
    except SpecError as exc:
        return [e.path for e in exc.errors]
    return []


# Refused by `parse_epd` (the operator, `epdctl`) but not by the CRD: a CRD schema cannot bound a map
# key's length, so a CEL regex over matchLabels keys would exceed the API server's cost budget. The
# operator refuses such a spec before rendering anything, so no NetworkPolicy is half-applied.
BAD_SPECS_ONLY_THE_OPERATOR_SEES = [
    case(
        "network-policy-selector-bad-label-key",
        "spec.networkPolicy.scrapers[0].podSelector.matchLabels",
        {"spec.networkPolicy": {"scrapers": [{"podSelector": {"matchLabels": {"-bad key": "x"}}}]}},
    ),
    case(
        "network-policy-selector-label-key-too-long",
        "spec.networkPolicy.routerFrom[0].namespaceSelector.matchLabels",
        {"spec.networkPolicy": {"routerFrom": [{"namespaceSelector": {"matchLabels": {"a" * 64: "x"}}}]}},
    ),
]


# ----------------------------------------------------------------------------- parse_epd


@pytest.mark.parametrize("doc, path", BAD_SPECS + BAD_SPECS_ONLY_THE_OPERATOR_SEES)
def test_parse_epd_refuses_with_the_field_path(doc, path):
    with pytest.raises(SpecError) as refused:
        parse_epd(copy.deepcopy(doc))
    paths = [e.path for e in refused.value.errors]
    assert path in paths, f"expected {path!r} among {paths}: {refused.value}"
    assert all(e.message for e in refused.value.errors)


@pytest.mark.parametrize("doc", GOOD_SPECS)
def test_parse_epd_accepts(doc):
    assert refusal_paths(doc) == []


def test_every_problem_is_reported_in_one_round():
    doc = spec_with({"spec.decode.replicas": -1, "spec.encoder.replica": 2, "metadata.name": "Bad"})
    paths = refusal_paths(doc)
    assert {"spec.decode.replicas", "spec.encoder.replica"} <= set(paths)


def test_a_non_mapping_is_refused():
    with pytest.raises(SpecError, match="mapping"):
        parse_epd(["not", "a", "spec"])  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- epdctl


def _write(tmp_path: Path, doc: Any) -> str:
    path = tmp_path / "epd.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("doc, path", BAD_SPECS + BAD_SPECS_ONLY_THE_OPERATOR_SEES)
def test_epdctl_refuses_with_the_path_on_stderr_and_nothing_on_stdout(tmp_path, capsys, command, doc, path):
    with pytest.raises(SystemExit) as exit_:
        epdctl([command, "-f", _write(tmp_path, doc)])
    out, err = capsys.readouterr()
    assert exit_.value.code == 1
    assert out == ""
    assert f"{path}:" in err


# ----------------------------------------------------------------------------- the CRD agrees


def crd_refusals(obj: dict[str, Any]) -> list[str]:
    stored = default_and_prune(CRD, obj)
    # `kubectl apply` asks for fieldValidation=Strict: what pruning would drop is refused
    return [*(f"{path}: unknown field" for path in unknown_fields(obj, stored)), *validate_custom_object(CRD, stored)]


@pytest.mark.parametrize("doc, path", BAD_SPECS)
def test_the_crd_refuses_what_parse_epd_refuses(doc, path):
    errors = crd_refusals(copy.deepcopy(doc))
    assert errors, "the API server would accept a spec that epdctl and the operator refuse"
    where = {e.split(":", 1)[0] for e in errors}
    assert path in where, errors


@pytest.mark.parametrize("doc, path", BAD_SPECS_ONLY_THE_OPERATOR_SEES)
def test_the_crd_leaves_matchlabels_keys_to_the_operator(doc, path):
    assert crd_refusals(copy.deepcopy(doc)) == []


@pytest.mark.parametrize("doc", GOOD_SPECS)
def test_the_crd_accepts_what_parse_epd_accepts(doc):
    assert crd_refusals(copy.deepcopy(doc)) == []


def test_crd_defaults_are_what_the_models_default_to():
    stored = default_and_prune(CRD, minimal())
    parsed = parse_epd(minimal()).model_dump(mode="json", exclude_none=True)
    assert parse_epd(stored).model_dump(mode="json", exclude_none=True) == parsed
    assert stored["spec"]["ecTransfer"]["sharedStorage"]["ttlSeconds"] == 600


def test_a_kube_schema_refusal_names_every_problem_with_its_path_in_one_message():
    """An upstream type's problems (api/fields.py `_kube_check`) reach the user as one message, each problem
    with its path inside the field, joined by '; ' (the field path itself is the error's location)."""
    from pydantic import BaseModel, ValidationError

    from epd_operator.api.fields import Affinity

    class Holder(BaseModel):
        affinity: Affinity

    with pytest.raises(ValidationError) as refused:
        Holder(affinity={"nodeAffinityy": {}, "podAffinity": 3})
    (error,) = refused.value.errors()
    assert error["type"] == "kube_schema"
    assert error["msg"] == ".nodeAffinityy: unknown field (typo?); .podAffinity: 3 must be an object"
    assert error["ctx"]["problems"] == [
        (".nodeAffinityy", "unknown field (typo?)"),
        (".podAffinity", "3 must be an object"),
    ]
    assert Holder(affinity={"podAffinity": {}}).affinity == {"podAffinity": {}}
