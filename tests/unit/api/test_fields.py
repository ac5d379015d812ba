"""api/fields.py: an upstream Kubernetes type on a field (`KubeType`): the schema pydantic validates it with
and the JSON schema the CRD carries for it.

The models of the package build their validators when they are imported; these tests build theirs inside
the test, so that what `KubeType` hands pydantic is what each test checks.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

import pytest
from pydantic import TypeAdapter, ValidationError

from epd_operator.api import kube_schemas
from epd_operator.api.fields import KubeObject, KubeType


def adapter(name: str) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[KubeObject, KubeType(name)])


def test_a_kube_type_field_refuses_what_its_upstream_schema_refuses():
    with pytest.raises(ValidationError) as refused:
        adapter("Toleration").validate_python({"operator": "Sometimes", "tolerationSeconds": "7"})
    (error,) = refused.value.errors()
    assert error["type"] == "kube_schema"
    assert error["msg"] == (
        ".operator: 'Sometimes' is not supported; expected one of 'Equal', 'Exists'; "
        ".tolerationSeconds: '7' must be an integer"
    )


def test_a_kube_type_field_keeps_a_valid_value_as_given():
    value = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert adapter("Toleration").validate_python(value) == value


def test_a_kube_type_field_is_a_dict_first():
    """The type's own check (a dict) runs before the upstream schema: a list is refused as pydantic words it."""
    with pytest.raises(ValidationError) as refused:
        adapter("Toleration").validate_python([])
    assert [e["type"] for e in refused.value.errors()] == ["dict_type"]


def test_each_kube_type_checks_its_own_schema():
    """The name a KubeType carries picks the schema: a VolumeMount's required fields are not a Toleration's."""
    assert adapter("Toleration").validate_python({}) == {}
    with pytest.raises(ValidationError) as refused:
        adapter("VolumeMount").validate_python({})
    assert refused.value.errors()[0]["ctx"]["problems"] == [
        (".mountPath", "field required"),
        (".name", "field required"),
    ]


@pytest.mark.parametrize("name", ["Affinity", "Toleration", "MetricSpec", "KEDATrigger"])
def test_the_json_schema_of_a_kube_type_field_is_the_upstream_schema(name):
    assert adapter(name).json_schema() == kube_schemas.schema(name)


def test_the_json_schema_handed_out_is_a_copy_the_caller_may_change_at_any_depth():
    """The CRD builder adds to the document it is given (a description at the top, rules below): the cached
    upstream schema must not change with it."""
    before = copy.deepcopy(kube_schemas.schema("Affinity"))
    given = KubeType("Affinity").__get_pydantic_json_schema__(None, None)  # type: ignore[arg-type]
    given["description"] = "added"
    given["properties"]["nodeAffinity"]["x-added"] = True
    assert kube_schemas.schema("Affinity") == before


def test_json_data_is_json_native_and_takes_model_dumps_options():
    from epd_operator.api.fields import Strict

    class Pair(Strict):
        items: tuple[int, int]
        note: str | None = None

    assert Pair(items=(1, 2)).json_data() == {"items": [1, 2], "note": None}
    assert Pair(items=(1, 2)).json_data(exclude_none=True) == {"items": [1, 2]}
