"""Every cross-field rule of api/rules.py: the exact message and field path a user reads, where each rule
stops holding (ports at 65535, name lengths at 47), and the parts of `parse_epd` that shape what is
reported. Expected messages are written out, so a rule that refuses the right field with the wrong words
(or for the wrong reason) fails here; api/test_validation.py checks the same table against the CRD."""

from __future__ import annotations

from typing import Any

import cel
import pytest
from pydantic import BaseModel

from epd_operator.api.router import Router
from epd_operator.api.rules import (
    RULES,
    SUPPORTED_REASONS,
    Rule,
    _cel_list,
    _cel_string,
    _dp_ports_fit,
    _encoder_at_zero_needs_raw_media,
    _no_shared_storage_mount,
    _settings_only_for,
    cannot_encode,
    rules_for,
)
from epd_operator.api.spec import EPDDeployment, EPDDeploymentSpec
from epd_operator.api.tiers import ConsumerTier, EncoderTier, Placement, Tier
from epd_operator.api.transfer import ECTransfer
from epd_operator.api.validation import FieldError, SpecError, _path, _walk, parse_epd
from tests.support.epd_specs import spec

SHARED_PATH_MOUNTED = (
    "the shared-storage path (ecTransfer.sharedStorage.path) is mounted by the operator; mount elsewhere"
)
PORT_SHIFT = (
    "{what} shifts with the {tier} tier's data-parallel rank and would pass 65535; lower it or the tier's "
    "dataParallelSize"
)
EC_PORT = "ecPort (one control port per data-parallel and tensor-parallel rank)"
NIXL_PORT = "the NIXL side-channel port"
MOONCAKE_MULTI_NODE = (
    "the Mooncake EC connector's consumer binds a control port per rank on its own pod, which the "
    "router can only address on a single-node replica; use nodesPerReplica 1 (or the SharedStorage "
    "or CPU connector)"
)


MOONCAKE = {"connector": "Mooncake"}
CPU_REQUEST = {"requests": {"cpu": "1"}}
EPD_P: dict[str, Any] = {"spec__prefill": {}}
KEDA_PROMETHEUS = {"prometheusAddress": "http://prometheus:9090"}
KEDA_LOAD: dict[str, Any] = {"load": {"targetPerPod": 2}, "keda": KEDA_PROMETHEUS}
KEDA_AT_ZERO = {"autoscaling": {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 2, **KEDA_LOAD}}
FALLBACK = {"failureThreshold": 3, "replicas": 2}
CPU_TRIGGER = {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}
CRON_TRIGGER = {
    "type": "cron",
    "metadata": {"timezone": "UTC", "start": "0 8 * * *", "end": "0 9 * * *", "desiredReplicas": "2"},
}
CPU_ONLY_WITH_FALLBACK = {"triggers": [CPU_TRIGGER], "fallback": FALLBACK}
FALLBACK_NEEDS = (
    "KEDA's fallback can only stand in for a trigger that is not cpu or memory, and this tier's ScaledObject would "
    "have none (KEDA's webhook refuses it): scale on load (load.targetPerPod), add such a trigger to keda.triggers, "
    "or remove the fallback"
)


def errors_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_epd(doc)
    assert str(caught.value) == "\n".join(str(e) for e in caught.value.errors)
    return [str(e) for e in caught.value.errors]


