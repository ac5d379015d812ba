"""Label and field selectors as the API server parses them (``?labelSelector=``, ``?fieldSelector=``)."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Predicate = Callable[[dict[str, Any]], bool]

_SET_TERM = re.compile(r'^\s*(!?)\s*([^\s!=<>(),]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$')
_EQ_TERM = re.compile(r'^\s*([^\s!=]+)\s*(==|=|!=)\s*([^\s,]*)\s*$')


class SelectorError(ValueError):
    pass


def _split_terms(text: str) -> list[str]:
    # Commas separate terms, except inside the value sets of `in (a,b)`.
    terms, depth, current = [], 0, ''
    for char in text:
        depth += char == '('
        depth -= char == ')'
        if char == ',' and depth == 0:
            terms.append(current)
            current = ''
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda obj: True
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(text):
        if (m := _EQ_TERM.match(term)):
            key, op, value = m.groups()
            if op == '!=':
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif (m := _SET_TERM.match(term)):
            negated, key, op, values = m.groups()
            if op:
                if negated:
                    raise SelectorError(f'invalid label selector term: {term!r}')
                options = {v.strip() for v in values.split(',') if v.strip()}
                if op == 'in':
                    checks.append(lambda labels, k=key, o=options: labels.get(k) in o)
                else:
                    checks.append(lambda labels, k=key, o=options: labels.get(k) not in o)
            elif negated:
                checks.append(lambda labels, k=key: k not in labels)
            else:
                checks.append(lambda labels, k=key: k in labels)
        else:
            raise SelectorError(f'unable to parse requirement: {term!r}')
    return lambda obj: all(check(obj.get('metadata', {}).get('labels') or {}) for check in checks)


# Field labels the real API server accepts; others are refused with 400 there, and here.
SUPPORTED_FIELDS_COMMON = frozenset({'metadata.name', 'metadata.namespace'})
SUPPORTED_FIELDS_EXTRA = {
    ('', 'events'): {'involvedObject.kind', 'involvedObject.namespace', 'involvedObject.name',
                     'involvedObject.uid', 'involvedObject.apiVersion', 'involvedObject.resourceVersion',
                     'involvedObject.fieldPath', 'reason', 'reportingComponent', 'source', 'type'},
    ('events.k8s.io', 'events'): {'regarding.kind', 'regarding.namespace', 'regarding.name',
                                  'regarding.uid', 'reason', 'type', 'reportingController'},
    ('', 'pods'): {'spec.nodeName', 'spec.restartPolicy', 'spec.schedulerName',
                   'spec.serviceAccountName', 'status.phase', 'status.podIP'},
    ('', 'secrets'): {'type'},
    ('', 'namespaces'): {'status.phase'},
}


def _lookup(obj: dict[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split('.'):
        value = value.get(part) if isinstance(value, dict) else None
    return '' if value is None else str(value)


def parse_field_selector(text: str | None, group: str, plural: str, extra: tuple[str, ...] = ()) -> Predicate:
    if not text:
        return lambda obj: True
    supported = SUPPORTED_FIELDS_COMMON | SUPPORTED_FIELDS_EXTRA.get((group, plural), set()) | set(extra)
    checks: list[Predicate] = []
    for term in _split_terms(text):
        m = _EQ_TERM.match(term)
        if not m:
            raise SelectorError(f'invalid field selector: {term!r}')
        field, op, value = m.groups()
        if field not in supported:
            raise SelectorError(f'field label not supported: {field}')
        if op == '!=':
            checks.append(lambda obj, f=field, v=value: _lookup(obj, f) != v)
        else:
            checks.append(lambda obj, f=field, v=value: _lookup(obj, f) == v)
    return lambda obj: all(check(obj) for check in checks)
