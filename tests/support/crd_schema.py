"""
Structural-schema semantics of CustomResourceDefinitions, as the API server applies them.

It lets tests check example CRs and the API's own validation against the project's generated CRD
offline, without an API server, so the models and the CRD agree on what a valid object is; the
integration tests check the same CRD in a real kube-apiserver.

Order of processing mirrors kube-apiserver: prune unknown fields, apply defaults, then validate
(OpenAPI v3 via ``jsonschema``, then ``x-kubernetes-validations`` CEL rules via ``cel``).

Approximations (documented, not hidden):
- ``format`` is not checked (the API server only checks a few formats, loosely).
- CEL runs on the ``common-expression-language`` package: the Kubernetes CEL library
  extensions (``quantity()``, ``url()``, ``isSorted()``, …) are absent; a rule using them fails
  as an evaluation error, reported as an invalid value with the error text.
- Transition rules (``oldSelf``) are evaluated for fields reachable through object properties
  and ``additionalProperties``; array items are not correlated (as for atomic lists upstream).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from typing import Any

import cel
import jsonschema

_ROOT_META_FIELDS = ("apiVersion", "kind", "metadata")


def version_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the given (else the storage) version of the CRD."""
    versions = crd.get("spec", {}).get("versions", [])
    if not versions:
        raise ValueError(f"CRD {crd.get('metadata', {}).get('name')!r} declares no versions")
    for v in versions:
        if (version is None and v.get("storage")) or v.get("name") == version:
            return v.get("schema", {}).get("openAPIV3Schema", {}) or {}
    raise ValueError(f"CRD {crd.get('metadata', {}).get('name')!r} has no version {version!r}")


def _object_version(crd: dict[str, Any], obj: dict[str, Any]) -> str | None:
    api_version = obj.get("apiVersion", "")
    return api_version.split("/", 1)[1] if "/" in api_version else None


# --- pruning & defaulting --------------------------------------------------------------------


def _prune(schema: dict[str, Any], value: Any, *, root: bool = False) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties")
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        keep_meta = root or schema.get("x-kubernetes-embedded-resource", False)
        result: dict[str, Any] = {}
        for key, item in value.items():
            if keep_meta and key in _ROOT_META_FIELDS:
                result[key] = item
            elif props is not None and key in props:
                result[key] = _prune(props[key], item)
            elif isinstance(additional, dict):
                result[key] = _prune(additional, item)
            elif additional is True or preserve:
                result[key] = item
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(schema["items"], item) for item in value]
    return value


