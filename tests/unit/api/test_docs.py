"""The generated API reference (`epdctl docs`): complete (docs/api.md shows it as generated: tests/unit/dev/test_generate.py)."""

from __future__ import annotations

import typing

import pytest
from pydantic import BaseModel

from epd_operator.api.docs import END, START, reference, with_reference
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


def test_epdctl_docs_output_rewrites_only_between_the_markers(tmp_path):
    page = tmp_path / "api.md"
    page.write_text(f"# Intro\n\n{START}\nold table\n{END}\n\nAfter.\n", encoding="utf-8")
    main(["docs", "--output", str(page)])
    assert page.read_text(encoding="utf-8") == f"# Intro\n\n{START}\n{reference()}{END}\n\nAfter.\n"
    main(["docs", "--output", str(page)])  # a second run changes nothing
    assert page.read_text(encoding="utf-8") == f"# Intro\n\n{START}\n{reference()}{END}\n\nAfter.\n"


@pytest.mark.parametrize(
    "page",
    ["no markers\n", f"{END}\n{START}\n", f"{START}\n{END}\n{START}\n{END}\n"],
    ids=["none", "reversed", "twice"],
)
def test_a_page_without_one_pair_of_markers_is_refused_and_left_alone(tmp_path, page):
    path = tmp_path / "api.md"
    path.write_text(page, encoding="utf-8")
    with pytest.raises(SystemExit, match="api-reference:start"):
        main(["docs", "--output", str(path)])
    assert path.read_text(encoding="utf-8") == page
    with pytest.raises(ValueError, match="api-reference:end"):
        with_reference(page)


@pytest.mark.parametrize(
    "page",
    [
        "A\n<s>\nold\n<e>\nB\n",
        "<s>\n<e>\n",
    ],
)
def test_between_markers_replaces_only_what_lies_between(page):
    from epd_operator.api.docs import between_markers

    before, after = page.split("<s>")[0], page.split("<e>")[1]
    assert between_markers(page, "<s>", "<e>", "new\n", "the part") == f"{before}<s>\nnew\n<e>{after}"


@pytest.mark.parametrize(
    "page",
    [
        "no markers\n",
        "<s>\nold\n",  # no end
        "old\n<e>\n",  # no start
        "<e>\nold\n<s>\n",  # end before start
        "<s>\n<s>\nold\n<e>\n",  # two starts
        "<s>\nold\n<e>\n<e>\n",  # two ends, both after the start
        "<e>\n<s>\nold\n<e>\n",  # an end before the start as well
    ],
)
def test_between_markers_refuses_a_page_without_one_start_before_one_end(page):
    from epd_operator.api.docs import between_markers

    with pytest.raises(ValueError) as refused:
        between_markers(page, "<s>", "<e>", "new\n", "the part")
    assert str(refused.value) == "the page needs one <s> line before one <e> line around the part"


def test_with_reference_names_what_its_markers_enclose():
    with pytest.raises(ValueError) as refused:
        with_reference("no markers\n")
    assert str(refused.value) == f"the page needs one {START} line before one {END} line around the API reference"


def test_reference_type_names():
    from typing import Annotated, Any, Literal

    from pydantic import Field

    from epd_operator.api.docs import _type_name
    from epd_operator.api.fields import Toleration
    from epd_operator.api.quantity import Quantity

    assert _type_name(Quantity) == "quantity"
    assert _type_name(Quantity | None) == "quantity"
    assert _type_name(Annotated[int, Field(ge=0)]) == "integer"
    assert _type_name(dict[str, Any]) == "object (free-form)"
    assert _type_name(dict[str, int]) == "map[string]integer"
    assert _type_name(list[Toleration]) == "[]core/v1 Toleration"
    assert _type_name(Literal["a", "b"]) == "enum: `a`, `b`"
    with pytest.raises(TypeError) as refused:
        _type_name(complex)
    assert str(refused.value) == "no reference type name for <class 'complex'>; teach api/docs.py about it"
