"""Every generated file is committed as its generator writes it (dev/generate: `make generate`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dev import generate
from dev.generate import values_schema
from dev.parts import keda

REPO = Path(__file__).resolve().parents[3]


def test_every_generated_file_is_committed_as_generated(tmp_path):
    if keda.cached_source() is None:  # fetching it runs `go`, which a unit test may not
        pytest.skip(
            "KEDA's Go module is not in Go's module cache (`python -m dev.parts.keda` fetches it); "
            "tests/loopback/dev/test_generated_keda_schemas.py fetches it and runs this check"
        )
    written = generate.write(tmp_path)
    stale = [path for path in written if (REPO / path).read_bytes() != (tmp_path / path).read_bytes()]
    assert stale == [], f"stale generated files: {stale}; run `make generate` and commit them"


def test_the_deployment_charts_values_are_every_spec_field_and_the_charts_own():
    crd = yaml.load((REPO / generate.CRD).read_text(encoding="utf-8"), Loader=yaml.CSafeLoader)
    spec_fields = set(values_schema.spec_schema(crd)["properties"])
    values = set(values_schema.build_values_schema(crd)["properties"])
    assert spec_fields <= values
    assert values - spec_fields == set(values_schema.CHART_VALUES)