REFUSED = [
    (
        "name-48-chars",
        spec(metadata={"name": "a" * 48}),
        "metadata.name: must be at most 47 characters (child objects append suffixes such as '-mooncake-master')",
    ),
    (
        "name-not-dns-1035",
        spec(metadata={"name": "1abc"}),
        "metadata.name: must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): "
        "it names Services",
    ),
    (
        "name-trailing-dash",
        spec(metadata={"name": "abc-"}),
        "metadata.name: must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): "
        "it names Services",
    ),
    (
        "kv-without-prefill",
        spec(spec__kvTransfer={}),
        "spec.kvTransfer: kvTransfer moves KV from prefill to decode and needs a prefill tier (E/P/D); remove it for E+PD",
    ),
    (
        "mooncake-encoder-tp",
        spec(spec__ecTransfer=MOONCAKE, spec__encoder={"tensorParallelSize": 2}),
        "spec.encoder.tensorParallelSize: the Mooncake EC connector needs an encoder tensorParallelSize of 1 "
        "(vLLM refuses to start otherwise)",
    ),
    (
        "mooncake-encoder-pp",
        spec(spec__ecTransfer=MOONCAKE, spec__encoder={"pipelineParallelSize": 2}),
        "spec.encoder.pipelineParallelSize: the Mooncake EC connector needs an encoder pipelineParallelSize of 1 "
        "(vLLM refuses to start otherwise)",
    ),
    # E+PD: decode is the EC consumer; 65000 + 3 x 179 = 65537 ports' worth
    (
        "mooncake-ports-decode",
        spec(
            spec__ecTransfer={"connector": "Mooncake", "mooncake": {"ecPort": 65000}},
            spec__decode={"dataParallelSize": 3, "tensorParallelSize": 179},
        ),
        "spec.ecTransfer.mooncake.ecPort: " + PORT_SHIFT.format(what=EC_PORT, tier="decode"),
    ),
    (
        "mooncake-ports-prefill",
        spec(
            spec__ecTransfer={"connector": "Mooncake", "mooncake": {"ecPort": 65000}},
            spec__prefill={"dataParallelSize": 3, "tensorParallelSize": 179},
        ),
        "spec.ecTransfer.mooncake.ecPort: " + PORT_SHIFT.format(what=EC_PORT, tier="prefill"),
    ),
    (
        "nixl-ports-prefill",
        spec(spec__prefill={"dataParallelSize": 2}, spec__kvTransfer={"nixl": {"sideChannelPort": 65535}}),
        "spec.kvTransfer.nixl.sideChannelPort: " + PORT_SHIFT.format(what=NIXL_PORT, tier="prefill"),
    ),
    (
        "nixl-ports-decode",
        spec(
            spec__prefill={},
            spec__decode={"dataParallelSize": 2},
            spec__kvTransfer={"nixl": {"sideChannelPort": 65535}},
        ),
        "spec.kvTransfer.nixl.sideChannelPort: " + PORT_SHIFT.format(what=NIXL_PORT, tier="decode"),
    ),
    (
        "nodes-not-dividing",
        spec(spec__decode={"nodesPerReplica": 2, "tensorParallelSize": 3}),
        "spec.decode.nodesPerReplica: must divide tensorParallelSize x pipelineParallelSize: every node of a replica "
        "runs an equal share of its GPUs (vLLM refuses an --nnodes that does not divide the world size)",
    ),
    (
        "multi-node-dp",
        spec(spec__decode={"nodesPerReplica": 2, "tensorParallelSize": 2, "dataParallelSize": 2}),
        "spec.decode.dataParallelSize: a multi-node tier (nodesPerReplica > 1) runs one data-parallel rank per replica; "
        "scale it with replicas",
    ),
    (
        "shared-storage-missing",
        spec(spec__ecTransfer={"connector": "SharedStorage"}),
        "spec.ecTransfer.sharedStorage: sharedStorage.claimName is required with connector SharedStorage "
        "(an RWX claim mounted by every tier)",
    ),
    (
        "cpu-missing",
        spec(spec__ecTransfer={"connector": "CPU"}),
        "spec.ecTransfer.cpu: cpu.bytes is required with connector CPU (the size of the shared-memory region)",
    ),
    (
        "shared-storage-with-cpu",
        spec(spec__ecTransfer={"connector": "CPU", "cpu": {"bytes": "1Gi"}, "sharedStorage": {"claimName": "x"}}),
        "spec.ecTransfer.sharedStorage: sharedStorage settings are only used with connector SharedStorage; "
        "remove them or change the connector",
    ),
    (
        "mooncake-with-shared",
        spec(spec__ecTransfer={"connector": "SharedStorage", "sharedStorage": {"claimName": "x"}, "mooncake": {}}),
        "spec.ecTransfer.mooncake: mooncake settings are only used with connector Mooncake; "
        "remove them or change the connector",
    ),
    (
        "cpu-with-mooncake",
        spec(spec__ecTransfer={"connector": "Mooncake", "cpu": {"bytes": "1Gi"}}),
        "spec.ecTransfer.cpu: cpu settings are only used with connector CPU; remove them or change the connector",
    ),
    (
        "min-over-max",
        spec(spec__decode={"autoscaling": {"minReplicas": 3, "maxReplicas": 2}, "resources": CPU_REQUEST}),
        "spec.decode.autoscaling.minReplicas: minReplicas must not exceed maxReplicas",
    ),
    (
        "autoscaling-without-load-metrics-or-cpu",
        spec(spec__decode={"autoscaling": {"maxReplicas": 2}}),
        "spec.decode.autoscaling.load: autoscaling needs a metric: set load.targetPerPod (requests in flight per pod, "
        "from the routers), metrics or keda.triggers; the fallback, CPU utilisation, cannot be computed without a "
        "CPU request "
        "(resources.requests.cpu) on this tier",
    ),
    (
        "hpa-encoder-at-zero",
        spec(spec__encoder={"autoscaling": {"minReplicas": 0, "maxReplicas": 2}}),
        "spec.encoder.autoscaling.minReplicas: minReplicas 0 (scale to zero) needs engine KEDA: an HPA never scales "
        "a tier below one pod",
    ),
    (
        "keda-decode-at-zero",
        spec(spec__decode={"autoscaling": {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 2, **KEDA_LOAD}}),
        "spec.decode.autoscaling.minReplicas: only the encoder tier may scale to zero: prefill and decode serve every "
        "request",
    ),
    (
        "keda-prefill-at-zero",
        spec(
            spec__prefill={"autoscaling": {"engine": "KEDA", "minReplicas": 0, "maxReplicas": 2, **KEDA_LOAD}},
        ),
        "spec.prefill.autoscaling.minReplicas: only the encoder tier may scale to zero: prefill and decode serve "
        "every request",
    ),
    (
        "encoder-at-zero-before-a-language-model-only-decode",
        spec(spec__encoder=KEDA_AT_ZERO, spec__decode={"extraArgs": ["--language-model-only"]}),
        "spec.encoder.autoscaling.minReplicas: an encoder tier at zero leaves the media to the decode tier, whose "
        "--language-model-only cannot encode it; keep minReplicas at 1 or more, or let that tier load the vision "
        "encoder",
    ),
    (
        "encoder-at-zero-before-a-language-model-only-prefill",
        spec(spec__encoder=KEDA_AT_ZERO, spec__prefill={"extraArgs": ["--language-model-only=true"]}),
        "spec.encoder.autoscaling.minReplicas: an encoder tier at zero leaves the media to the prefill tier, whose "
        "--language-model-only cannot encode it; keep minReplicas at 1 or more, or let that tier load the vision "
        "encoder",
    ),
    (
        "keda-fallback-on-an-encoder-whose-only-trigger-is-cpu",
        spec(spec__encoder={"autoscaling": {"engine": "KEDA", "maxReplicas": 2, "keda": CPU_ONLY_WITH_FALLBACK}}),
        f"spec.encoder.autoscaling.keda.fallback: {FALLBACK_NEEDS}",
    ),
    (
        "keda-fallback-on-a-decode-tier-on-cpu",
        spec(
            spec__decode={
                "autoscaling": {"engine": "KEDA", "maxReplicas": 2, "keda": {"fallback": FALLBACK}},
                "resources": CPU_REQUEST,
            }
        ),
        f"spec.decode.autoscaling.keda.fallback: {FALLBACK_NEEDS}",
    ),
    (
        "keda-fallback-behaviour-scaling-modifiers",
        spec(
            spec__encoder={
                "autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 2,
                    **KEDA_LOAD,
                    "keda": {**KEDA_PROMETHEUS, "fallback": {**FALLBACK, "behavior": "scalingModifiers"}},
                }
            }
        ),
        "spec.encoder.autoscaling.keda.fallback.behavior: fallback behavior scalingModifiers needs a "
        "scalingModifiers formula, which the operator does not render; use static, currentReplicas, "
        "currentReplicasIfHigher or currentReplicasIfLower",
    ),
    (
        "keda-settings-with-an-hpa",
        spec(spec__encoder={"autoscaling": {"maxReplicas": 2, "keda": {"cooldownPeriod": 60}}}),
        "spec.encoder.autoscaling.keda: keda settings are only used with engine KEDA; remove them or set engine: KEDA",
    ),
    (
        "hpa-metrics-with-keda",
        spec(
            spec__encoder={
                "autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 2,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}],
                }
            }
        ),
        "spec.encoder.autoscaling.metrics: metrics are autoscaling/v2 MetricSpecs for an HPA; with engine KEDA write "
        "KEDA triggers in keda.triggers",
    ),
    (
        "router-autoscaling-without-metrics-or-cpu",
        spec(spec__router={"autoscaling": {"maxReplicas": 2}, "resources": {"limits": {"memory": "1Gi"}}}),
        "spec.router.autoscaling.metrics: autoscaling needs metrics: the default (CPU utilisation) cannot be computed "
        "without a CPU request (resources.requests.cpu) on this tier; add metrics or a CPU request",
    ),
    (
        "operator-label",
        spec(spec__router={"podLabels": {"serving.epd.dev/role": "x"}}),
        "spec.router.podLabels: the operator's own labels (app.kubernetes.io/name, app.kubernetes.io/instance, "
        "app.kubernetes.io/component, app.kubernetes.io/managed-by, serving.epd.dev/role, "
        "serving.epd.dev/compat-generation) select the pods and may not be set",
    ),
    (
        "operator-annotation",
        spec(spec__decode={"podAnnotations": {"serving.epd.dev/config-hash": "x"}}),
        "spec.decode.podAnnotations: the operator's own annotations (serving.epd.dev/config-hash) may not be set",
    ),
    (
        "operator-volume",
        spec(spec__encoder={"volumes": [{"name": "tmp", "emptyDir": {}}]}),
        "spec.encoder.volumes: volume names must be unique and not one the operator uses "
        "(dshm, models, ec-cache, mooncake-store, tmp)",
    ),
    (
        "duplicate-volume",
        spec(spec__encoder={"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}),
        "spec.encoder.volumes: volume names must be unique and not one the operator uses "
        "(dshm, models, ec-cache, mooncake-store, tmp)",
    ),
    (
        "operator-mount",
        spec(
            spec__decode={
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/models"}],
            }
        ),
        "spec.decode.volumeMounts: mount paths must be unique and not one the operator mounts "
        "(/dev/shm, /models, /etc/epd/mooncake, /tmp)",
    ),
    (
        "mount-without-volume",
        spec(spec__decode={"volumeMounts": [{"name": "nope", "mountPath": "/data"}]}),
        "spec.decode.volumeMounts: every volumeMount must name a volume of this tier's `volumes`",
    ),
    (
        "mount-on-shared-path-encoder",
        spec(
            spec__encoder={
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/ec-cache"}],
            }
        ),
        "spec.encoder.volumeMounts: " + SHARED_PATH_MOUNTED,
    ),
    (
        "mount-on-shared-path-prefill",
        spec(
            spec__prefill={
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/ec-cache"}],
            }
        ),
        "spec.prefill.volumeMounts: " + SHARED_PATH_MOUNTED,
    ),
    (
        "mount-on-custom-shared-path-decode",
        spec(
            spec__ecTransfer={"connector": "SharedStorage", "sharedStorage": {"claimName": "c", "path": "/cache"}},
            spec__decode={
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/cache"}],
            },
        ),
        "spec.decode.volumeMounts: " + SHARED_PATH_MOUNTED,
    ),
]


@pytest.mark.parametrize("doc,expected", [pytest.param(d, e, id=i) for i, d, e in REFUSED])
def test_each_rule_refuses_with_its_path_and_words(doc, expected):
    assert errors_of(doc) == [expected]


def test_only_the_mooncake_consumer_must_stay_on_one_node():
    multi_node = {"nodesPerReplica": 2, "tensorParallelSize": 2}
    # E/P/D: prefill consumes the embeddings, decode may span nodes
    assert errors_of(spec(spec__ecTransfer=MOONCAKE, spec__prefill=multi_node)) == [
        f"spec.prefill.nodesPerReplica: {MOONCAKE_MULTI_NODE}"
    ]
    parse_epd(spec(spec__ecTransfer=MOONCAKE, spec__prefill={}, spec__decode=multi_node))
    # E+PD: decode is the consumer
    assert errors_of(spec(spec__ecTransfer=MOONCAKE, spec__decode=multi_node)) == [
        f"spec.decode.nodesPerReplica: {MOONCAKE_MULTI_NODE}"
    ]
    parse_epd(spec(spec__decode=multi_node))  # SharedStorage: any tier may


ACCEPTED = [
    ("keda-encoder-at-zero", spec(spec__encoder=KEDA_AT_ZERO)),
    (
        "keda-encoder-at-zero-before-a-language-model-only-decode-in-e-p-d",
        spec(spec__encoder=KEDA_AT_ZERO, spec__prefill={}, spec__decode={"extraArgs": ["--language-model-only"]}),
    ),
    (
        "keda-decode-on-its-triggers",
        spec(
            spec__decode={
                "autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 2,
                    "keda": {
                        "triggers": [
                            {
                                "type": "cron",
                                "metadata": {
                                    "timezone": "UTC",
                                    "start": "0 8 * * *",
                                    "end": "0 9 * * *",
                                    "desiredReplicas": "2",
                                },
                            }
                        ]
                    },
                }
            }
        ),
    ),
    ("name-47-chars", spec(metadata={"name": "a" * 47})),
    ("name-with-digits-and-dashes", spec(metadata={"name": "a-1-b"})),
    (
        "mooncake-encoder-tp-1",
        spec(spec__ecTransfer=MOONCAKE, spec__encoder={"tensorParallelSize": 1, "pipelineParallelSize": 1}),
    ),
    ("shared-storage-encoder-tp-2", spec(spec__encoder={"tensorParallelSize": 2})),
    (
        "mooncake-ports-exactly-fit",
        spec(
            spec__ecTransfer={"connector": "Mooncake", "mooncake": {"ecPort": 65000}},
            spec__decode={"dataParallelSize": 8, "tensorParallelSize": 67},
        ),
    ),
    (
        "mooncake-prefill-consumer-decode-free",
        spec(
            spec__ecTransfer={"connector": "Mooncake", "mooncake": {"ecPort": 65000}},
            spec__prefill={},
            spec__decode={"dataParallelSize": 3, "tensorParallelSize": 179},
        ),
    ),
    ("nixl-port-exactly-fits", spec(spec__prefill={}, spec__kvTransfer={"nixl": {"sideChannelPort": 65535}})),
    ("nixl-in-e-pd-is-unused", spec(spec__decode={"dataParallelSize": 2})),
    ("nodes-dividing", spec(spec__decode={"nodesPerReplica": 2, "tensorParallelSize": 2, "pipelineParallelSize": 3})),
    ("nodes-dividing-pp", spec(spec__decode={"nodesPerReplica": 2, "pipelineParallelSize": 2})),
    ("one-node-dp", spec(spec__decode={"nodesPerReplica": 1, "dataParallelSize": 2})),
    (
        "min-equals-max",
        spec(spec__decode={"autoscaling": {"minReplicas": 2, "maxReplicas": 2}, "resources": CPU_REQUEST}),
    ),
    (
        "autoscaling-with-cpu-request",
        spec(spec__decode={"autoscaling": {"maxReplicas": 2}, "resources": {"requests": {"cpu": "1"}}}),
    ),
    (
        "autoscaling-with-cpu-limit",
        spec(spec__decode={"autoscaling": {"maxReplicas": 2}, "resources": {"limits": {"cpu": "1"}}}),
    ),
    ("decode-autoscaling-on-load", spec(spec__decode={"autoscaling": {"maxReplicas": 2, "load": {"targetPerPod": 8}}})),
    ("encoder-autoscaling-on-its-default-load", spec(spec__encoder={"autoscaling": {"maxReplicas": 2}})),
    (
        "keda-fallback-on-the-encoders-default-load",
        spec(
            spec__encoder={
                "autoscaling": {"engine": "KEDA", "maxReplicas": 2, "keda": {**KEDA_PROMETHEUS, "fallback": FALLBACK}}
            }
        ),
    ),
    (
        "keda-fallback-beside-a-cpu-trigger-with-load",
        spec(
            spec__encoder={
                "autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 2,
                    **KEDA_LOAD,
                    "keda": {**KEDA_PROMETHEUS, **CPU_ONLY_WITH_FALLBACK},
                }
            }
        ),
    ),
    (
        "keda-fallback-on-decode-with-a-cron-trigger",
        spec(
            spec__decode={
                "autoscaling": {
                    "engine": "KEDA",
                    "maxReplicas": 2,
                    "keda": {
                        "triggers": [CPU_TRIGGER, CRON_TRIGGER],
                        "fallback": {**FALLBACK, "behavior": "currentReplicas"},
                    },
                },
                "resources": CPU_REQUEST,
            }
        ),
    ),
    ("router-autoscaling-with-its-cpu-request", spec(spec__router={"autoscaling": {"maxReplicas": 2}})),
    (
        "own-labels-and-volumes",
        spec(
            spec__decode={
                "podLabels": {"team": "a"},
                "podAnnotations": {"a": "b"},
                "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/a"}, {"name": "dshm", "mountPath": "/b"}],
            }
        ),
    ),
    (
        "shared-path-mount-with-another-connector",
        spec(
            spec__ecTransfer={"connector": "CPU", "cpu": {"bytes": "1Gi"}},
            spec__decode={
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/ec-cache"}],
            },
        ),
    ),
]


