"""Cross-field rules of the EPDDeployment API, written once in CEL.

Each rule is attached to one model. The CRD generator places it in that model's schema node as an
`x-kubernetes-validations` entry, so the API server refuses a violating object at apply time; and
`epd_operator.api.validation` evaluates the very same expression in Python (with the
`common-expression-language` package) for `epdctl validate` and the operator. One source, no drift.
Only core CEL is used: Kubernetes' extension functions (`quantity()`, `isURL()`) do not exist outside
the API server.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import cel
from pydantic import BaseModel

from .autoscaling import Autoscaling, KEDAScaling, VLLMAutoscaling
from .labels import OPERATOR_POD_ANNOTATIONS, OPERATOR_POD_LABELS
from .network import LABEL_KEY_MESSAGE, LABEL_KEY_PATTERN, EgressPeer, Peer, SelectorRequirement
from .router import Router
from .spec import EPDDeployment, EPDDeploymentSpec
from .tiers import OPERATOR_MOUNT_PATHS, OPERATOR_VOLUMES, ConsumerTier, EncoderTier, Placement
from .transfer import ECTransfer, Mooncake, Nixl

# Child objects are named `<name>-<suffix>`; the longest suffix is "-mooncake-master" (16), and
# Service names are DNS-1035 labels of at most 63 characters.
MAX_NAME_LENGTH = 47


# The only `reason`s kube-apiserver accepts on a CRD validation rule (apiextensions
# `supportedValidationReason`); any other refuses the whole CRD at install.
SUPPORTED_REASONS = ("FieldValueRequired", "FieldValueForbidden", "FieldValueInvalid", "FieldValueDuplicate")


@dataclass(frozen=True)
class Rule:
    model: type[BaseModel]
    expression: str
    field: str  # relative to the model, as a Kubernetes `fieldPath` (".a.b")
    message: str
    reason: str = "FieldValueInvalid"

    def __post_init__(self) -> None:
        if self.reason not in SUPPORTED_REASONS:
            raise ValueError(
                f"rule {self.expression!r}: reason {self.reason!r} is not one kube-apiserver accepts "
                f"({', '.join(SUPPORTED_REASONS)})"
            )

    @cached_property
    def program(self) -> Any:
        return cel.compile(self.expression)

    def holds(self, value: dict[str, Any]) -> bool:
        return bool(self.program.execute({"self": value}))

    def as_validation(self) -> dict[str, Any]:
        return {"rule": self.expression, "message": self.message, "fieldPath": self.field, "reason": self.reason}


def _cel_string(value: str) -> str:
    """`value` inside a single-quoted CEL string literal."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _no_shared_storage_mount(tier: str) -> Rule:
    return Rule(
        EPDDeploymentSpec,
        f"!has(self.{tier}) || !has(self.{tier}.volumeMounts) || self.ecTransfer.connector != 'SharedStorage'"
        " || !has(self.ecTransfer.sharedStorage) || !has(self.ecTransfer.sharedStorage.path)"
        f" || self.{tier}.volumeMounts.all(m, m.mountPath != self.ecTransfer.sharedStorage.path)",
        f".{tier}.volumeMounts",
        "the shared-storage path (ecTransfer.sharedStorage.path) is mounted by the operator; mount elsewhere",
        "FieldValueDuplicate",
    )


def _consumer_field(tier: str, key: str) -> str:
    """A consumer tier's parallelism field in CEL, 1 where absent (the API server applies defaults;
    `epdctl validate` sees them too, but a rule must not depend on that)."""
    return f"(has(self.{tier}.{key}) ? self.{tier}.{key} : 1)"


def _dp_ports_fit(applies: str, first_port: str, tier: str, per_rank: str, field: str, what: str) -> Rule:
    """Ports that shift with the DP rank must stay valid: `first + dp * per_rank - 1 <= 65535`."""
    return Rule(
        EPDDeploymentSpec,
        f"!({applies}) || {first_port} + {_consumer_field(tier, 'dataParallelSize')} * {per_rank} <= 65536",
        field,
        f"{what} shifts with the {tier} tier's data-parallel rank and would pass 65535; lower it or the tier's "
        "dataParallelSize",
    )


