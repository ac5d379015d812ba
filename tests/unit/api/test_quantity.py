"""Kubernetes quantities: what the API accepts (same as the CRD pattern) and their value in bytes."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from epd_operator.api.quantity import QUANTITY_PATTERN, Quantity, parse_quantity, quantity_bytes


class Holder(BaseModel):
    size: Quantity


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("1", 1),
        ("+1", 1),
        ("1Ki", 1024),
        ("8Gi", 8 * 2**30),
        ("1.5Gi", 3 * 2**29),
        ("1Ei", 2**60),
        ("1k", 1000),
        ("2M", 2_000_000),
        ("1G", 10**9),
        ("3T", 3 * 10**12),
        ("500m", Decimal("0.5")),
        ("250u", Decimal("0.00025")),
        ("7n", Decimal("7e-9")),
        ("1e9", 10**9),
        ("1E3", 1000),
        ("2.5e-3", Decimal("0.0025")),
        (".5", Decimal("0.5")),
        ("5.", 5),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value
    assert Holder(size=text).size == text  # kept as written; rendered back verbatim


def test_numbers_are_quantities_too():
    assert parse_quantity(3) == 3
    assert parse_quantity(0.5) == Decimal("0.5")
    assert Holder(size=4).size == 4
    assert Holder(size=0).size == 0  # the bound itself


def test_a_boolean_is_no_quantity():
    with pytest.raises(ValidationError) as refused:
        Holder(size=True)
    assert refused.value.errors()[0]["msg"] == "Value error, a quantity must be a number or a string like '8Gi'"


@pytest.mark.parametrize("text, bytes_", [("1Gi", 2**30), ("1500m", 2), ("1", 1), ("0.1", 1), ("1e3", 1000), (0, 0)])
def test_quantity_bytes_rounds_up(text, bytes_):
    assert quantity_bytes(text) == bytes_


@pytest.mark.parametrize("bad", ["", "Gi", "8 Gi", "8GB", "8gi", "1.2.3", "0x10", "e3", "1Gi ", "ten", "1ki"])
def test_malformed_quantities_are_refused_with_examples(bad):
    with pytest.raises(ValidationError, match="not a Kubernetes quantity"):
        Holder(size=bad)
    with pytest.raises(ValueError, match=f"^{re.escape(repr(bad))} is not a Kubernetes quantity$"):
        parse_quantity(bad)


@pytest.mark.parametrize("bad", ["-1", "-1Gi", -1, -0.5])
def test_negative_quantities_are_refused(bad):
    with pytest.raises(ValidationError, match="must not be negative"):
        Holder(size=bad)


@pytest.mark.parametrize("bad", [True, None, [1], {"Gi": 1}, 1.5])
def test_non_scalars_and_fractions_are_refused(bad):
    with pytest.raises(ValidationError):
        Holder(size=bad)


@given(number=st.integers(0, 10**6), suffix=st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"]))
def test_the_crd_pattern_and_the_parser_agree(number, suffix):
    text = f"{number}{suffix}"
    assert re.match(QUANTITY_PATTERN, text)
    assert (
        quantity_bytes(text)
        == number
        * {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[
            suffix
        ]
    )