@pytest.mark.parametrize("doc", [pytest.param(d, id=i) for i, d in ACCEPTED])
def test_valid_neighbours_of_each_rule_are_accepted(doc):
    assert parse_epd(doc).metadata.name == doc["metadata"]["name"]


def test_every_broken_rule_is_reported_in_one_round_in_order():
    doc = spec(
        metadata={"name": "a" * 48},
        spec__kvTransfer={},
        spec__encoder={"podAnnotations": {"serving.epd.dev/config-hash": "x"}},
    )
    assert [e.split(":")[0] for e in errors_of(doc)] == [
        "metadata.name",
        "spec.kvTransfer",
        "spec.encoder.podAnnotations",
    ]


def test_schema_errors_name_the_field_and_say_what_is_wrong():
    doc = spec(spec__decode={"replicas": -1, "bogus": 1}, spec__ecTransfer={"connector": "Nixl"})
    assert errors_of(doc) == [
        "spec.decode.replicas: Input should be greater than or equal to 0",
        "spec.decode.bogus: unknown field (typo?)",
        "spec.ecTransfer.connector: 'Nixl' is not supported; input should be 'SharedStorage', 'Mooncake' or 'CPU'",
    ]
    assert errors_of(spec(spec__model=None)) == ["spec.model: Field required"]


