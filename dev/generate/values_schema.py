"""The epd-deployment chart's values.schema.json, derived from the generated EPDDeployment CRD.

The chart's values map 1:1 to the EPDDeployment spec, so its schema is the CRD's `spec` schema
made strict for helm: a structural schema cannot say `additionalProperties: false` (the API server
prunes unknown fields silently), but `helm install` should refuse a typo before anything is
applied. CEL rules (`x-kubernetes-validations`) cannot run in helm and are left to the API server.
Written by `make generate` from the CRD it generates (dev/generate/__init__.py).
"""

from __future__ import annotations

import copy
import json
from typing import Any

PATH = "charts/epd-deployment/values.schema.json"

# Chart-only values around the spec: the EPDDeployment's name and metadata, and helm's `global`.
CHART_VALUES = {
    "fullnameOverride": {"type": "string", "description": "Name of the EPDDeployment; default: the release name."},
    "labels": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": "Extra labels on the EPDDeployment.",
    },
    "annotations": {
        "type": "object",
        "additionalProperties": {"type": "string"},
        "description": "Extra annotations on the EPDDeployment.",
    },
    "global": {"type": "object", "description": "Helm's values shared with parent charts (unused)."},
}


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    storage = next(v for v in versions if v.get("storage"))
    return storage["schema"]["openAPIV3Schema"]["properties"]["spec"]


def strict_json_schema(node: Any) -> Any:
    """A structural-schema node as plain JSON Schema that refuses unknown keys."""
    if isinstance(node, list):
        return [strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict_json_schema(value) for key, value in node.items() if not key.startswith("x-kubernetes-")}
    for bound in ("minimum", "maximum"):
        # OpenAPI v3.0 (draft 4) writes `exclusiveMinimum: true` beside `minimum`; draft 7 wants the number.
        exclusive = "exclusive" + bound.capitalize()
        if out.get(exclusive) is True:
            out[exclusive] = out.pop(bound)
        elif out.get(exclusive) is False:
            del out[exclusive]
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    open_ended = node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node
    if "properties" in node and not open_ended:
        out["additionalProperties"] = False
    return out


def build_values_schema(crd: dict[str, Any]) -> dict[str, Any]:
    spec = strict_json_schema(copy.deepcopy(spec_schema(crd)))
    properties = dict(spec["properties"])
    clashes = set(properties) & set(CHART_VALUES)
    if clashes:
        raise ValueError(f"EPDDeployment spec fields clash with chart-only values: {sorted(clashes)}")
    properties.update(CHART_VALUES)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "epd-deployment chart values (EPDDeployment spec, serving.epd.dev/v1alpha1)",
        "description": "Generated from crds/serving.epd.dev_epddeployments.yaml by dev/generate/values_schema.py; do not edit.",
        "type": "object",
        "additionalProperties": False,
        "required": spec.get("required", []),
        "properties": dict(sorted(properties.items())),
    }


def render(crd: dict[str, Any]) -> str:
    return json.dumps(build_values_schema(crd), indent=2, ensure_ascii=False) + "\n"
