"""Upstream Kubernetes schemas for the fields an EPDDeployment passes through to its pods and HPAs.

`affinity`, `tolerations`, `env[].valueFrom`, `autoscaling.metrics`/`behavior`, and the pod overlay
fields (volumes, securityContext, ...) are Kubernetes types. Their schemas are not written here: they are
GENERATED from the OpenAPI definitions of one Kubernetes release that the `kubernetes-validate` package
ships (`python -m epd_operator.api.kube_schemas` rewrites `kube_schemas.json`; `make crds` runs it, and a
unit test fails when the committed file is stale). The operator image does not carry that package, so
the generated file is package data, read at import.

The release is `KUBERNETES_VERSION`, the oldest the charts claim (`kubeVersion: >=1.34.0-0`): a field
that exists only in a newer release would be dropped by an older API server, so it is refused here.

Generation turns the definitions into CRD *structural* schema form: every `$ref` inlined, one type per
node (no `null`), `IntOrString` as `x-kubernetes-int-or-string`, `Quantity` as int-or-string with the
quantity grammar as pattern, descriptions dropped (size: each type is inlined once per tier), and
free-form objects marked `x-kubernetes-preserve-unknown-fields`. Kubernetes' OpenAPI carries no enums
for these types (the API server checks them in Go), so `ENUMS` adds the allowed values of the fields
whose values are a closed set, taken from the Kubernetes API reference of that release, and
`MAX_LENGTHS` the length bounds of the strings our CEL rules compare.

`validate(name, value)` checks a value against one of these schemas the way the API server's
structural-schema validation does (unknown fields, types, enums, required fields, patterns, ranges),
naming each problem with its path, so `epdctl validate` refuses what `kubectl apply` would.
"""

from __future__ import annotations

import json
import re
import sys
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

# Closed value sets the OpenAPI definitions only describe in prose (Kubernetes validates them in Go).
ENUMS: dict[tuple[str, str], list[str]] = {
    ("io.k8s.api.autoscaling.v2.MetricSpec", "type"): ["ContainerResource", "External", "Object", "Pods", "Resource"],
    ("io.k8s.api.autoscaling.v2.MetricTarget", "type"): ["AverageValue", "Utilization", "Value"],
    ("io.k8s.api.autoscaling.v2.HPAScalingRules", "selectPolicy"): ["Disabled", "Max", "Min"],
    ("io.k8s.api.autoscaling.v2.HPAScalingPolicy", "type"): ["Percent", "Pods"],
    ("io.k8s.api.core.v1.Toleration", "operator"): ["Equal", "Exists"],
    ("io.k8s.api.core.v1.Toleration", "effect"): ["NoExecute", "NoSchedule", "PreferNoSchedule"],
    ("io.k8s.api.core.v1.NodeSelectorRequirement", "operator"): ["DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn"],
    ("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelectorRequirement", "operator"): [
        "DoesNotExist",
        "Exists",
        "In",
        "NotIn",
    ],
    ("io.k8s.api.core.v1.TopologySpreadConstraint", "whenUnsatisfiable"): ["DoNotSchedule", "ScheduleAnyway"],
    ("io.k8s.api.core.v1.TopologySpreadConstraint", "nodeAffinityPolicy"): ["Honor", "Ignore"],
    ("io.k8s.api.core.v1.TopologySpreadConstraint", "nodeTaintsPolicy"): ["Honor", "Ignore"],
    ("io.k8s.api.core.v1.SeccompProfile", "type"): ["Localhost", "RuntimeDefault", "Unconfined"],
    ("io.k8s.api.core.v1.AppArmorProfile", "type"): ["Localhost", "RuntimeDefault", "Unconfined"],
    ("io.k8s.api.core.v1.PodSecurityContext", "fsGroupChangePolicy"): ["Always", "OnRootMismatch"],
    ("io.k8s.api.core.v1.SecurityContext", "procMount"): ["Default", "Unmasked"],
    ("io.k8s.api.core.v1.VolumeMount", "mountPropagation"): ["Bidirectional", "HostToContainer", "None"],
    ("io.k8s.api.core.v1.VolumeMount", "recursiveReadOnly"): ["Disabled", "Enabled", "IfPossible"],
    ("io.k8s.api.core.v1.HostPathVolumeSource", "type"): [
        "",
        "BlockDevice",
        "CharDevice",
        "Directory",
        "DirectoryOrCreate",
        "File",
        "FileOrCreate",
        "Socket",
    ],
    ("io.k8s.api.core.v1.PersistentVolumeClaimSpec", "volumeMode"): ["Block", "Filesystem"],
}