def test_load_autoscaling_is_refused_where_no_load_is_measured_and_below_one():
    doc = spec(
        spec__router={"autoscaling": {"maxReplicas": 2, "load": {"targetPerPod": 4}}},
        spec__encoder={"autoscaling": {"maxReplicas": 2, "load": {"targetPerPod": 0}}},
        spec__decode={"autoscaling": {"maxReplicas": 2, "load": {}}},
    )
    assert errors_of(doc) == [
        "spec.encoder.autoscaling.load.targetPerPod: Input should be greater than or equal to 1",
        "spec.decode.autoscaling.load.targetPerPod: Field required",
        "spec.router.autoscaling.load: unknown field (typo?)",
    ]


def test_a_bad_kubernetes_type_inside_the_spec_names_each_field_once():
    doc = spec(spec__decode={"volumes": [{"name": "a", "emptyDir": {}, "bogus": 1, "hostPath": 3}]})
    assert errors_of(doc) == [
        "spec.decode.volumes[0].bogus: unknown field (typo?)",
        "spec.decode.volumes[0].hostPath: 3 must be an object",
    ]


def test_rules_run_only_on_a_spec_the_schema_accepts():
    # a bad name length and a schema error: the schema speaks first, alone
    assert errors_of(spec(metadata={"name": "a" * 48}, spec__decode={"replicas": "x"})) == [
        "spec.decode.replicas: Input should be a valid integer"
    ]


