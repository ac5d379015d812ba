"""Kubernetes resource quantities (`8Gi`, `500m`, `1e9`): the pattern the CRD enforces and a parser to bytes.

The renderer needs real numbers from quantities (the CPU connector's `ec_cpu_bytes`, the janitor's
`maxSize`, `/dev/shm` sizing), so quantities are parsed here once rather than passed through as strings.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator, Field

# The grammar of k8s.io/apimachinery resource.Quantity (decimal number, then a binary suffix, a decimal
# SI suffix, or a decimal exponent) without the minus sign: every quantity in this API is a size, and the
# CRD must refuse what the Python validation refuses.
QUANTITY_PATTERN = r"^\+?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


def _check_quantity(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("a quantity must be a number or a string like '8Gi'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"quantity {value!r} must not be negative")
        return value
    if isinstance(value, str) and value.startswith("-"):
        raise ValueError(f"quantity {value!r} must not be negative")
    if isinstance(value, str) and _QUANTITY_RE.match(value):
        return value
    raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 8Gi, 500m, 1e9, 2)")


Quantity = Annotated[
    int | str,
    BeforeValidator(_check_quantity),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN, "minimum": 0}),
]


def parse_quantity(value: int | float | str) -> Decimal:
    """The numeric value of a quantity (`'8Gi'` -> 8589934592)."""
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    if not _QUANTITY_RE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity")
    for suffix, factor in _BINARY.items():
        if value.endswith(suffix):
            return Decimal(value[: -len(suffix)]) * factor
    if value[-1] in _DECIMAL:  # a decimal SI suffix (a digit is none, the pattern admits no empty string)
        return Decimal(value[:-1]) * _DECIMAL[value[-1]]
    return Decimal(value)  # the pattern admits only what Decimal reads (an exponent included)


def quantity_bytes(value: int | float | str) -> int:
    """A quantity as a whole number of bytes, rounded up (Kubernetes rounds capacities up too)."""
    number = parse_quantity(value)
    whole = int(number)
    return whole if number == whole else whole + 1
