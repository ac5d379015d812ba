"""api/kube_schemas.py's checker: what the API server's structural schema validation refuses in an upstream
type's value, each problem with its path below the value and the message `epdctl validate` prints.

Small schemas written here pin each rule; the last tests run the real generated schemas."""

from __future__ import annotations

from typing import Any

import pytest

from epd_operator.api import kube_schemas
from epd_operator.api.kube_schemas import _problems


def problems(node: dict[str, Any], value: Any) -> list[tuple[str, str]]:
    return list(_problems(node, value, ""))


@pytest.mark.parametrize(
    ("type_", "good", "bad", "name"),
    [
        ("object", {}, [], "an object"),
        ("array", [], {}, "a list"),
        ("string", "x", 1, "a string"),
        ("boolean", False, 0, "a boolean"),
        ("integer", 3, 3.5, "an integer"),
        ("integer", -1, True, "an integer"),
        ("number", 2.5, "2.5", "a number"),
        ("number", 2, False, "a number"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_by_its_type_name(type_, good, bad, name):
    assert problems({"type": type_}, good) == []
    assert problems({"type": type_}, bad) == [("", f"{bad!r} must be {name}")]


def test_an_unknown_type_and_a_node_without_one_take_anything():
    assert problems({"type": "something-new"}, object()) == []
    assert problems({}, [1, "a", {}]) == []


def test_null_is_refused_whatever_the_schema():
    assert problems({}, None) == [("", "must not be null")]
    assert problems({"type": "object", "properties": {"a": {"type": "string"}}}, {"a": None}) == [
        (".a", "must not be null")
    ]


@pytest.mark.parametrize("value", [3, "3", "500m", "8Gi"])
def test_int_or_string_takes_an_integer_or_a_string(value):
    node = {"x-kubernetes-int-or-string": True, "pattern": r"^[0-9]+(m|Gi)?$"}
    assert problems(node, value) == []


@pytest.mark.parametrize("value", [True, 2.5, [], {}])
def test_int_or_string_refuses_anything_else(value):
    assert problems({"x-kubernetes-int-or-string": True}, value) == [("", f"{value!r} must be an integer or a string")]


def test_an_int_or_string_with_a_pattern_names_quantities_and_stops_there():
    node = {"x-kubernetes-int-or-string": True, "pattern": r"^[0-9]+(m|Gi)?$", "maxLength": 1, "enum": ["1"]}
    assert problems(node, "8 GB") == [("", "'8 GB' is not a Kubernetes quantity (examples: 8Gi, 500m, 1e9, 2)")]
    assert problems({"x-kubernetes-int-or-string": True}, "8 GB") == []  # no pattern, no quantity check


def test_enum_pattern_and_length():
    assert problems({"type": "string", "enum": ["Equal", "Exists"]}, "Sometimes") == [
        ("", "'Sometimes' is not supported; expected one of 'Equal', 'Exists'")
    ]
    assert problems({"type": "string", "enum": ["Equal", "Exists"]}, "Exists") == []
    assert problems({"type": "string", "pattern": "^[a-z]+$"}, "abc") == []
    assert problems({"type": "string", "pattern": "^[a-z]+$"}, "ab1") == [("", "'ab1' does not match ^[a-z]+$")]
    assert problems({"type": "string", "maxLength": 3}, "abc") == []
    assert problems({"type": "string", "maxLength": 3}, "abcd") == [("", "must be at most 3 characters")]
    # A pattern or a length reads strings only.
    assert problems({"pattern": "^[a-z]+$", "maxLength": 1}, 12345) == []


@pytest.mark.parametrize(
    ("value", "fits"), [(2**31 - 1, True), (-(2**31), True), (2**31, False), (-(2**31) - 1, False)]
)
def test_an_int32_must_fit_in_32_bits(value, fits):
    found = problems({"type": "integer", "format": "int32"}, value)
    assert found == ([] if fits else [("", f"{value} is out of the 32-bit integer range")])
    assert problems({"type": "integer", "format": "int64"}, value) == []


def test_minimum_and_maximum_are_inclusive_and_read_numbers_only():
    node = {"minimum": 1, "maximum": 5}
    assert problems(node, 1) == [] and problems(node, 5) == [] and problems(node, 2.5) == []
    assert problems(node, 0) == [("", "must be greater than or equal to 1")]
    assert problems(node, 0.5) == [("", "must be greater than or equal to 1")]
    assert problems(node, 6) == [("", "must be less than or equal to 5")]
    assert problems(node, "9") == []


def test_an_object_names_missing_unknown_and_bad_fields_with_their_paths():
    node = {
        "type": "object",
        "required": ["name", "mountPath"],
        "properties": {"name": {"type": "string"}, "mountPath": {"type": "string"}, "readOnly": {"type": "boolean"}},
    }
    assert problems(node, {"name": "m", "mountPath": "/m", "readOnly": True}) == []
    assert problems(node, {"readOnly": "yes", "subPathh": "x"}) == [
        (".name", "field required"),
        (".mountPath", "field required"),
        (".readOnly", "'yes' must be a boolean"),
        (".subPathh", "unknown field (typo?)"),
    ]


def test_a_map_checks_every_value_and_preserved_fields_take_anything():
    labels = {"type": "object", "additionalProperties": {"type": "string"}}
    assert problems(labels, {"a": "1", "b": 2}) == [(".b", "2 must be a string")]
    preserved = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert problems(preserved, {"anything": {"at": ["all"]}}) == []
    # Known properties are checked even where unknown fields are kept.
    both = {**preserved, "properties": {"a": {"type": "integer"}}}
    assert problems(both, {"a": "x", "b": 1}) == [(".a", "'x' must be an integer")]


def test_a_list_is_bounded_and_checks_every_item_at_its_index():
    node = {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {"k": {"type": "string"}}}}
    assert problems(node, [{"k": "a"}, {"k": "b"}]) == []
    assert problems(node, [{"k": "a"}, {"k": 1}, {"j": "c"}]) == [
        ("", "must have at most 2 items"),
        ("[1].k", "1 must be a string"),
        ("[2].j", "unknown field (typo?)"),
    ]
    assert problems({"type": "array"}, [None]) == [("[0]", "must not be null")]  # items without a schema


def test_paths_nest_below_the_value():
    node = {
        "type": "object",
        "properties": {"outer": {"type": "array", "items": {"type": "object", "properties": {"n": {"minimum": 0}}}}},
    }
    assert list(_problems(node, {"outer": [{"n": 1}, {"n": -1}]}, ".spec")) == [
        (".spec.outer[1].n", "must be greater than or equal to 0")
    ]


def test_the_real_schemas_of_upstream_types():
    assert kube_schemas.validate("Toleration", {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}) == []
    assert kube_schemas.validate("Toleration", {"operator": "Sometimes", "tolerationSeconds": "7"}) == [
        (".operator", "'Sometimes' is not supported; expected one of 'Equal', 'Exists'"),
        (".tolerationSeconds", "'7' must be an integer"),
    ]
    assert kube_schemas.validate("VolumeMount", {}) == [(".mountPath", "field required"), (".name", "field required")]