def test_a_non_mapping_and_its_message():
    not_mappings: list[Any] = [[], "x", None]
    for doc in not_mappings:
        with pytest.raises(SpecError) as caught:
            parse_epd(doc)
        assert caught.value.errors == [FieldError("<root>", "an EPDDeployment must be a mapping")]
        assert str(caught.value) == "<root>: an EPDDeployment must be a mapping"


@pytest.mark.parametrize(
    "loc,path",
    [
        (("spec", "decode", "replicas"), "spec.decode.replicas"),
        (("spec", "encoder", "volumes", 0, "name"), "spec.encoder.volumes[0].name"),
        (("spec", "ecTransfer", "function-after[check(), ECTransfer]", "connector"), "spec.ecTransfer.connector"),
        (("spec", "replicas", "int"), "spec.replicas"),
        (("spec", "name", "str"), "spec.name"),
        ((0, "a"), "[0].a"),
        ((), ""),
    ],
)
def test_pydantic_locations_become_field_paths(loc, path):
    assert _path(loc) == path


def test_rule_reasons_must_be_ones_the_api_server_accepts():
    assert SUPPORTED_REASONS == (
        "FieldValueRequired",
        "FieldValueForbidden",
        "FieldValueInvalid",
        "FieldValueDuplicate",
    )
    with pytest.raises(ValueError) as caught:
        Rule(Placement, "true", ".x", "m", "FieldValueBad")
    assert str(caught.value) == (
        "rule 'true': reason 'FieldValueBad' is not one kube-apiserver accepts "
        "(FieldValueRequired, FieldValueForbidden, FieldValueInvalid, FieldValueDuplicate)"
    )
    assert Rule(Placement, "true", ".x", "m").reason == "FieldValueInvalid"