_MOONCAKE_EC_PORT = (
    "(has(self.ecTransfer.mooncake) && has(self.ecTransfer.mooncake.ecPort)"
    f" ? self.ecTransfer.mooncake.ecPort : {Mooncake.model_fields['ecPort'].default})"
)
_NIXL_PORT = (
    "(has(self.kvTransfer) && has(self.kvTransfer.nixl) && has(self.kvTransfer.nixl.sideChannelPort)"
    f" ? self.kvTransfer.nixl.sideChannelPort : {Nixl.model_fields['sideChannelPort'].default})"
)


_LABEL_KEY = _cel_string(LABEL_KEY_PATTERN)
_HAS_METRICS = "(has(self.autoscaling.metrics) && size(self.autoscaling.metrics) > 0)"
_HAS_TRIGGERS = (
    "(has(self.autoscaling.keda) && has(self.autoscaling.keda.triggers) && size(self.autoscaling.keda.triggers) > 0)"
)
_KEDA = "(has(self.engine) && self.engine == 'KEDA')"
# KEDA's fallback (apis/keda/v1alpha1 CheckFallbackValid, run by its admission webhook) stands in for a failing
# trigger's metric; it refuses a ScaledObject none of whose triggers it can stand in for: cpu and memory.
_FALLBACK = "(has(self.autoscaling) && has(self.autoscaling.keda) && has(self.autoscaling.keda.fallback))"
_NON_CPU_TRIGGER = (
    "(has(self.autoscaling.keda.triggers) && self.autoscaling.keda.triggers.exists(t, t.type != 'cpu' && "
    "t.type != 'memory'))"
)
_FALLBACK_NEEDS = (
    "KEDA's fallback can only stand in for a trigger that is not cpu or memory, and this tier's ScaledObject "
    "would have none (KEDA's webhook refuses it): scale on load (load.targetPerPod), add such a trigger to "
    "keda.triggers, or remove the fallback"
)
# vLLM's flag that leaves the multimodal encoder out of a consumer: such a consumer cannot encode raw media.
LANGUAGE_MODEL_ONLY = "--language-model-only"


def cannot_encode(extra_args: list[str]) -> bool:
    """Whether a consumer tier with these arguments leaves the multimodal encoder out (and so cannot
    encode the raw media that spill-over or an encoder tier at zero would hand it)."""
    return any(a == LANGUAGE_MODEL_ONLY or a.startswith(f"{LANGUAGE_MODEL_ONLY}=") for a in extra_args)


_HAS_CPU = (
    "(has(self.resources) && ((has(self.resources.requests) && 'cpu' in self.resources.requests)"
    " || (has(self.resources.limits) && 'cpu' in self.resources.limits)))"
)


def _encoder_at_zero_needs_raw_media(consumer: str) -> Rule:
    """An encoder tier at zero sends every media item raw to the EC consumer (prefill in E/P/D, else
    decode), which must then encode it itself."""
    applies = "has(self.prefill)" if consumer == "prefill" else "!has(self.prefill)"
    return Rule(
        EPDDeploymentSpec,
        f"!({applies}) || !has(self.encoder.autoscaling) || !has(self.encoder.autoscaling.minReplicas)"
        f" || self.encoder.autoscaling.minReplicas > 0 || !has(self.{consumer}.extraArgs)"
        f" || !self.{consumer}.extraArgs.exists(a, a == '{LANGUAGE_MODEL_ONLY}'"
        f" || a.startsWith('{LANGUAGE_MODEL_ONLY}='))",
        ".encoder.autoscaling.minReplicas",
        f"an encoder tier at zero leaves the media to the {consumer} tier, whose {LANGUAGE_MODEL_ONLY} cannot encode "
        "it; keep minReplicas at 1 or more, or let that tier load the vision encoder",
        "FieldValueForbidden",
    )


