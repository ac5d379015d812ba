"""Every ScaledObject rendered from the KEDA variants is valid against the CRD KEDA v2.21 ships in its Go
module (fetched with `go mod download`), offline (types, ranges, required fields; unknown fields, which a CRD
prunes, are refused by the API server's strict field validation in tests/integration/test_operator_keda.py)."""

from __future__ import annotations

import functools

import pytest

from epd_operator.render import render
from tests.support.cluster import keda_crd
from tests.support.crd_schema import validate_custom_object
from tests.support.render_examples import rendered_examples, variants

RENDERED = {
    **{f"example {name}": objects for name, objects in rendered_examples().items()},
    **{name: render(epd) for name, epd in variants().items()},
}
WITH_KEDA = sorted(name for name, objects in RENDERED.items() if any(o["kind"] == "ScaledObject" for o in objects))


@functools.lru_cache(maxsize=1)
def _crd() -> dict:
    return keda_crd()


def test_some_variants_render_a_scaled_object():
    assert len(WITH_KEDA) >= 2


@pytest.mark.parametrize("case", WITH_KEDA)
def test_rendered_scaled_objects_are_valid(case):
    problems = [
        f"ScaledObject/{obj['metadata']['name']}: {error}"
        for obj in RENDERED[case]
        if obj["kind"] == "ScaledObject"
        for error in validate_custom_object(_crd(), obj)
    ]
    assert not problems, "\n".join(problems)


def test_the_keda_schema_check_would_notice_a_bad_field():
    so = next(o for o in render(variants()["keda-encoder-scale-to-zero"]) if o["kind"] == "ScaledObject")
    so["spec"]["minReplicaCount"] = -1
    so["spec"]["triggers"][0]["type"] = ""
    errors = validate_custom_object(_crd(), so)
    assert any("minReplicaCount" in e for e in errors) and any("type" in e for e in errors), errors