def test_a_rule_as_the_crd_carries_it():
    rule = Rule(Placement, "self.a == 1", ".a", "a must be 1", "FieldValueForbidden")
    assert rule.as_validation() == {
        "rule": "self.a == 1",
        "message": "a must be 1",
        "fieldPath": ".a",
        "reason": "FieldValueForbidden",
    }
    assert rule.holds({"a": 1}) is True and rule.holds({"a": 2}) is False
    assert Rule(Placement, "self.a", ".a", "m").holds({"a": 0}) is False  # CEL's value made a bool


def test_cel_list_literal():
    assert _cel_list(("a", "b/c")) == "['a', 'b/c']"
    assert _cel_list(()) == "[]"


def test_rules_for_a_model_include_those_of_the_models_it_extends():
    placement = [".podLabels", ".podAnnotations", ".volumes", ".volumeMounts", ".volumeMounts"]
    for model in (Placement, Tier):
        assert [r.field for r in rules_for(model)] == placement
    assert [r.field for r in rules_for(EncoderTier)] == [".autoscaling.keda.fallback", *placement]
    assert [r.field for r in rules_for(ConsumerTier)] == [
        ".nodesPerReplica",
        ".dataParallelSize",
        ".autoscaling.keda.fallback",
        ".autoscaling.minReplicas",
        ".autoscaling.load",
        *placement,
    ]
    assert [r.field for r in rules_for(Router)] == [".autoscaling.metrics", *placement]
    assert all(r in RULES for r in rules_for(ConsumerTier))
    assert [r.field for r in rules_for(EPDDeployment)] == [".metadata.name", ".metadata.name"]


