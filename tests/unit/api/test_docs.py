"""The generated API reference (`epdctl docs`): complete (docs/api.md shows it as generated: tests/unit/dev/test_generate.py)."""

from __future__ import annotations

import typing

from pydantic import BaseModel

from epd_operator.api.docs import reference
from epd_operator.api.rules import RULES
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.cli import main


def _leaf_names(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names.add(name)
        for arg in [info.annotation, *typing.get_args(info.annotation)]:
            for inner in [arg, *typing.get_args(arg)]:
                if isinstance(inner, type) and issubclass(inner, BaseModel) and inner not in seen:
                    seen.add(inner)
                    names |= _leaf_names(inner, seen)
    return names


def test_every_field_of_every_spec_model_has_a_row():
    text = reference()
    rows = [line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `spec.")]
    documented = {row.rsplit(".", 1)[-1].removesuffix("[]") for row in rows}
    assert _leaf_names(EPDDeploymentSpec, set()) <= documented
    assert len(rows) == len(set(rows)), "a field path is listed twice"


def test_rows_carry_type_default_and_description():
    rows = {line.split("|")[1].strip(): line for line in reference().splitlines() if line.startswith("| `spec.")}
    assert "| integer (≥ 1) | `600` |" in rows["`spec.ecTransfer.sharedStorage.ttlSeconds`"]
    assert "| enum: `SharedStorage`, `Mooncake`, `CPU` | **required** |" in rows["`spec.ecTransfer.connector`"]
    assert "quantity" in rows["`spec.ecTransfer.cpu.bytes`"]
    assert "Same fields as `spec.prefill`" in rows["`spec.decode`"]  # the encoder has fields of its own
    assert "`spec.encoder.cudaGraphs.tokenBudgets`" in rows and "`spec.prefill.cudaGraphs`" not in rows


def test_every_cross_field_rule_is_listed_with_its_path():
    text = reference()
    for rule in RULES:
        assert rule.message in text
    assert "`spec.{encoder,prefill,decode,router}.autoscaling.minReplicas`" in text


def test_epdctl_docs_prints_the_reference(capsys):
    main(["docs"])
    assert capsys.readouterr().out == reference()
