"""Validate an EPDDeployment: the one place `epdctl`, the operator and the tests ask.

First the schema (types, ranges, enums, required and unknown fields) through the pydantic models,
then the cross-field CEL rules of `rules.py`. Every problem is reported with its field path
(`spec.encoder.replicas: ...`), all at once, so a user fixes a spec in one round.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from .rules import rules_for
from .spec import EPDDeployment


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A refused EPDDeployment; `errors` name every offending field."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


def _path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part in ("int", "str")):
            continue  # pydantic's union/validator branch labels are not fields
        else:
            path += f".{part}" if path else str(part)
    return path


def _schema_errors(exc: ValidationError) -> list[FieldError]:
    seen: dict[str, FieldError] = {}
    for err in exc.errors(include_url=False):
        if err["type"] == "kube_schema":
            # An upstream Kubernetes type (kube_schemas): one error per offending field inside it.
            base = _path(err["loc"])
            for sub, message in err["ctx"]["problems"]:
                seen.setdefault(base + sub, FieldError(base + sub, message))
            continue
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = "unknown field (typo?)"
        elif err["type"] == "literal_error":
            message = f"{err['input']!r} is not supported; {message[0].lower()}{message[1:]}"
        path = _path(err["loc"])
        seen.setdefault(path, FieldError(path, message))
    return list(seen.values())


def _walk(node: Any, path: str) -> Iterator[tuple[BaseModel, str]]:
    if isinstance(node, BaseModel):
        yield node, path
        for name in type(node).model_fields:
            yield from _walk(getattr(node, name), f"{path}.{name}" if path else name)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(node, dict):
        for key, item in node.items():
            yield from _walk(item, f"{path}.{key}")


def _rule_errors(epd: EPDDeployment) -> list[FieldError]:
    errors = []
    for node, path in _walk(epd, ""):
        rules = rules_for(type(node))
        if not rules:
            continue
        value = node.model_dump(mode="json", exclude_none=True)
        for rule in rules:
            if not rule.holds(value):
                errors.append(FieldError(f"{path}{rule.field}".lstrip("."), rule.message))
    return errors


def parse_epd(obj: dict[str, Any]) -> EPDDeployment:
    """The typed EPDDeployment for `obj`, or `SpecError` naming every offending field."""
    if not isinstance(obj, dict):
        raise SpecError([FieldError("<root>", "an EPDDeployment must be a mapping")])
    try:
        epd = EPDDeployment.model_validate(obj)
    except ValidationError as exc:
        raise SpecError(_schema_errors(exc)) from None
    errors = _rule_errors(epd)
    if errors:
        raise SpecError(errors)
    return epd
