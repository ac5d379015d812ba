"""Small facts about Kubernetes objects: timestamps, names, JSON paths, CRD status, field managers."""
from __future__ import annotations

import datetime
import re
from typing import Any

from tests.support.emulator.resources import ResourceType

DNS_SUBDOMAIN = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')
DNS_LABEL = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def manager_from_user_agent(user_agent: str) -> str:
    # As upstream: the default field manager is the user agent's program name.
    return (user_agent.split('/', 1)[0] or 'unknown').strip() or 'unknown'


def name_errors(rtype: ResourceType, name: str) -> list[str]:
    if not name:
        return ['metadata.name: Required value: name or generateName is required']
    pattern, limit = (DNS_LABEL, 63) if rtype.plural == 'namespaces' and not rtype.group else (DNS_SUBDOMAIN, 253)
    if rtype.plural == 'events':
        return []  # event names carry timestamps and dots; upstream is lenient there too
    if len(name) > limit or not pattern.match(name):
        return [f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 '
                f'{"label" if limit == 63 else "subdomain"} must consist of lower case alphanumeric characters, '
                "'-' or '.', and must start and end with an alphanumeric character"]
    return []


def crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    names = crd['spec']['names']
    accepted = {'plural': names['plural'], 'kind': names['kind'],
                'singular': names.get('singular', names['kind'].lower()), 'listKind': names.get('listKind', f"{names['kind']}List")}
    if names.get('shortNames'):
        accepted['shortNames'] = names['shortNames']
    established = now()
    return {'acceptedNames': accepted, 'storedVersions': [v['name'] for v in crd['spec']['versions'] if v.get('storage')],
            'conditions': [{'type': t, 'status': 'True', 'reason': r, 'message': m, 'lastTransitionTime': established}
                           for t, r, m in (('NamesAccepted', 'NoConflicts', 'no conflicts found'),
                                           ('Established', 'InitialNamesAccepted', 'the initial names have been accepted'))]}


def age(timestamp: str | None) -> str:
    """A short age like kubectl prints it (the server renders Table cells)."""
    if not timestamp:
        return '<unknown>'
    then = datetime.datetime.strptime(timestamp, '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.UTC)
    seconds = int((datetime.datetime.now(datetime.UTC) - then).total_seconds())
    for unit, size in (('d', 86400), ('h', 3600), ('m', 60)):
        if seconds >= size * 2:
            return f'{seconds // size}{unit}'
    return f'{max(seconds, 0)}s'


def json_path(obj: Any, path: str) -> Any:
    value = obj
    for part in [p for p in path.strip('.').split('.') if p]:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def set_json_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = [p for p in path.strip('.').split('.') if p]
    for part in parents:
        obj = obj.setdefault(part, {})
    obj[last] = value
