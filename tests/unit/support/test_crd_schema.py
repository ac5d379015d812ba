"""The CRD structural-schema semantics (tests/support/crd_schema.py) that the offline CRD tests rely on."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.crd_schema import default_and_prune, validate_custom_object


def crd_with(spec_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}},
                }
            ],
        },
    }


def thing(spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "x"}, "spec": spec}


ROLES = crd_with(
    {
        "type": "object",
        "properties": {
            "roles": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "replicas": {"type": "integer", "default": 1, "nullable": True},
                    },
                },
            }
        },
    }
)


def test_defaults_apply_inside_list_items_and_unknown_fields_are_pruned() -> None:
    obj = default_and_prune(ROLES, thing({"roles": [{"name": "a", "junk": True}], "other": 1}))
    assert obj["spec"] == {"roles": [{"name": "a", "replicas": 1}]}
    assert obj["metadata"] == {"name": "x"}


@pytest.mark.parametrize(
    "spec, expected",
    [
        ({"roles": [{"name": "a"}, {"name": "a"}]}, 'spec.roles[1]: Duplicate value: ["a"]'),
        ({"roles": [{"replicas": 2}]}, "spec.roles[0].name: Required value"),
        ({"roles": [{"name": "a", "replicas": "x"}]}, 'spec.roles[0].replicas: Invalid value: "x"'),
    ],
)
def test_field_errors_name_the_path(spec: dict[str, Any], expected: str) -> None:
    [error] = validate_custom_object(ROLES, thing(spec))
    assert error.startswith(expected)


def test_nullable_fields_accept_null() -> None:
    assert validate_custom_object(ROLES, thing({"roles": [{"name": "a", "replicas": None}]})) == []


def test_cel_message_expressions_and_evaluation_errors_are_reported() -> None:
    crd = crd_with(
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "x-kubernetes-validations": [
                {"rule": "self.n < 3", "messageExpression": "'n is ' + string(self.n)"},
                {"rule": "self.missing == 1", "message": "unreachable"},
            ],
        }
    )
    errors = validate_custom_object(crd, thing({"n": 5}))
    assert errors[0] == 'spec: Invalid value: "object": n is 5'
    assert errors[1].startswith('spec: Invalid value: "object": evaluation error')


def test_transition_rules_are_skipped_on_create() -> None:
    crd = crd_with(
        {
            "type": "object",
            "properties": {
                "n": {
                    "type": "integer",
                    "x-kubernetes-validations": [{"rule": "self >= oldSelf", "message": "n may only grow"}],
                }
            },
        }
    )
    assert validate_custom_object(crd, thing({"n": 1})) == []
    assert validate_custom_object(crd, thing({"n": 1}), old=thing({"n": 2})) == [
        "spec.n: Invalid value: 1: n may only grow"
    ]
