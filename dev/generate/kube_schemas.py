"""`operator/epd_operator/api/kube_schemas.json`: the structural schemas of the Kubernetes types an
EPDDeployment passes through (`epd_operator.api.kube_schemas.TYPES`), generated from the OpenAPI
definitions of Kubernetes `KUBERNETES_VERSION` that the `kubernetes-validate` package ships.

Generation turns the definitions into CRD *structural* schema form: every `$ref` inlined, one type per
node (no `null`), `IntOrString` as `x-kubernetes-int-or-string`, `Quantity` as int-or-string with the
quantity grammar as pattern, descriptions dropped (size: each type is inlined once per tier), and
free-form objects marked `x-kubernetes-preserve-unknown-fields`. The KEDA types (`KEDA_TYPES`) are already
structural in the ScaledObject CRD KEDA ships in its Go module (`dev/parts/keda.py`, fetched with `go mod
download`): their nodes are taken as they are, descriptions dropped. Kubernetes' OpenAPI carries no enums
for these types (the API server checks them in Go), so `ENUMS` adds the allowed values of the fields
whose values are a closed set, taken from the Kubernetes API reference of that release, and
`MAX_LENGTHS` the length bounds of the strings our CEL rules compare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dev.parts import keda
from epd_operator.api.kube_schemas import KEDA_API_VERSION, KEDA_TYPES, KEDA_VERSION, KUBERNETES_VERSION, TYPES

PATH = "operator/epd_operator/api/kube_schemas.json"

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


def _definitions(version: str) -> dict[str, Any]:
    import kubernetes_validate  # a development dependency

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


def _without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_without_descriptions(v) for v in node]
    return node


def keda_types() -> dict[str, dict[str, Any]]:
    """The KEDA types' entries: their nodes in the ScaledObject CRD of KEDA `KEDA_VERSION`."""
    crd = keda.crd()  # needs Go (the module proxy, or the module cache)
    version = KEDA_API_VERSION.rpartition("/")[2]
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    spec = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
    entries = {}
    for short, (kind, path) in KEDA_TYPES.items():
        node = spec
        for part in path:
            node = node["items"] if part == "items" else node["properties"][part]
        entries[short] = {"kubernetesType": f"{KEDA_API_VERSION} {kind}", "schema": _without_descriptions(node)}
    return entries


def generate(version: str = KUBERNETES_VERSION) -> dict[str, Any]:
    """Every pass-through type's structural schema, from Kubernetes `version`'s definitions and KEDA's CRD."""
    defs = _definitions(version)
    schemas = {short: _structural(defs, full) for short, full in TYPES.items()}
    for owner, prop in [*ENUMS, *MAX_LENGTHS]:
        if prop not in defs[owner].get("properties", {}):
            raise ValueError(f"ENUMS names {owner}.{prop}, which Kubernetes {version} does not have")
    return {
        "kubernetesVersion": version,
        "kedaVersion": KEDA_VERSION,
        "generatedFrom": f"kubernetes-validate _definitions.json; KEDA's {keda.SCALED_OBJECTS_CRD}",
        "types": {
            **{short: {"kubernetesType": TYPES[short], "schema": schema} for short, schema in schemas.items()},
            **keda_types(),
        },
    }


def dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def render() -> str:
    return dump(generate())
