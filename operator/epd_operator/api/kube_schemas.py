"""Upstream Kubernetes schemas for the fields an EPDDeployment passes through to its pods and HPAs.

`affinity`, `tolerations`, `env[].valueFrom`, `autoscaling.metrics`/`behavior`, and the pod overlay
fields (volumes, securityContext, ...) are Kubernetes types. Their schemas are not written here: they are
GENERATED into `kube_schemas.json` (package data, read at import) from the OpenAPI definitions of
Kubernetes `KUBERNETES_VERSION` by `dev/generate/kube_schemas.py` (`make generate`; a unit test fails
when the committed file is stale). The generator's inputs come from `kubernetes-validate`, a development
dependency the operator image does not carry.

The release is `KUBERNETES_VERSION`, the oldest the charts claim (`kubeVersion: >=1.34.0-0`): a field
that exists only in a newer release would be dropped by an older API server, so it is refused here.
`TYPES` names the Kubernetes types the spec uses, by the name the spec gives them; `KEDA_TYPES` the KEDA
types (a ScaledObject's triggers and fallback), generated from the CRD of KEDA `KEDA_VERSION`.

`validate(name, value)` checks a value against one of these schemas the way the API server's
structural-schema validation does (unknown fields, types, enums, required fields, patterns, ranges),
naming each problem with its path, so `epdctl validate` refuses what `kubectl apply` would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "1.34"
SCHEMA_FILE = Path(__file__).with_name("kube_schemas.json")

# The Kubernetes types we pass through, by the name the spec uses for them.
TYPES = {
    "Affinity": "io.k8s.api.core.v1.Affinity",
    "Toleration": "io.k8s.api.core.v1.Toleration",
    "EnvVarSource": "io.k8s.api.core.v1.EnvVarSource",
    "EnvFromSource": "io.k8s.api.core.v1.EnvFromSource",
    "MetricSpec": "io.k8s.api.autoscaling.v2.MetricSpec",
    "HorizontalPodAutoscalerBehavior": "io.k8s.api.autoscaling.v2.HorizontalPodAutoscalerBehavior",
    "TopologySpreadConstraint": "io.k8s.api.core.v1.TopologySpreadConstraint",
    "Volume": "io.k8s.api.core.v1.Volume",
    "VolumeMount": "io.k8s.api.core.v1.VolumeMount",
    "PodSecurityContext": "io.k8s.api.core.v1.PodSecurityContext",
    "SecurityContext": "io.k8s.api.core.v1.SecurityContext",
}

# KEDA's types an autoscaling spec passes through to its ScaledObject (engine KEDA), from the ScaledObject
# CRD of KEDA `KEDA_VERSION` (its Go module): by the name the spec uses, the type's name in KEDA's API
# and where its node lies in the CRD's `spec` schema.
KEDA_VERSION = "v2.21.0"
KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_TYPES = {
    "KEDATrigger": ("ScaleTriggers", ("triggers", "items")),
    "KEDAFallback": ("Fallback", ("fallback",)),
}


@cache
def _generated() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def schema(name: str) -> dict[str, Any]:
    """The structural schema of a pass-through type (`"Affinity"`, `"MetricSpec"`, ...)."""
    return _generated()["types"][name]["schema"]


def kubernetes_type(name: str) -> str:
    """`core/v1 Affinity` for `"Affinity"`: what the API reference calls the type."""
    full = _generated()["types"][name]["kubernetesType"]
    if " " in full:  # a KEDA type, stored as its API reference names it
        return str(full)
    *_, group, version, kind = full.split(".")
    return f"{group}/{version} {kind}"


_TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
}
_INT32 = (-(2**31), 2**31 - 1)


def _type_ok(type_: str, value: Any) -> bool:
    if type_ == "object":
        return isinstance(value, dict)
    if type_ == "array":
        return isinstance(value, list)
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _problems(node: dict[str, Any], value: Any, path: str) -> Iterator[tuple[str, str]]:
    if value is None:
        yield path, "must not be null"
        return
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            yield path, f"{value!r} must be an integer or a string"
        elif isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
            yield path, f"{value!r} is not a Kubernetes quantity (examples: 8Gi, 500m, 1e9, 2)"
        return
    type_ = node.get("type")
    if type_ and not _type_ok(type_, value):
        yield path, f"{value!r} must be {_TYPE_NAMES[type_]}"
        return
    if "enum" in node and value not in node["enum"]:
        yield path, f"{value!r} is not supported; expected one of {', '.join(repr(v) for v in node['enum'])}"
    if isinstance(value, str) and "pattern" in node and not re.search(node["pattern"], value):
        yield path, f"{value!r} does not match {node['pattern']}"
    if isinstance(value, str) and "maxLength" in node and len(value) > node["maxLength"]:
        yield path, f"must be at most {node['maxLength']} characters"
    if type_ == "integer" and node.get("format") == "int32" and not _INT32[0] <= value <= _INT32[1]:
        yield path, f"{value} is out of the 32-bit integer range"
    if "minimum" in node and isinstance(value, (int, float)) and value < node["minimum"]:
        yield path, f"must be greater than or equal to {node['minimum']}"
    if "maximum" in node and isinstance(value, (int, float)) and value > node["maximum"]:
        yield path, f"must be less than or equal to {node['maximum']}"
    if isinstance(value, dict):
        properties = node.get("properties")
        additional = node.get("additionalProperties")
        for key in node.get("required", []):
            if key not in value:
                yield f"{path}.{key}", "field required"
        for key, item in value.items():
            where = f"{path}.{key}"
            if properties is not None and key in properties:
                yield from _problems(properties[key], item, where)
            elif isinstance(additional, dict):
                yield from _problems(additional, item, where)
            elif not node.get("x-kubernetes-preserve-unknown-fields"):
                yield where, "unknown field (typo?)"
    if isinstance(value, list):
        if "maxItems" in node and len(value) > node["maxItems"]:
            yield path, f"must have at most {node['maxItems']} items"
        for index, item in enumerate(value):
            yield from _problems(node.get("items", {}), item, f"{path}[{index}]")


def validate(name: str, value: Any) -> list[tuple[str, str]]:
    """Problems of `value` as a Kubernetes `name`, each as (path relative to the value, message)."""
    return list(_problems(schema(name), value, ""))
