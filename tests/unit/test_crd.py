"""The generated CRD: committed as generated, structurally sound, every CEL rule compiles, and the
printer columns point at fields that exist."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import cel
import pytest
import yaml

from epd_operator.api.crd import build_crd
from epd_operator.cli import dump_yaml

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "crds" / "serving.epd.dev_epddeployments.yaml"
CHART_COPY = REPO / "charts" / "epd-operator" / "crds" / COMMITTED.name
TYPES = {"object", "array", "string", "integer", "number", "boolean"}
CRD = build_crd()
(VERSION,) = CRD["spec"]["versions"]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]


def test_the_committed_crd_is_the_generated_one():
    assert COMMITTED.read_text(encoding="utf-8") == dump_yaml([CRD]), (
        f"{COMMITTED.relative_to(REPO)} is stale: run `make crds` and commit it")


def test_the_chart_ships_the_generated_crd():
    assert CHART_COPY.exists(), f"{CHART_COPY.relative_to(REPO)} is missing: run `make crds`"
    assert CHART_COPY.read_text(encoding="utf-8") == dump_yaml([CRD]), (
        f"{CHART_COPY.relative_to(REPO)} is stale: run `make crds` and commit it")


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
    untyped = [path for path, node in ALL_NODES
               if node.get("type") not in TYPES and not node.get("x-kubernetes-int-or-string")]
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
    opaque = [path for path, node in ALL_NODES if node.get("type") == "object"
              and not ({"properties", "additionalProperties", "x-kubernetes-preserve-unknown-fields"} & set(node))
              and path != ".metadata"]
    assert opaque == []
    listless = [path for path, node in ALL_NODES if node.get("type") == "array" and "items" not in node]
    assert listless == []


def test_required_fields_exist():
    missing = [f"{path}.{name}" for path, node in ALL_NODES for name in node.get("required", [])
               if name not in (node.get("properties") or {})]
    assert missing == []


def test_every_spec_field_is_described():
    # kubectl explain shows these; an undocumented object is where users get lost.
    bare = [path for path, node in ALL_NODES if path.startswith(".spec.") and "description" not in node
            and not path.endswith((".*", "[]"))]  # map values and list items: their parent says
    assert bare == []


RULES = [(path, rule) for path, node in ALL_NODES for rule in node.get("x-kubernetes-validations", [])]


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
    docs = list(yaml.safe_load_all(COMMITTED.read_text(encoding="utf-8")))
    assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
