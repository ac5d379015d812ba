"""The generated API reference (`epdctl docs`): complete, and the one the README shows."""

from __future__ import annotations

import typing
from pathlib import Path

from pydantic import BaseModel

from epd_operator.api.docs import reference
from epd_operator.api.rules import RULES
from epd_operator.api.spec import EPDDeploymentSpec
from epd_operator.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- api-reference:start -->", "<!-- api-reference:end -->"


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


def test_readme_shows_the_current_reference():
    readme = README.read_text(encoding="utf-8")
    assert START in readme and END in readme, f"README.md lost the {START} ... {END} markers of the API reference"
    shown = readme.split(START, 1)[1].split(END, 1)[0].strip()
    assert shown == reference().strip(), (
        "README.md's API reference is stale: replace the text between the api-reference markers "
        "with the output of `.venv/bin/epdctl docs`"
    )
