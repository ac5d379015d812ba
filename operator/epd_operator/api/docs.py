"""The Markdown API reference of `EPDDeployment.spec` (`epdctl docs`), generated from the models.

Walks `EPDDeploymentSpec` field by field, so the reference in docs/api.md cannot fall behind the code
(`epdctl docs --output docs/api.md` and `make generate` rewrite it between its markers; a unit test fails
when it is stale). A model met a second time (the prefill and decode tiers are the same
`Tier` as the encoder) points back to its first path instead of repeating every row. The cross-field
rules of `rules.py` are listed after the fields, with the path each one reports.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from . import kube_schemas
from .fields import KubeType
from .quantity import Quantity
from .rules import RULES
from .spec import EPDDeployment, EPDDeploymentSpec

_QUANTITY_ARGS = typing.get_args(Quantity)[0]  # Union[int, str], as annotated by Quantity


def _unwrap_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _is_quantity(annotation: Any) -> bool:
    return annotation == _QUANTITY_ARGS  # an Annotated quantity is unwrapped first (_type_name)


def _kube_type(annotation: Any) -> KubeType | None:
    if typing.get_origin(annotation) is typing.Annotated:
        return next((m for m in typing.get_args(annotation)[1:] if isinstance(m, KubeType)), None)
    return None


def _type_name(annotation: Any) -> str:
    annotation = _unwrap_optional(annotation)
    if _is_quantity(annotation):
        return "quantity"
    kube = _kube_type(annotation)
    if kube is not None:
        return kube_schemas.kubernetes_type(kube.name)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "enum: " + ", ".join(f"`{v}`" for v in typing.get_args(annotation))
    if origin is list:
        return "[]" + _type_name(typing.get_args(annotation)[0])
    if origin is dict:
        value = typing.get_args(annotation)[1]
        return "object (free-form)" if value is Any else f"map[string]{_type_name(value)}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    if typing.get_origin(annotation) is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])  # a constrained scalar (label values)
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in names:
        return names[annotation]
    raise TypeError(f"no reference type name for {annotation!r}; teach api/docs.py about it")


def _constraints(info: FieldInfo) -> str:
    bounds = []
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            bounds.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            bounds.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            bounds.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length == 1:
            bounds.append("non-empty")
        elif getattr(item, "pattern", None):
            bounds.append(f"pattern `{item.pattern}`")
    return f" ({', '.join(bounds)})" if bounds else ""


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "default" in extra:
        value = extra["default"]  # a model's default spelt as the CRD carries it
    elif info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return ""  # its own fields list their defaults
    else:
        value = info.default
    if value is None or value is PydanticUndefined:
        return ""
    return f"`{json.dumps(value)}`"


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap_optional(annotation)
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(model: type[BaseModel], path: str, seen: dict[type[BaseModel], str]) -> Iterator[list[str]]:
    for name, info in model.model_fields.items():
        field_path = f"{path}.{name}"
        nested = _nested_model(info.annotation)
        type_name = _type_name(info.rebuild_annotation()) + _constraints(info)  # with its metadata: KubeType
        description = info.description or ""
        if nested is not None and nested in seen:
            description = f"{description} Same fields as `{seen[nested]}`.".strip()
            yield [f"`{field_path}`", type_name, _default(info), description]
            continue
        yield [f"`{field_path}`", type_name, _default(info), description]
        if nested is not None:
            child_path = (
                f"{field_path}[]" if typing.get_origin(_unwrap_optional(info.annotation)) is list else field_path
            )
            seen[nested] = child_path
            yield from _rows(nested, child_path, seen)


def _model_paths(model: type[BaseModel], path: str) -> Iterator[tuple[type[BaseModel], str]]:
    """Every path at which each model occurs (the tiers share one model, so a rule has several)."""
    yield model, path
    for name, info in model.model_fields.items():
        nested = _nested_model(info.annotation)
        if nested is not None:
            is_list = typing.get_origin(_unwrap_optional(info.annotation)) is list
            yield from _model_paths(nested, f"{path}.{name}{'[]' if is_list else ''}")


def _rule_path(model: type[BaseModel], field: str) -> str:
    """Where a rule reports, as `spec.{encoder,prefill,decode,router}.autoscaling.minReplicas` when the
    model occurs at several paths that differ in one segment."""
    if model is EPDDeployment:
        return f"`{field.removeprefix('.')}`"
    paths = [p.split(".") for m, p in _model_paths(EPDDeploymentSpec, "spec") if issubclass(m, model)]
    if len({len(p) for p in paths}) == 1:  # one path, or several as long as each other
        differing = [i for i in range(len(paths[0])) if len({p[i] for p in paths}) > 1]
        if len(differing) == 1:
            i = differing[0]
            merged = list(paths[0])
            merged[i] = "{" + ",".join(p[i] for p in paths) + "}"
            paths = [merged]
    return ", ".join(f"`{'.'.join(p)}{field}`" for p in paths)


START, END = "<!-- api-reference:start -->", "<!-- api-reference:end -->"


def reference() -> str:
    """The Markdown reference: one table row per spec field, then the cross-field rules."""
    seen: dict[type[BaseModel], str] = {}
    rows = list(_rows(EPDDeploymentSpec, "spec", seen))
    lines = [
        "| Field | Type | Default | Description |",
        "|---|---|---|---|",
        *(f"| {' | '.join(_cell(c) for c in row)} |" for row in rows),
        "",
        "A *quantity* is a Kubernetes resource quantity: a non-negative number, or a string such as `8Gi`, "
        "`500m` or `1e9`. Kubernetes types (`core/v1 Affinity`, `autoscaling/v2 MetricSpec`, ...) are checked against "
        f"the upstream schemas of Kubernetes {kube_schemas.KUBERNETES_VERSION} (unknown fields, types, allowed "
        "values) and passed through to the pods and HPAs as written.",
        "",
        "Cross-field rules (checked by `epdctl validate`, the operator, and the API server through the CRD):",
        "",
        *(f"- {_rule_path(rule.model, rule.field)}: {rule.message}" for rule in RULES),
    ]
    return "\n".join(lines) + "\n"


def with_reference(page: str) -> str:
    """`page` (a Markdown document) with the text between its api-reference markers replaced by `reference()`."""
    return between_markers(page, START, END, reference(), "the API reference")


def between_markers(page: str, start: str, end: str, text: str, what: str) -> str:
    """`page` with what lies between its `start` and `end` marker lines replaced by `text` (a generated part).

    Raises ValueError naming the markers and `what` they enclose when the page does not hold them once each,
    in order.
    """
    before, found_start, rest = page.partition(start)
    _, found_end, after = rest.partition(end)
    if not found_start or not found_end or start in rest or end in before or end in after:
        raise ValueError(f"the page needs one {start} line before one {end} line around {what}")
    return f"{before}{start}\n{text}{end}{after}"
