"""The generated CRD: structurally sound, every CEL rule compiles, and the printer columns point at fields
that exist (that the committed files are as generated: tests/unit/dev/test_generate.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cel
import pytest
import yaml

from epd_operator.api import kube_schemas
from epd_operator.api.crd import build_crd

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "crds" / "serving.epd.dev_epddeployments.yaml"
TYPES = {"object", "array", "string", "integer", "number", "boolean"}
CRD = build_crd()
(VERSION,) = CRD["spec"]["versions"]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path or "<root>", schema
    for name, child in (schema.get("properties") or {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}.*")


ALL_NODES = list(nodes(SCHEMA))


def test_every_node_has_a_type():
    untyped = [
        path for path, node in ALL_NODES if node.get("type") not in TYPES and not node.get("x-kubernetes-int-or-string")
    ]
    assert untyped == []


def test_no_json_schema_leftovers_from_pydantic():
    bad = []
    for path, node in ALL_NODES:
        if "$ref" in node or "$defs" in node or "title" in node or "nullable" in node or "const" in node:
            bad.append(f"{path}: {sorted(set(node) & {'$ref', '$defs', 'title', 'nullable', 'const'})}")
        if {"type": "null"} in node.get("anyOf", []):
            bad.append(f"{path}: anyOf null")
        if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
            bad.append(f"{path}: anyOf outside int-or-string")
        if node.get("x-kubernetes-int-or-string") and "type" in node:
            bad.append(f"{path}: int-or-string with a type")
    assert bad == []


def test_objects_declare_their_fields_or_preserve_unknown_ones():
    opaque = [
        path
        for path, node in ALL_NODES
        if node.get("type") == "object"
        and not ({"properties", "additionalProperties", "x-kubernetes-preserve-unknown-fields"} & set(node))
        and path != ".metadata"
    ]
    assert opaque == []
    listless = [path for path, node in ALL_NODES if node.get("type") == "array" and "items" not in node]
    assert listless == []


def test_required_fields_exist():
    missing = [
        f"{path}.{name}"
        for path, node in ALL_NODES
        for name in node.get("required", [])
        if name not in (node.get("properties") or {})
    ]
    assert missing == []


UPSTREAM = [kube_schemas.schema(name) for name in (*kube_schemas.TYPES, *kube_schemas.KEDA_TYPES)]


def _is_upstream(node: dict[str, Any]) -> bool:
    return {k: v for k, v in node.items() if k != "description"} in UPSTREAM


# The fields typed with generated Kubernetes schemas (affinity, tolerations[], ...).
UPSTREAM_ROOTS = [
    path
    for path, node in ALL_NODES
    if _is_upstream(node) or (isinstance(node.get("items"), dict) and _is_upstream(node["items"]))
]


def _inside_upstream(path: str) -> bool:
    return any(path.startswith((f"{root}.", f"{root}[]")) for root in UPSTREAM_ROOTS)


def test_every_spec_field_is_described():
    # kubectl explain shows these; an undocumented object is where users get lost. Inside the generated
    # Kubernetes types descriptions are dropped for size: the field itself says which type it is.
    bare = [
        path
        for path, node in ALL_NODES
        if path.startswith(".spec.")
        and "description" not in node
        and not path.endswith((".*", "[]"))  # map values and list items: their parent says
        and not _inside_upstream(path)
    ]
    assert bare == []


def test_kubernetes_schemas_come_from_the_oldest_release_the_charts_claim():
    for chart in ("epd-operator", "epd-deployment"):
        meta = yaml.safe_load((REPO / "charts" / chart / "Chart.yaml").read_text(encoding="utf-8"))
        assert meta["kubeVersion"] == f">={kube_schemas.KUBERNETES_VERSION}.0-0", chart


@pytest.mark.parametrize(
    "path, kube_type",
    [
        (".spec.encoder.affinity", "Affinity"),
        (".spec.decode.tolerations[]", "Toleration"),
        (".spec.router.env[].valueFrom", "EnvVarSource"),
        (".spec.encoder.autoscaling.metrics[]", "MetricSpec"),
        (".spec.prefill.autoscaling.behavior", "HorizontalPodAutoscalerBehavior"),
        (".spec.decode.volumes[]", "Volume"),
        (".spec.decode.securityContext", "SecurityContext"),
        (".spec.ecTransfer.mooncake.master.affinity", "Affinity"),
    ],
)
def test_pass_through_fields_carry_the_upstream_schema(path, kube_type):
    node = {k: v for k, v in dict(ALL_NODES)[path].items() if k != "description"}
    assert node == kube_schemas.schema(kube_type)
    assert "x-kubernetes-preserve-unknown-fields" not in node


def test_upstream_schemas_are_structural_and_keep_their_enums():
    metric = kube_schemas.schema("MetricSpec")
    assert metric["required"] == ["type"]
    assert "Bogus" not in metric["properties"]["type"]["enum"] and "Pods" in metric["properties"]["type"]["enum"]
    text = json.dumps([kube_schemas.schema(name) for name in kube_schemas.TYPES])
    assert "$ref" not in text and '"null"' not in text and "oneOf" not in text
    quantity = metric["properties"]["pods"]["properties"]["target"]["properties"]["averageValue"]
    assert quantity["x-kubernetes-int-or-string"] and "pattern" in quantity


def test_the_crd_fits_the_api_server_and_client_side_apply():
    compact = len(json.dumps(CRD, separators=(",", ":")))
    assert compact < 1_500_000  # etcd's object size limit, with margin
    # `kubectl apply` (client-side) stores the whole object in an annotation of at most 256 KiB
    assert compact < 256 * 1024 - 4096


def test_cel_rules_on_lists_have_bounded_lists():
    # The API server estimates a rule's cost from the largest list it may walk: unbounded lists under
    # `.all()`/`.exists()` get the CRD refused. Every list a rule walks has maxItems.
    for path, rule in RULES:
        node = dict(ALL_NODES)[path]
        for name, child in (node.get("properties") or {}).items():
            if child.get("type") == "array" and f"self.{name}." in rule["rule"]:
                assert "maxItems" in child, f"{path}.{name} is walked by {rule['rule']!r} without maxItems"


RULES = [(path, rule) for path, node in ALL_NODES for rule in node.get("x-kubernetes-validations", [])]
_WALK = re.compile(r"self((?:\.\w+)+)\.(?:all|exists|exists_one|map|filter)\(")


def test_cel_rules_walk_only_bounded_lists_at_any_depth():
    # The same, for lists a rule reaches through nested fields (`self.decode.extraArgs.exists(...)`); their
    # string items need a maxLength too, since a comparison is priced by the longest string it may see.
    walked = 0
    for path, rule in RULES:
        for match in _WALK.finditer(rule["rule"]):
            node = dict(ALL_NODES)[path]
            for part in match.group(1).lstrip(".").split("."):
                node = (node.get("properties") or {})[part]
            walked += 1
            assert "maxItems" in node, f"{path}: {rule['rule']!r} walks {match.group(1)} without maxItems"
            if (node.get("items") or {}).get("type") == "string":
                assert "maxLength" in node["items"], f"{path}: {match.group(1)} items without maxLength"
    assert walked >= 5


def test_there_are_cel_rules():
    assert len(RULES) >= 10


@pytest.mark.parametrize("path, rule", RULES, ids=[f"{p}:{r['rule'][:40]}" for p, r in RULES])
def test_every_cel_rule_compiles_and_names_a_real_field(path, rule):
    cel.compile(rule["rule"])
    assert rule["message"]
    node = dict(ALL_NODES)[path]
    if "fieldPath" in rule:
        target = node
        for part in rule["fieldPath"].lstrip(".").split("."):
            assert part in (target.get("properties") or {}), f"fieldPath {rule['fieldPath']} not under {path}"
            target = target["properties"][part]


@pytest.mark.parametrize("column", VERSION["additionalPrinterColumns"], ids=lambda c: c["name"])
def test_printer_columns_point_at_existing_fields(column):
    parts = column["jsonPath"].lstrip(".").split(".")
    if parts[0] == "metadata":
        assert parts[1] in {"name", "namespace", "creationTimestamp", "labels", "annotations", "generation"}
        return
    node = SCHEMA
    for part in parts:
        assert part in (node.get("properties") or {}), f"{column['jsonPath']}: no field {part!r}"
        node = node["properties"][part]
    assert column["type"] in {"string", "integer", "number", "boolean", "date"}


def test_status_is_a_subresource_and_the_names_are_consistent():
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == f"{names['plural']}.{CRD['spec']['group']}"
    assert VERSION["subresources"] == {"status": {}}
    assert VERSION["served"] and VERSION["storage"]


def test_the_committed_file_is_one_yaml_document():
    docs = list(yaml.load_all(COMMITTED.read_text(encoding="utf-8"), Loader=yaml.CSafeLoader))
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"


def _validation_rules(node):
    if isinstance(node, dict):
        yield from node.get("x-kubernetes-validations", [])
        for value in node.values():
            yield from _validation_rules(value)
    elif isinstance(node, list):
        for value in node:
            yield from _validation_rules(value)


def test_every_rule_reason_is_one_the_api_server_accepts():
    # kube-apiserver refuses a whole CRD over one unsupported `reason`, so no install could succeed.

    from epd_operator.api.rules import SUPPORTED_REASONS
    from tests.support.cluster import epd_crd

    crd = epd_crd()
    rules = list(_validation_rules(crd))
    assert len(rules) > 10
    assert {r.get("reason", "FieldValueInvalid") for r in rules} <= set(SUPPORTED_REASONS)
    assert SUPPORTED_REASONS == (
        "FieldValueRequired",
        "FieldValueForbidden",
        "FieldValueInvalid",
        "FieldValueDuplicate",
    )


def test_a_rule_with_an_unsupported_reason_cannot_be_declared():
    import pytest

    from epd_operator.api.rules import Rule
    from epd_operator.api.spec import EPDDeployment

    with pytest.raises(ValueError, match=r"FieldValueTooLong.*is not one kube-apiserver accepts"):
        Rule(EPDDeployment, "true", ".x", "m", "FieldValueTooLong")


def test_a_models_schema_becomes_structural():
    """What model_schema makes of pydantic's constructs, on a model written here (the spec's own models use
    only some of them): references inlined, optional unwrapped, const as an enum, an exclusive minimum in
    the OpenAPI v3 form, a free-form map kept as preserved unknown fields, titles and closed objects gone."""
    from typing import Literal

    from pydantic import Field

    from epd_operator.api.crd import model_schema
    from epd_operator.api.fields import KubeObject, Strict

    class Inner(Strict):
        n: int = Field(1, gt=0, description="n")

    class Probe(Strict):
        free: KubeObject = Field(default_factory=dict, description="free")
        kind: Literal["only"] = Field("only", description="kind")
        inner: Inner | None = Field(None, description="inner")
        items: list[Inner] = Field(default_factory=list, description="items")
        title: str = Field("", description="a field named like a keyword")

    n = {"default": 1, "description": "n", "minimum": 0, "exclusiveMinimum": True, "type": "integer"}
    assert model_schema(Probe) == {
        "type": "object",
        "properties": {
            "free": {"x-kubernetes-preserve-unknown-fields": True, "description": "free", "type": "object"},
            "kind": {"enum": ["only"], "default": "only", "description": "kind", "type": "string"},
            "inner": {"properties": {"n": n}, "type": "object", "description": "inner"},
            "items": {"description": "items", "items": {"properties": {"n": n}, "type": "object"}, "type": "array"},
            "title": {"default": "", "description": "a field named like a keyword", "type": "string"},
        },
    }


def test_preserved_unknown_fields_get_an_object_type_unless_they_have_one():
    from epd_operator.api.crd import _structural

    assert _structural({"additionalProperties": True}, {}, {}) == {
        "x-kubernetes-preserve-unknown-fields": True,
        "type": "object",
    }
    assert _structural({"additionalProperties": True, "type": "object"}, {}, {})["type"] == "object"
    assert _structural({"additionalProperties": True, "type": "array"}, {}, {})["type"] == "array"  # kept
    union = {"additionalProperties": True, "anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert "type" not in _structural(union, {}, {})
    assert _structural({"additionalProperties": False, "type": "object"}, {}, {}) == {"type": "object"}


def test_a_reference_is_resolved_by_its_last_path_segment_and_keeps_its_own_keys():
    from epd_operator.api.crd import _structural

    defs = {"Port": {"type": "integer", "title": "Port"}}
    node = {"$ref": "#/$defs/Port", "description": "the port"}
    assert _structural([node, node], defs, {}) == [{"type": "integer", "description": "the port"}] * 2


def test_rules_attach_to_the_objects_of_the_model_they_hold_for():
    from epd_operator.api.crd import _structural

    rule = {"rule": "self.a > 0", "message": "a must be positive"}
    assert _structural({"title": "M", "type": "object"}, {}, {"M": [rule]}) == {
        "type": "object",
        "x-kubernetes-validations": [rule],
    }
    assert _structural({"title": "M", "type": "string"}, {}, {"M": [rule]}) == {"type": "string"}


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("self.metadata.name.size() <= 3", ".spec.model"),  # on another field
        ("self.spec.model.name.size() <= 3", ".metadata.name"),  # reads no name
        ("self.metadata.name.size() <= self.spec.x", ".metadata.name"),  # reads more than the name
    ],
)
def test_a_whole_object_rule_the_crd_cannot_place_on_the_name_is_refused(expression, field, monkeypatch):
    from epd_operator.api import crd, rules
    from epd_operator.api.spec import EPDDeployment

    monkeypatch.setattr(rules, "rules_for", lambda model: [rules.Rule(EPDDeployment, expression, field, "m")])
    with pytest.raises(ValueError) as refused:
        crd.name_rules()
    assert str(refused.value) == (
        f"rule {expression!r} of the whole EPDDeployment: only a rule on .metadata.name that "
        "reads nothing but self.metadata.name can be placed in the CRD"
    )


def test_a_name_rule_reads_the_name_as_self():
    from epd_operator.api.crd import name_rules
    from epd_operator.api.rules import MAX_NAME_LENGTH

    assert [r["rule"] for r in name_rules()][:2] == [
        f"self.size() <= {MAX_NAME_LENGTH}",
        "self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    ]
    assert all("fieldPath" not in r for r in name_rules())


def test_rules_reach_the_models_that_extend_a_ruled_model_at_any_depth():
    from epd_operator.api import rules
    from epd_operator.api.crd import _rules_by_title

    titled = _rules_by_title()
    ruled = {rule.model for rule in rules.RULES}
    descendants, todo = set(), list(ruled)
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in descendants:
                descendants.add(sub)
                todo.append(sub)
    assert descendants - ruled, "no ruled model is extended: this test checks nothing"
    assert {m.__name__ for m in ruled | descendants} <= set(titled)
    assert any(not set(m.__bases__) & ruled for m in descendants)  # a grandchild (EncoderTier of Placement)
