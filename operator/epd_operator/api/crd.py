"""Generate the EPDDeployment CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema (draft 2020-12) with `$ref`s and `anyOf [X, null]` for optionals; a CRD
needs a *structural* OpenAPI v3 schema: everything inlined, one type per node, `nullable`-free
optionals, `x-kubernetes-*` markers for free-form objects. This module does that translation and
places each cross-field CEL rule (`rules.py`) on the node of the model it belongs to.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from . import rules as rules_mod
from .spec import GROUP, KIND, PLURAL, SHORT_NAME, VERSION, EPDDeployment, EPDDeploymentSpec
from .status import EPDDeploymentStatus

_DROP = {"title", "$defs"}


def _rules_by_title() -> dict[str, list[dict[str, Any]]]:
    # Pydantic titles each definition with its class name; that is how a schema node finds its model
    # (a rule of a base model such as Placement holds in every model that extends it).
    out: dict[str, list[dict[str, Any]]] = {}
    models = {rule.model for rule in rules_mod.RULES}
    while True:
        more = {sub for model in models for sub in model.__subclasses__()} - models
        if not more:
            break
        models |= more
    for model in sorted(models, key=lambda m: m.__name__):
        rules = [rule.as_validation() for rule in rules_mod.rules_for(model)]
        if rules:
            out[model.__name__] = rules
    return out


def _structural(node: Any, defs: dict[str, Any], rules: dict[str, list[dict[str, Any]]]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs, rules) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].removeprefix("#/$defs/")]  # pydantic's local references
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs, rules)
    any_of = node.get("anyOf")
    if any_of and any(branch == {"type": "null"} for branch in any_of):
        (inner,) = [branch for branch in any_of if branch != {"type": "null"}]
        outer = {k: v for k, v in node.items() if k != "anyOf" and not (k == "default" and v is None)}
        return _structural({**inner, **outer}, defs, rules)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "additionalProperties" and value is False:
            continue  # unknown fields are pruned by the API server and refused by strict field validation
        elif key == "additionalProperties" and value is True:
            out["x-kubernetes-preserve-unknown-fields"] = True
        elif key == "properties":  # names of fields, not schema keywords
            out[key] = {name: _structural(v, defs, rules) for name, v in value.items()}
        else:
            out[key] = _structural(value, defs, rules)
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out and "anyOf" not in out:
        out["type"] = "object"
    title = node.get("title")
    if title in rules and out.get("type") == "object":
        out["x-kubernetes-validations"] = rules[title]
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of one model, rules attached."""
    raw = model.model_json_schema(mode="validation")
    return _structural(raw, raw.get("$defs") or {}, _rules_by_title())


_NAME = re.compile(r"\bself\.metadata\.name\b")
_SELF = re.compile(r"\bself\b")


def name_rules() -> list[dict[str, Any]]:
    """The rules of the whole object, placed on `metadata.name` with `self` the name.

    A rule at the root is reported without a field (`<nil>: Invalid value: ...`): its fieldPath may
    only name schema properties, and the only ones a CRD may declare under metadata are name and
    generateName. On the name node the API server reports `metadata.name: Invalid value: "<name>": ...`.
    So a root rule must concern `.metadata.name` and read nothing else; rules.py keeps the whole-object
    form, which `epdctl validate` and the operator evaluate."""
    out = []
    for rule in rules_mod.rules_for(EPDDeployment):
        on_name, reads = _NAME.subn("self", rule.expression)
        if rule.field != ".metadata.name" or not reads or len(_SELF.findall(rule.expression)) != reads:
            raise ValueError(
                f"rule {rule.expression!r} of the whole EPDDeployment: only a rule on .metadata.name that "
                "reads nothing but self.metadata.name can be placed in the CRD"
            )
        validation = rule.as_validation()
        del validation["fieldPath"]
        validation["rule"] = on_name
        out.append(validation)
    return out


def openapi_schema() -> dict[str, Any]:
    spec = model_schema(EPDDeploymentSpec)
    status = model_schema(EPDDeploymentStatus)
    return {
        "type": "object",
        "description": "EPDDeployment runs a vLLM Encoder/Prefill/Decode disaggregated multimodal model.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {
                "type": "object",
                "properties": {"name": {"type": "string", "x-kubernetes-validations": name_rules()}},
            },
            "spec": spec,
            "status": status,
        },
    }


# `kubectl get epddeployments` columns (priority 1: only with `-o wide`).
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Topology", "type": "string", "jsonPath": ".status.topology", "description": "E+PD or E/P/D"},
    {
        "name": "Encoder",
        "type": "string",
        "jsonPath": ".status.tiers.encoder.ready",
        "description": "ready/desired encoder pods",
    },
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.tiers.prefill.ready",
        "description": "ready/desired prefill pods (E/P/D)",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.tiers.decode.ready",
        "description": "ready/desired decode pods",
    },
    {
        "name": "Phase",
        "type": "string",
        "jsonPath": ".status.phase",
        "description": "Pending, Progressing, Ready, Degraded or Failed",
    },
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "description": "router URL", "priority": 1},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "description": "served model", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp", "description": ""},
]


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "epd-operator", "app.kubernetes.io/part-of": "epd-operator"},
            "annotations": {"serving.epd.dev/generated-by": "epdctl crd (do not edit)"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["all", "epd"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }
