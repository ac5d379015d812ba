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

from .spec import Autoscaling, ECTransfer, EPDDeployment, EPDDeploymentSpec

# Child objects are named `<name>-<suffix>`; the longest suffix is "-mooncake-master" (16), and
# Service names are DNS-1035 labels of at most 63 characters.
MAX_NAME_LENGTH = 47


@dataclass(frozen=True)
class Rule:
    model: type[BaseModel]
    expression: str
    field: str  # relative to the model, as a Kubernetes `fieldPath` (".a.b")
    message: str
    reason: str = "FieldValueInvalid"

    @cached_property
    def program(self) -> Any:
        return cel.compile(self.expression)

    def holds(self, value: dict[str, Any]) -> bool:
        return bool(self.program.execute({"self": value}))

    def as_validation(self) -> dict[str, Any]:
        return {"rule": self.expression, "message": self.message, "fieldPath": self.field, "reason": self.reason}


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
        "FieldValueTooLong",
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
)


def rules_for(model: type[BaseModel]) -> list[Rule]:
    return [rule for rule in RULES if rule.model is model]