def _default(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = _default(sub, value[key])
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in list(value):
                if key not in (schema.get("properties") or {}):
                    value[key] = _default(additional, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_default(schema["items"], item) for item in value]
    return value


def default_and_prune(crd: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with unknown fields dropped and schema defaults filled in (prune again
    afterwards, as the API server does, so that defaults cannot introduce unknown fields)."""
    schema = version_schema(crd, _object_version(crd, obj))
    result = _prune(schema, copy.deepcopy(obj), root=True)
    result = _default(schema, result)
    return _prune(schema, result, root=True)


def unknown_fields(sent: Any, kept: Any, path: str = "") -> list[str]:
    """Dotted paths present in ``sent`` but pruned from ``kept`` — what ``fieldValidation=Strict``
    refuses (as ``unknown field "spec.x"``) instead of silently dropping."""
    found: list[str] = []
    if isinstance(sent, dict) and isinstance(kept, dict):
        for key, value in sent.items():
            where = f"{path}.{key}" if path else key
            found += unknown_fields(value, kept[key], where) if key in kept else [where]
    elif isinstance(sent, list) and isinstance(kept, list):
        for index, (a, b) in enumerate(zip(sent, kept, strict=False)):
            found += unknown_fields(a, b, f"{path}[{index}]")
    return found


# --- OpenAPI v3 validation --------------------------------------------------------------------


def _to_jsonschema(schema: Any) -> Any:
    """Translate Kubernetes' structural-schema dialect into plain JSON Schema."""
    if isinstance(schema, list):
        return [_to_jsonschema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-") or key in ("format", "default", "nullable", "example", "externalDocs"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            result[key] = {k: _to_jsonschema(v) for k, v in value.items()}
        else:
            result[key] = _to_jsonschema(value)
    if schema.get("x-kubernetes-int-or-string"):
        result.pop("type", None)
        result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in result:
        result["type"] = [result["type"], "null"]
    if schema.get("x-kubernetes-list-type") == "set":
        result["uniqueItems"] = True
    return result


def _field_path(parts: Any) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _render_value(value: Any) -> str:
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def _schema_error_message(error: jsonschema.ValidationError) -> str:
    path = _field_path(error.absolute_path)
    if error.validator == "required":
        missing = error.message.split("'")[1]
        return f"{_field_path([*error.absolute_path, missing])}: Required value"
    if error.validator == "enum":
        supported = ", ".join(json.dumps(v) for v in error.validator_value)
        return f"{path}: Unsupported value: {_render_value(error.instance)}: supported values: {supported}"
    where = path or "<root>"
    return f"{where}: Invalid value: {_render_value(error.instance)}: {where} in body: {error.message}"


def _typed_children(schema: dict[str, Any], value: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(key, sub-schema, item) for the fields of an object value that its schema describes."""
    props = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, item in value.items():
        sub = props.get(key, additional if isinstance(additional, dict) else None)
        if sub is not None:
            yield key, sub, item


def _list_map_errors(schema: dict[str, Any], value: Any, path: list[Any]) -> Iterator[str]:
    """Uniqueness of ``x-kubernetes-list-type: map`` keys, which JSON Schema cannot express."""
    if isinstance(value, dict):
        for key, sub, item in _typed_children(schema, value):
            yield from _list_map_errors(sub, item, [*path, key])
    elif isinstance(value, list):
        if schema.get("x-kubernetes-list-type") == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen: set[str] = set()
            for index, item in enumerate(value):
                ident = json.dumps([item.get(k) if isinstance(item, dict) else None for k in keys])
                if ident in seen:
                    yield f"{_field_path([*path, index])}: Duplicate value: {ident}"
                seen.add(ident)
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                yield from _list_map_errors(schema["items"], item, [*path, index])


# --- CEL (x-kubernetes-validations) -----------------------------------------------------------

_MISSING = object()
_programs: dict[str, Any] = {}


def _compiled(rule: str) -> Any:
    if rule not in _programs:
        _programs[rule] = cel.compile(rule)
    return _programs[rule]


def _cel_errors(schema: dict[str, Any], value: Any, old: Any, path: list[Any]) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations") or []:
        expression = rule["rule"]
        uses_old = "oldSelf" in expression
        if uses_old and old is _MISSING and not rule.get("optionalOldSelf"):
            continue  # transition rules only apply to updates of an existing value
        variables: dict[str, Any] = {"self": value}
        if uses_old:
            variables["oldSelf"] = (
                (cel.OptionalValue.none() if old is _MISSING else cel.OptionalValue.of(old))
                if rule.get("optionalOldSelf")
                else old
            )
        where = _field_path([*path, *[p for p in rule.get("fieldPath", "").lstrip(".").split(".") if p]])
        where = where or "<root>"
        try:
            ok = _compiled(expression).execute(variables)
        except Exception as exc:  # CEL evaluation errors surface as invalid values, as upstream
            yield f"{where}: Invalid value: {_render_value(value)}: evaluation error: {exc}"
            continue
        if ok is not True:
            message = rule.get("message") or f"failed rule: {expression}"
            if rule.get("messageExpression"):
                with contextlib.suppress(Exception):  # a failing messageExpression falls back to message
                    message = str(_compiled(rule["messageExpression"]).execute(variables))
            yield f"{where}: Invalid value: {_render_value(value)}: {message}"

    if isinstance(value, dict):
        for key, sub, item in _typed_children(schema, value):
            old_item = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
            yield from _cel_errors(sub, item, old_item, [*path, key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _cel_errors(schema["items"], item, _MISSING, [*path, index])


def validate_custom_object(crd: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """Kubernetes-style field errors (``spec.x: Invalid value: …: message``) for ``obj``
    against its CRD version's schema and CEL rules; empty when valid.

    ``obj`` should already be pruned and defaulted (see :func:`default_and_prune`);
    ``old`` is the stored object on updates, enabling ``oldSelf`` transition rules."""
    schema = version_schema(crd, _object_version(crd, obj))
    body = {k: v for k, v in obj.items() if k not in _ROOT_META_FIELDS}
    root_schema = {
        **schema,
        "properties": {k: v for k, v in (schema.get("properties") or {}).items() if k not in _ROOT_META_FIELDS},
    }
    validator = jsonschema.Draft4Validator(_to_jsonschema(root_schema))
    errors = [
        _schema_error_message(e)
        for e in sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
    ]
    errors += list(_list_map_errors(schema, body, []))
    if errors:  # CEL rules assume a schema-valid object, as upstream
        return errors
    # Root-level rules see the whole object (``self.metadata.name`` works, as upstream), and rules on
    # ``metadata.name`` (the metadata field a CRD may constrain) run there, reported at that field.
    cel_schema = {
        **schema,
        "properties": {k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind")},
    }
    return list(_cel_errors(cel_schema, obj, _MISSING if old is None else old, []))