# Length bounds Kubernetes enforces in Go (a volume name is a DNS-1123 label; a mount path is a Linux
# path): the CRD's CEL rules compare these strings, and the API server prices a comparison by the longest
# string the schema allows, so unbounded strings would push the rules over its cost budget.
MAX_LENGTHS: dict[tuple[str, str], int] = {
    ("io.k8s.api.core.v1.Volume", "name"): 63,
    ("io.k8s.api.core.v1.VolumeMount", "name"): 63,
    ("io.k8s.api.core.v1.VolumeMount", "mountPath"): 4096,
}

# k8s.io/apimachinery resource.Quantity, sign included (metric targets may be negative).
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_FORMATS = {"int32", "int64", "double", "byte", "date-time"}
_KEEP_EXTENSIONS = {"x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type"}


# ----------------------------------------------------------------------------- generation


def _definitions(version: str) -> dict[str, Any]:
    import kubernetes_validate  # a development dependency: generation only

    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = base / f"v{version}.0-local-strict" / "_definitions.json"
    return json.loads(path.read_text(encoding="utf-8"))["$defs"]


def _one_type(node: dict[str, Any]) -> str | None:
    types = node.get("type")
    if isinstance(types, list):
        types = [t for t in types if t != "null"]
        (types,) = types
    return types


def _structural(defs: dict[str, Any], name: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in stack:
        raise ValueError(f"recursive Kubernetes type {' -> '.join(stack + (name,))}: cannot inline")
    if name == _QUANTITY:
        return {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    if name == _INT_OR_STRING:
        return {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    return _convert(defs, defs[name], name, stack + (name,))


def _convert(defs: dict[str, Any], node: dict[str, Any], owner: str, stack: tuple[str, ...]) -> dict[str, Any]:
    if "$ref" in node:
        return _structural(defs, node["$ref"].rsplit("/", 1)[-1], stack)
    out: dict[str, Any] = {}
    type_ = _one_type(node)
    if type_ is not None:
        out["type"] = type_
    if node.get("format") in _FORMATS:
        out["format"] = node["format"]
    for key in ("minimum", "maximum", "pattern", "minItems", "maxItems", "minLength", "maxLength", "enum"):
        if key in node:
            out[key] = node[key]
    for key in _KEEP_EXTENSIONS & set(node):
        out[key] = node[key]
    if "properties" in node:
        out["properties"] = {}
        for prop, sub in sorted(node["properties"].items()):
            converted = _convert(defs, sub, owner, stack)
            enum = ENUMS.get((owner, prop))
            if enum is not None:
                converted["enum"] = enum
            if (owner, prop) in MAX_LENGTHS:
                converted["maxLength"] = MAX_LENGTHS[(owner, prop)]
            out["properties"][prop] = converted
        required = sorted(node.get("required", []))
        if required:
            out["required"] = required
    elif type_ == "object":
        additional = node.get("additionalProperties")
        if isinstance(additional, dict):
            out["additionalProperties"] = _convert(defs, additional, owner, stack)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True  # e.g. FieldsV1: free-form upstream too
    if "items" in node:
        out["items"] = _convert(defs, node["items"], owner, stack)
    if out.get("x-kubernetes-list-type") == "map":
        keys = out.get("x-kubernetes-list-map-keys", [])
        if not set(keys) <= set(out["items"].get("required", [])):
            # A CRD's list-map keys must be required (or defaulted); fall back to an atomic list.
            out["x-kubernetes-list-type"] = "atomic"
            out.pop("x-kubernetes-list-map-keys", None)
    return out


def generate(version: str = KUBERNETES_VERSION) -> dict[str, Any]:
    """Every pass-through type's structural schema, from Kubernetes `version`'s definitions."""
    defs = _definitions(version)
    schemas = {short: _structural(defs, full) for short, full in TYPES.items()}
    for owner, prop in [*ENUMS, *MAX_LENGTHS]:
        if prop not in defs[owner].get("properties", {}):
            raise ValueError(f"ENUMS names {owner}.{prop}, which Kubernetes {version} does not have")
    return {
        "kubernetesVersion": version,
        "generatedFrom": "kubernetes-validate _definitions.json",
        "types": {short: {"kubernetesType": TYPES[short], "schema": schema} for short, schema in schemas.items()},
    }


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


# ----------------------------------------------------------------------------- runtime


@cache
def _generated() -> dict[str, Any]:
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def schema(name: str) -> dict[str, Any]:
    """The structural schema of a pass-through type (`"Affinity"`, `"MetricSpec"`, ...)."""
    return _generated()["types"][name]["schema"]


def kubernetes_type(name: str) -> str:
    """`core/v1 Affinity` for `"Affinity"`: what the API reference calls the type."""
    full = _generated()["types"][name]["kubernetesType"]
    *_, group, version, kind = full.split(".")
    return f"{'core' if group == 'core' else group}/{version} {kind}"


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = dump(generate())
    if argv == ["--check"]:
        return 0 if SCHEMA_FILE.read_text(encoding="utf-8") == text else 1
    SCHEMA_FILE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