def test_the_crd_carries_the_whole_object_rules_on_metadata_name():
    """On the name node the API server reports `metadata.name: Invalid value: "<name>": <message>`; at the
    root it would report `<nil>` (tests/helm/test_deployment_chart_refusals.py shows the server's words)."""
    from epd_operator.api.crd import name_rules, openapi_schema

    assert name_rules() == [
        {
            "rule": "self.size() <= 47",
            "reason": "FieldValueInvalid",
            "message": "must be at most 47 characters (child objects append suffixes such as '-mooncake-master')",
        },
        {
            "rule": "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "reason": "FieldValueInvalid",
            "message": "must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): "
            "it names Services",
        },
    ]
    schema = openapi_schema()
    assert "x-kubernetes-validations" not in schema
    assert schema["properties"]["metadata"]["properties"]["name"]["x-kubernetes-validations"] == name_rules()
    for rule, crd_rule in zip(rules_for(EPDDeployment), name_rules(), strict=True):
        for name in ("a" * 47, "a" * 48, "1abc", "abc-", "a-1-b", "Qwen"):
            # The CRD's rule sits on the name field, so its `self` is the name itself.
            on_name = Rule(EPDDeployment, crd_rule["rule"], "", "").holds(name)  # type: ignore[arg-type]
            assert on_name == rule.holds({"metadata": {"name": name}})


@pytest.mark.parametrize(
    "expression, field",
    [
        ("self.spec.model.name != ''", ".spec.model.name"),  # not a name rule
        ("self.metadata.namespace != 'default'", ".metadata.name"),  # reads another metadata field
        ("self.metadata.name != self.spec.model.name", ".metadata.name"),  # reads more than the name
    ],
)
def test_a_whole_object_rule_the_crd_cannot_carry_on_the_name_is_refused(monkeypatch, expression, field):
    from epd_operator.api import rules as rules_mod
    from epd_operator.api.crd import name_rules

    monkeypatch.setattr(rules_mod, "RULES", (*RULES, Rule(EPDDeployment, expression, field, "m")))
    with pytest.raises(
        ValueError, match=r"only a rule on \.metadata\.name that reads nothing but self\.metadata\.name"
    ):
        name_rules()


def test_a_validator_message_loses_pydantics_prefix():
    assert errors_of(spec(spec__ecTransfer={"connector": "CPU", "cpu": {"bytes": "lots"}})) == [
        "spec.ecTransfer.cpu.bytes: 'lots' is not a Kubernetes quantity (examples: 8Gi, 500m, 1e9, 2)"
    ]


def test_errors_after_a_bad_kubernetes_type_are_still_reported():
    doc = spec(spec__encoder={"volumes": [{"name": "a", "bogus": 1}]}, spec__decode={"replicas": -1})
    assert errors_of(doc) == [
        "spec.encoder.volumes[0].bogus: unknown field (typo?)",
        "spec.decode.replicas: Input should be greater than or equal to 0",
    ]


class _Leaf(BaseModel):
    n: int = 0


class _Root(BaseModel):
    leaf: _Leaf = _Leaf()
    items: list[_Leaf] = []
    by_name: dict[str, _Leaf] = {}


def test_walk_visits_every_model_with_its_field_path():
    root = _Root(items=[_Leaf(n=1), _Leaf(n=2)], by_name={"x": _Leaf(n=3)})
    assert [(path, getattr(node, "n", None)) for node, path in _walk(root, "")] == [
        ("", None),
        ("leaf", 0),
        ("items[0]", 1),
        ("items[1]", 2),
        ("by_name.x", 3),
    ]
    assert [path for _, path in _walk(root, "spec")][:2] == ["spec", "spec.leaf"]


# The rule factories run once, when api/rules.py is imported; called here, their output is checked whole.
def test_settings_only_for_rule():
    assert _settings_only_for("CPU", "cpu") == Rule(
        ECTransfer,
        "!has(self.cpu) || self.connector == 'CPU'",
        ".cpu",
        "cpu settings are only used with connector CPU; remove them or change the connector",
        "FieldValueInvalid",
    )