def _settings_only_for(connector: str, key: str) -> Rule:
    return Rule(
        ECTransfer,
        f"!has(self.{key}) || self.connector == '{connector}'",
        f".{key}",
        f"{key} settings are only used with connector {connector}; remove them or change the connector",
    )


RULES: tuple[Rule, ...] = (
    Rule(
        EPDDeployment,
        f"self.metadata.name.size() <= {MAX_NAME_LENGTH}",
        ".metadata.name",
        f"must be at most {MAX_NAME_LENGTH} characters (child objects append suffixes such as '-mooncake-master')",
    ),
    Rule(
        EPDDeployment,
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        ".metadata.name",
        "must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): it names Services",
    ),
    Rule(
        EPDDeploymentSpec,
        "!has(self.kvTransfer) || has(self.prefill)",
        ".kvTransfer",
        "kvTransfer moves KV from prefill to decode and needs a prefill tier (E/P/D); remove it for E+PD",
        "FieldValueForbidden",
    ),
    Rule(
        EPDDeploymentSpec,
        "self.ecTransfer.connector != 'Mooncake' || !has(self.encoder.tensorParallelSize)"
        " || self.encoder.tensorParallelSize == 1",
        ".encoder.tensorParallelSize",
        "the Mooncake EC connector needs an encoder tensorParallelSize of 1 (vLLM refuses to start otherwise)",
    ),
    Rule(
        EPDDeploymentSpec,
        "self.ecTransfer.connector != 'Mooncake' || !has(self.encoder.pipelineParallelSize)"
        " || self.encoder.pipelineParallelSize == 1",
        ".encoder.pipelineParallelSize",
        "the Mooncake EC connector needs an encoder pipelineParallelSize of 1 (vLLM refuses to start otherwise)",
    ),
    # Mooncake: the EC consumer (prefill in E/P/D, else decode) of DP rank d listens on ec_port + d*TP + r.
    *(
        _dp_ports_fit(
            f"self.ecTransfer.connector == 'Mooncake' && {'' if tier == 'prefill' else '!'}has(self.prefill)",
            _MOONCAKE_EC_PORT,
            tier,
            _consumer_field(tier, "tensorParallelSize"),
            ".ecTransfer.mooncake.ecPort",
            "ecPort (one control port per data-parallel and tensor-parallel rank)",
        )
        for tier in ("prefill", "decode")
    ),
    # NIXL: the side channel of DP rank d listens on VLLM_NIXL_SIDE_CHANNEL_PORT + d, on P and on D (E/P/D only).
    *(
        _dp_ports_fit(
            "has(self.prefill)", _NIXL_PORT, tier, "1", ".kvTransfer.nixl.sideChannelPort", "the NIXL side-channel port"
        )
        for tier in ("prefill", "decode")
    ),
    *(
        Rule(
            EPDDeploymentSpec,
            f"self.ecTransfer.connector != 'Mooncake' || {'!' if tier == 'prefill' else ''}has(self.prefill)"
            f" || {_consumer_field(tier, 'nodesPerReplica')} == 1",
            f".{tier}.nodesPerReplica",
            "the Mooncake EC connector's consumer binds a control port per rank on its own pod, which the router can only "
            "address on a single-node replica; use nodesPerReplica 1 (or the SharedStorage or CPU connector)",
            "FieldValueForbidden",
        )
        for tier in ("prefill", "decode")
    ),
    Rule(
        ConsumerTier,
        "!has(self.nodesPerReplica) || self.nodesPerReplica == 1 || (has(self.tensorParallelSize)"
        " ? self.tensorParallelSize : 1) * (has(self.pipelineParallelSize) ? self.pipelineParallelSize : 1)"
        " % self.nodesPerReplica == 0",
        ".nodesPerReplica",
        "must divide tensorParallelSize x pipelineParallelSize: every node of a replica runs an equal share of its "
        "GPUs (vLLM refuses an --nnodes that does not divide the world size)",
    ),
    Rule(
        ConsumerTier,
        "!has(self.nodesPerReplica) || self.nodesPerReplica == 1 || !has(self.dataParallelSize)"
        " || self.dataParallelSize == 1",
        ".dataParallelSize",
        "a multi-node tier (nodesPerReplica > 1) runs one data-parallel rank per replica; scale it with replicas",
        "FieldValueForbidden",
    ),
    Rule(
        ECTransfer,
        "self.connector != 'SharedStorage' || has(self.sharedStorage)",
        ".sharedStorage",
        "sharedStorage.claimName is required with connector SharedStorage (an RWX claim mounted by every tier)",
        "FieldValueRequired",
    ),
    Rule(
        ECTransfer,
        "self.connector != 'CPU' || has(self.cpu)",
        ".cpu",
        "cpu.bytes is required with connector CPU (the size of the shared-memory region)",
        "FieldValueRequired",
    ),
    _settings_only_for("SharedStorage", "sharedStorage"),
    _settings_only_for("Mooncake", "mooncake"),
    _settings_only_for("CPU", "cpu"),
    Rule(
        Autoscaling,
        "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
        ".minReplicas",
        "minReplicas must not exceed maxReplicas",
    ),
    Rule(
        VLLMAutoscaling,
        f"{_KEDA} || !has(self.minReplicas) || self.minReplicas > 0",
        ".minReplicas",
        "minReplicas 0 (scale to zero) needs engine KEDA: an HPA never scales a tier below one pod",
    ),
    Rule(
        VLLMAutoscaling,
        f"{_KEDA} || !has(self.keda)",
        ".keda",
        "keda settings are only used with engine KEDA; remove them or set engine: KEDA",
        "FieldValueForbidden",
    ),
    Rule(
        VLLMAutoscaling,
        f"!{_KEDA} || !has(self.metrics) || size(self.metrics) == 0",
        ".metrics",
        "metrics are autoscaling/v2 MetricSpecs for an HPA; with engine KEDA write KEDA triggers in keda.triggers",
        "FieldValueForbidden",
    ),
    # The encoder tier has its load trigger when `load` is set or no trigger is written; the others only with `load`.
    Rule(
        EncoderTier,
        f"!{_FALLBACK} || has(self.autoscaling.load) || !{_HAS_TRIGGERS} || {_NON_CPU_TRIGGER}",
        ".autoscaling.keda.fallback",
        _FALLBACK_NEEDS,
    ),
    Rule(
        ConsumerTier,
        f"!{_FALLBACK} || has(self.autoscaling.load) || {_NON_CPU_TRIGGER}",
        ".autoscaling.keda.fallback",
        _FALLBACK_NEEDS,
    ),
    Rule(
        KEDAScaling,
        "!has(self.fallback) || !has(self.fallback.behavior) || self.fallback.behavior != 'scalingModifiers'",
        ".fallback.behavior",
        "fallback behavior scalingModifiers needs a scalingModifiers formula, which the operator does not "
        "render; use static, currentReplicas, currentReplicasIfHigher or currentReplicasIfLower",
        "FieldValueForbidden",
    ),
    Rule(
        ConsumerTier,
        "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) || self.autoscaling.minReplicas > 0",
        ".autoscaling.minReplicas",
        "only the encoder tier may scale to zero: prefill and decode serve every request",
    ),
    *(_encoder_at_zero_needs_raw_media(consumer) for consumer in ("prefill", "decode")),
    # An autoscaler needs a metric it can compute. The encoder's default is its load; prefill, decode and
    # the router fall back to CPU utilisation, which needs a CPU request.
    Rule(
        ConsumerTier,
        f"!has(self.autoscaling) || has(self.autoscaling.load) || {_HAS_METRICS} || {_HAS_TRIGGERS} || {_HAS_CPU}",
        ".autoscaling.load",
        "autoscaling needs a metric: set load.targetPerPod (requests in flight per pod, from the routers), "
        "metrics or keda.triggers; the fallback, CPU utilisation, cannot be computed without a CPU request (resources.requests.cpu) "
        "on this tier",
        "FieldValueRequired",
    ),
    Rule(
        Router,
        f"!has(self.autoscaling) || {_HAS_METRICS} || {_HAS_CPU}",
        ".autoscaling.metrics",
        "autoscaling needs metrics: the default (CPU utilisation) cannot be computed without a CPU request "
        "(resources.requests.cpu) on this tier; add metrics or a CPU request",
        "FieldValueRequired",
    ),
    # Placement rules hold for every vLLM tier and the router (the models that extend Placement).
    Rule(
        Placement,
        f"!has(self.podLabels) || !{_cel_list(OPERATOR_POD_LABELS)}.exists(k, k in self.podLabels)",
        ".podLabels",
        "the operator's own labels (" + ", ".join(OPERATOR_POD_LABELS) + ") select the pods and may not be set",
        "FieldValueForbidden",
    ),
    Rule(
        Placement,
        f"!has(self.podAnnotations) || !{_cel_list(OPERATOR_POD_ANNOTATIONS)}.exists(k, k in self.podAnnotations)",
        ".podAnnotations",
        "the operator's own annotations (" + ", ".join(OPERATOR_POD_ANNOTATIONS) + ") may not be set",
        "FieldValueForbidden",
    ),
    Rule(
        Placement,
        f"!has(self.volumes) || self.volumes.all(v, !(v.name in {_cel_list(OPERATOR_VOLUMES)})"
        " && self.volumes.exists_one(w, w.name == v.name))",
        ".volumes",
        "volume names must be unique and not one the operator uses (" + ", ".join(OPERATOR_VOLUMES) + ")",
        "FieldValueDuplicate",
    ),
    Rule(
        Placement,
        f"!has(self.volumeMounts) || self.volumeMounts.all(m, !(m.mountPath in {_cel_list(OPERATOR_MOUNT_PATHS)})"
        " && self.volumeMounts.exists_one(n, n.mountPath == m.mountPath))",
        ".volumeMounts",
        "mount paths must be unique and not one the operator mounts (" + ", ".join(OPERATOR_MOUNT_PATHS) + ")",
        "FieldValueDuplicate",
    ),
    Rule(
        Placement,
        f"!has(self.volumeMounts) || self.volumeMounts.all(m, m.name in {_cel_list(OPERATOR_VOLUMES)}"
        " || (has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
        ".volumeMounts",
        "every volumeMount must name a volume of this tier's `volumes`",
    ),
    *(_no_shared_storage_mount(tier) for tier in ("encoder", "prefill", "decode")),
    # NetworkPolicy peers: what the API server refuses in a NetworkPolicy is refused here, in the spec,
    # so no policy of a deployment is half-applied.
    Rule(
        SelectorRequirement,
        "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0"
        " : !has(self.values) || size(self.values) == 0",
        ".values",
        "In and NotIn need at least one value; Exists and DoesNotExist take none",
    ),
    Rule(
        SelectorRequirement,
        f"self.key.matches('{_LABEL_KEY}')",
        ".key",
        LABEL_KEY_MESSAGE,
    ),
    Rule(
        Peer,
        "has(self.namespaceSelector) || has(self.podSelector)",
        ".podSelector",
        "a peer needs a podSelector and/or a namespaceSelector (`namespaceSelector: {}`: every namespace)",
        "FieldValueRequired",
    ),
    Rule(
        EgressPeer,
        "has(self.cidr) != (has(self.namespaceSelector) || has(self.podSelector))",
        ".cidr",
        "a destination is either pods (podSelector and/or namespaceSelector) or an address range (cidr), one of them",
    ),
)


def rules_for(model: type[BaseModel]) -> list[Rule]:
    """The rules that hold for `model`: its own and those of the models it extends."""
    return [rule for rule in RULES if issubclass(model, rule.model)]