def test_no_shared_storage_mount_rule():
    assert _no_shared_storage_mount("prefill") == Rule(
        EPDDeploymentSpec,
        "!has(self.prefill) || !has(self.prefill.volumeMounts) || self.ecTransfer.connector != 'SharedStorage'"
        " || !has(self.ecTransfer.sharedStorage) || !has(self.ecTransfer.sharedStorage.path)"
        " || self.prefill.volumeMounts.all(m, m.mountPath != self.ecTransfer.sharedStorage.path)",
        ".prefill.volumeMounts",
        "the shared-storage path (ecTransfer.sharedStorage.path) is mounted by the operator; mount elsewhere",
        "FieldValueDuplicate",
    )


def test_dp_ports_fit_rule():
    assert _dp_ports_fit("has(self.prefill)", "5600", "decode", "2", ".kvTransfer.port", "the port") == Rule(
        EPDDeploymentSpec,
        "!(has(self.prefill)) || 5600 + (has(self.decode.dataParallelSize) ? self.decode.dataParallelSize : 1) * 2"
        " <= 65536",
        ".kvTransfer.port",
        "the port shifts with the decode tier's data-parallel rank and would pass 65535; lower it or the tier's "
        "dataParallelSize",
        "FieldValueInvalid",
    )


@pytest.mark.parametrize("text", ["plain", "it's", "a\\b", "\\'", "''", "^[a-z]([-a-z0-9]*[a-z0-9])?$", ""])
def test_cel_string_escapes_so_that_cel_reads_the_text_back(text):
    literal = f"'{_cel_string(text)}'"
    assert cel.compile(literal).execute({}) == text
    assert _cel_string("it's a\\b") == "it\\'s a\\\\b"


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        (["--language-model-only"], True),
        (["--max-model-len", "64", "--language-model-only=true"], True),
        (["--language-model-only-not"], False),
        (["--no-language-model-only"], False),
        ([], False),
    ],
)
def test_cannot_encode_reads_the_flag_alone_or_with_a_value(args, verdict):
    assert cannot_encode(args) is verdict


@pytest.mark.parametrize("consumer", ["prefill", "decode"])
def test_encoder_at_zero_needs_raw_media_rule(consumer):
    rule = _encoder_at_zero_needs_raw_media(consumer)
    applies = "has(self.prefill)" if consumer == "prefill" else "!has(self.prefill)"
    assert rule == Rule(
        EPDDeploymentSpec,
        f"!({applies}) || !has(self.encoder.autoscaling) || !has(self.encoder.autoscaling.minReplicas)"
        f" || self.encoder.autoscaling.minReplicas > 0 || !has(self.{consumer}.extraArgs)"
        f" || !self.{consumer}.extraArgs.exists(a, a == '--language-model-only'"
        " || a.startsWith('--language-model-only='))",
        ".encoder.autoscaling.minReplicas",
        f"an encoder tier at zero leaves the media to the {consumer} tier, whose --language-model-only cannot "
        "encode it; keep minReplicas at 1 or more, or let that tier load the vision encoder",
        "FieldValueForbidden",
    )
    # Where it stops holding: the consumer that gets the raw media, at zero, without its encoder.
    tiers: dict[str, Any] = {"prefill": {}} if consumer == "prefill" else {}
    at_zero = {"encoder": {"autoscaling": {"minReplicas": 0}}, **tiers}
    for flag in ("--language-model-only", "--language-model-only=true"):
        assert not rule.holds({**at_zero, consumer: {"extraArgs": ["--enforce-eager", flag]}})
    assert rule.holds({**at_zero, consumer: {"extraArgs": ["--enforce-eager"]}})
    assert rule.holds({**at_zero, consumer: {}})
    assert rule.holds({"encoder": {"autoscaling": {"minReplicas": 1}}, **tiers, consumer: {"extraArgs": [flag]}})
    assert rule.holds({"encoder": {"autoscaling": {}}, **tiers, consumer: {"extraArgs": [flag]}})
    assert rule.holds({"encoder": {}, **tiers, consumer: {"extraArgs": [flag]}})
    # A decode tier that prefill stands before (E/P/D) gets no raw media; without prefill, decode does.
    decode_behind_prefill = {
        "encoder": {"autoscaling": {"minReplicas": 0}},
        "prefill": {},
        "decode": {"extraArgs": [flag]},
    }
    decode_alone = {"encoder": {"autoscaling": {"minReplicas": 0}}, "decode": {"extraArgs": [flag]}}
    assert rule.holds(decode_behind_prefill) and rule.holds(decode_alone) is (consumer == "prefill")
