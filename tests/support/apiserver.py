"""
A strict in-memory Kubernetes API server for tests, built on kmock 0.8's HTTP server plumbing.

kmock's ``KubernetesEmulator`` serves objects but is too lenient for kopf and kubectl (no
resourceVersion, no 409s, broken namespace paths, no schemas). This subclass keeps kmock's
``Server``/handler lifecycle and replaces request handling with an API-server-like core:

- metadata: ``uid``, ``resourceVersion`` (one global counter), ``generation`` (spec-bearing kinds
  only, bumped on changes outside metadata/status), ``creationTimestamp``, ``managedFields``;
  writes that change nothing keep the resourceVersion and emit no watch event;
- 404/409/422/400 as Kubernetes ``Status`` objects; stale ``resourceVersion`` on PUT/patch → 409;
- PUT, JSON patch (``test`` ops), merge patch, strategic merge (approximate, see ``patching``),
  server-side apply (create-or-merge, field ownership, conflicts unless ``force=true``);
- ``generateName``, ``dryRun=All``, ``/status`` and ``/scale`` subresources;
- label/field selectors (incl. CRD ``selectableFields``) on list, watch and deletecollection; list pagination (``limit``/``continue``);
- watch with ``resourceVersion`` resume (410 when too old), bookmarks, ``timeoutSeconds``;
- namespaces as real objects; deletion with finalizers, ``propagationPolicy`` and background
  garbage collection by ownerReferences; namespace deletion removes its contents;
- CRDs created through the API become discoverable and are served with pruning, defaulting,
  OpenAPI validation and CEL rules (``tests/support/crd_schema.py``); ``fieldValidation=Strict``
  refuses unknown fields of custom objects instead of pruning them;
- Table output for ``kubectl get``; every request recorded for assertions (``writes()``);
  ``inject_failure()`` answers chosen requests with errors.

Not emulated: authn/authz, admission webhooks, OpenAPI documents (use ``kubectl --validate=false``),
protobuf request bodies (415: typed clients such as ``kubectl create configmap`` fail; ``kubectl
apply/create -f`` send JSON and work), CRD version conversion (objects are stored once and relabelled
per served version), schema validation of built-in kinds (only names/namespaces/label values are
checked), controllers (no Pods from Deployments, no status written by anyone but clients).
Approximations are documented where they live: ``emulator/patching.py`` (strategic merge, SSA
ownership), ``emulator/garbage.py`` (GC), ``crd_schema.py`` (formats, CEL library).
"""
from __future__ import annotations

import argparse
import asyncio
import contextvars
import copy
import dataclasses
import random
import re
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path as FsPath
from typing import Any

import aiohttp.web
import attrs
import kmock
import orjson
import yaml

if __package__ in (None, ''):  # standalone: `python tests/support/apiserver.py`
    sys.path.insert(0, str(FsPath(__file__).resolve().parents[2]))

from tests.support import crd_schema  # noqa: E402
from tests.support.emulator import patching, selectors  # noqa: E402
from tests.support.emulator.errors import ApiError, conflict, invalid, not_found  # noqa: E402
from tests.support.emulator.garbage import GarbageCollector  # noqa: E402
from tests.support.emulator.objects import (  # noqa: E402
    age, crd_status, json_path, manager_from_user_agent, name_errors, now, set_json_path)
from tests.support.emulator.resources import BUILTINS, ResourceType, crd_definition_errors, types_from_crd  # noqa: E402
from tests.support.emulator.store import Change, Store  # noqa: E402

WRITE_METHODS = frozenset({'POST', 'PUT', 'PATCH', 'DELETE'})
DEFAULT_NAMESPACES = ('default', 'kube-system', 'kube-public')
BOOKMARK_INTERVAL_S = 5.0
_GENERATE_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789'


def _body_sans(obj: dict[str, Any], *fields: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in fields}


# ?fieldValidation= of the request being served: Strict refuses unknown fields of custom objects.
_field_validation: contextvars.ContextVar[str] = contextvars.ContextVar('field_validation', default='Ignore')

_SERVER_META = ('uid', 'resourceVersion', 'generation', 'creationTimestamp', 'deletionTimestamp',
                'deletionGracePeriodSeconds', 'managedFields', 'selfLink')


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    seq: int
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    user_agent: str
    status: int = 0

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS


@attrs.define(kw_only=True)
class StrictKubernetesEmulator(GarbageCollector, kmock.KubernetesEmulator):
    """The API server core. Use with ``kmock.Server`` (see ``running_apiserver()``)."""

    store: Store = attrs.field(factory=Store, init=False)
    types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False)
    log: list[RecordedRequest] = attrs.field(factory=list, init=False)
    # Field ownership per object uid: {(manager, operation, subresource): {path: None}}.
    _owners: dict[str, dict[tuple[str, str, str], set[patching.Path]]] = attrs.field(factory=dict, init=False)
    _gc_scheduled: bool = attrs.field(default=False, init=False)
    _faults: list[list[Any]] = attrs.field(factory=list, init=False)  # [method, path regex, code, times left]

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for rtype in BUILTINS:
            self.types[(rtype.group, rtype.version, rtype.plural)] = rtype
        for name in DEFAULT_NAMESPACES:
            self.create_object({'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': name}})

    # --- request accounting -------------------------------------------------------------------

    def mark(self) -> int:
        """A position in the request log, for ``writes(since=…)``."""
        return len(self.log)

    def requests_since(self, since: int = 0) -> list[RecordedRequest]:
        return self.log[since:]

    def writes(self, since: int = 0, path_contains: str = '') -> list[RecordedRequest]:
        return [r for r in self.log[since:] if r.is_write and path_contains in r.path]

    def count_writes(self, since: int = 0, path_contains: str = '') -> int:
        return len(self.writes(since, path_contains))

    def inject_failure(self, method: str, path_pattern: str, code: int = 500, times: int = 1) -> None:
        """Answer the next ``times`` requests matching ``method`` and the ``path_pattern`` regex
        (searched in the path) with an error Status of ``code``, before any processing —
        for testing clients' retries and error handling."""
        self._faults.append([method.upper(), re.compile(path_pattern), code, times])

    def _injected_failure(self, raw: aiohttp.web.BaseRequest) -> ApiError | None:
        for fault in self._faults:
            method, pattern, code, left = fault
            if left > 0 and method == raw.method and pattern.search(raw.path):
                fault[3] -= 1
                return ApiError(code, 'InternalError' if code >= 500 else 'Injected', f'injected failure ({code})')
        return None

    # --- direct (in-process) API for tests and preloading ---------------------------------------

    def create_object(self, obj: dict[str, Any], manager: str = 'emulator') -> dict[str, Any]:
        rtype = self._type_for_object(obj)
        namespace = obj.get('metadata', {}).get('namespace') if rtype.namespaced else None
        return self._create(rtype, namespace, copy.deepcopy(obj), manager=manager, dry_run=False)

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        rtype = self._type_for_object({'apiVersion': api_version, 'kind': kind})
        obj = self.store.get(rtype.group_plural, namespace if rtype.namespaced else None, name)
        return self._present(rtype, obj) if obj is not None else None

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None,
                      propagation: str = 'Background') -> dict[str, Any]:
        rtype = self._type_for_object({'apiVersion': api_version, 'kind': kind})
        return self._delete(rtype, namespace if rtype.namespaced else None, name,
                            {'propagationPolicy': propagation}, {}, False)

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        rtype = self._type_for_object({'apiVersion': api_version, 'kind': kind})
        objs = self.store.objects[rtype.group_plural].values()
        return [self._present(rtype, o) for o in objs if namespace is None or o['metadata'].get('namespace') == namespace]

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 10.0) -> None:
        """Poll until ``predicate()`` is truthy (for eventual effects such as background GC)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f'the condition was not met within {timeout}s')
            await asyncio.sleep(0.01)

    def stop_watches(self) -> None:
        """End all open watch streams (so that the HTTP server can shut down promptly)."""
        self.store.close_all_watches()

    def _type_for_object(self, obj: dict[str, Any]) -> ResourceType:
        api_version, kind = obj.get('apiVersion', ''), obj.get('kind', '')
        for rtype in self.types.values():
            if rtype.api_version == api_version and rtype.kind == kind:
                return rtype
        raise ApiError(404, 'NotFound', f'the server could not find the requested resource ({api_version} {kind})')

    # --- HTTP entry point ---------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's own request parsing cannot handle e.g. /api/v1/namespaces; we parse ourselves.
        body = await raw.read()
        seq = len(self.log)
        self.log.append(RecordedRequest(seq, raw.method, raw.path, dict(raw.query),
                                        raw.headers.get('Content-Type', ''), raw.headers.get('User-Agent', '')))
        try:
            if (fault := self._injected_failure(raw)) is not None:
                raise fault
            response = await self._route(raw, body)
        except ApiError as exc:
            response = self._json(exc.status(), exc.code)
        except Exception as exc:  # a bug here must reach the client as a 500, not a hung request
            response = self._json(ApiError(500, 'InternalError', f'{type(exc).__name__}: {exc}').status(), 500)
        self.log[seq] = dataclasses.replace(self.log[seq], status=response.status)
        return response

    @staticmethod
    def _json(payload: Any, status: int = 200) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=orjson.dumps(payload), status=status, content_type='application/json')

    async def _route(self, raw: aiohttp.web.BaseRequest, body: bytes) -> aiohttp.web.StreamResponse:
        parts = [p for p in raw.path.split('/') if p]
        if raw.method == 'GET':
            discovery = self._discovery(parts, raw)
            if discovery is not None:
                return self._json(discovery)
        if len(parts) >= 2 and parts[0] == 'api':
            group, version, rest = '', parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == 'apis':
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, 'NotFound', f'the server could not find the requested resource ({raw.path})')
        namespace = None
        if len(rest) >= 3 and rest[0] == 'namespaces' and (group, version, rest[2]) in self.types:
            namespace, rest = rest[1], rest[2:]
        if not rest or (group, version, rest[0]) not in self.types:
            raise ApiError(404, 'NotFound', f'the server could not find the requested resource ({raw.path})')
        rtype = self.types[(group, version, rest[0])]
        name = rest[1] if len(rest) > 1 else None
        sub = '/'.join(rest[2:]) or None
        if sub is not None and sub not in rtype.subresources:
            raise ApiError(404, 'NotFound', f'the server could not find the requested resource ({raw.path})')
        if rtype.namespaced and namespace is None and name is not None:
            raise ApiError(404, 'NotFound', f'namespace is required for {rtype.plural}')
        if not rtype.namespaced:
            namespace = None
        query = raw.query
        _field_validation.set(query.get('fieldValidation', 'Ignore'))
        dry_run = query.get('dryRun') == 'All'
        manager = query.get('fieldManager') or manager_from_user_agent(raw.headers.get('User-Agent', ''))

        if raw.method == 'GET' and name is None:
            if query.get('watch') in ('true', '1'):
                return await self._watch(raw, rtype, namespace)
            return self._json(self._list(rtype, namespace, raw))
        if raw.method == 'GET':
            obj = self._existing(rtype, namespace, name)
            if sub == 'scale':
                return self._json(self._scale_of(rtype, obj))
            return self._json(self._maybe_table(rtype, [obj], raw, single=True))
        if raw.method == 'POST' and name is None:
            data = self._parse_body(body, raw.content_type)
            return self._json(self._create(rtype, namespace, data, manager=manager, dry_run=dry_run), 201)
        if raw.method == 'PUT' and name is not None:
            data = self._parse_body(body, raw.content_type)
            return self._json(self._replace(rtype, namespace, name, sub, data, manager, dry_run))
        if raw.method == 'PATCH' and name is not None:
            existed = self.store.get(rtype.group_plural, namespace, name) is not None
            patched = self._patch(rtype, namespace, name, sub, body, raw, manager, dry_run)
            return self._json(patched, 200 if existed else 201)  # server-side apply may create
        if raw.method == 'DELETE' and name is not None:
            options = self._parse_body(body, raw.content_type) if body else {}
            return self._json(self._delete(rtype, namespace, name, options, query, dry_run))
        if raw.method == 'DELETE':
            options = self._parse_body(body, raw.content_type) if body else {}
            matches = self._select(rtype, namespace, query)
            deleted = [self._delete(rtype, o['metadata'].get('namespace'), o['metadata']['name'], options, query, dry_run)
                       for o in matches]
            return self._json({'apiVersion': rtype.api_version, 'kind': f'{rtype.kind}List',
                               'metadata': {'resourceVersion': str(self.store.rv)}, 'items': deleted})
        raise ApiError(405, 'MethodNotAllowed', f'{raw.method} is not supported on {raw.path}')

    @staticmethod
    def _parse_body(body: bytes, content_type: str) -> Any:
        if 'protobuf' in content_type or 'cbor' in content_type:
            # client-go retries with JSON after a 415 (typed clients, e.g. `kubectl create cm`).
            raise ApiError(415, 'UnsupportedMediaType', f'the body of type {content_type} is not supported; use JSON')
        try:
            data = yaml.safe_load(body) if 'yaml' in content_type else orjson.loads(body)
        except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
            raise ApiError(400, 'BadRequest', f'the request body cannot be decoded: {exc}') from exc
        return data

    # --- discovery ----------------------------------------------------------------------------

    def _discovery(self, parts: list[str], raw: aiohttp.web.BaseRequest) -> dict[str, Any] | None:
        if not parts:
            return {'paths': sorted({'/api', '/api/v1', '/apis', '/version', '/healthz'} |
                                    {f'/apis/{t.group}/{t.version}' for t in self.types.values() if t.group})}
        if parts == ['version']:
            return {'major': '1', 'minor': '32', 'gitVersion': 'v1.32.0-emulator', 'platform': 'linux/amd64',
                    'goVersion': 'go1.23', 'compiler': 'gc', 'gitTreeState': 'clean', 'buildDate': '2026-01-01T00:00:00Z',
                    'gitCommit': '0' * 40}
        if parts in (['healthz'], ['readyz'], ['livez']):
            return {'status': 'ok'}
        if parts == ['api']:
            return {'kind': 'APIVersions', 'versions': ['v1'], 'serverAddressByClientCIDRs': [
                {'clientCIDR': '0.0.0.0/0', 'serverAddress': f'{raw.host}'}]}
        if parts == ['api', 'v1']:
            return self._resource_list('', 'v1')
        if parts == ['apis']:
            return {'kind': 'APIGroupList', 'apiVersion': 'v1', 'groups': [self._group(g) for g in self._groups()]}
        if len(parts) == 2 and parts[0] == 'apis':
            if parts[1] not in self._groups():
                raise ApiError(404, 'NotFound', f'the server could not find the requested resource ({raw.path})')
            return {'kind': 'APIGroup', 'apiVersion': 'v1', **self._group(parts[1])}
        if len(parts) == 3 and parts[0] == 'apis':
            if not any(t.group == parts[1] and t.version == parts[2] for t in self.types.values()):
                raise ApiError(404, 'NotFound', f'the server could not find the requested resource ({raw.path})')
            return self._resource_list(parts[1], parts[2])
        return None

    def _groups(self) -> list[str]:
        return list(dict.fromkeys(t.group for t in self.types.values() if t.group))

    def _group(self, group: str) -> dict[str, Any]:
        versions = list(dict.fromkeys(t.version for t in self.types.values() if t.group == group))
        entries = [{'groupVersion': f'{group}/{v}', 'version': v} for v in versions]
        return {'name': group, 'versions': entries, 'preferredVersion': entries[0]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        return {'kind': 'APIResourceList', 'apiVersion': 'v1', 'groupVersion': f'{group}/{version}' if group else version,
                'resources': [e for t in self.types.values() if t.group == group and t.version == version
                              for e in t.discovery_entries()]}

    # --- reads --------------------------------------------------------------------------------

    def _present(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        # One stored copy serves all versions of a resource (no conversion): relabel apiVersion.
        return obj if obj.get('apiVersion') == rtype.api_version else {**obj, 'apiVersion': rtype.api_version}

    def _existing(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.store.get(rtype.group_plural, namespace, name)
        if obj is None:
            raise not_found(rtype, name)
        return self._present(rtype, obj)

    def _predicate(self, rtype: ResourceType, namespace: str | None, query: Any) -> Callable[[dict[str, Any]], bool]:
        try:
            labels = selectors.parse_label_selector(query.get('labelSelector'))
            fields = selectors.parse_field_selector(query.get('fieldSelector'), rtype.group, rtype.plural,
                                                    rtype.selectable_fields)
        except selectors.SelectorError as exc:
            raise ApiError(400, 'BadRequest', str(exc)) from exc
        return lambda o: ((namespace is None or o['metadata'].get('namespace') == namespace)
                          and labels(o) and fields(o))

    def _select(self, rtype: ResourceType, namespace: str | None, query: Any) -> list[dict[str, Any]]:
        predicate = self._predicate(rtype, namespace, query)
        objs = [o for o in self.store.objects[rtype.group_plural].values() if predicate(o)]
        objs.sort(key=lambda o: (o['metadata'].get('namespace') or '', o['metadata']['name']))
        return [self._present(rtype, o) for o in objs]

    def _list(self, rtype: ResourceType, namespace: str | None, raw: aiohttp.web.BaseRequest) -> dict[str, Any]:
        items = self._select(rtype, namespace, raw.query)
        meta: dict[str, Any] = {'resourceVersion': str(self.store.rv)}
        limit = int(raw.query.get('limit') or 0)
        start = int(raw.query.get('continue') or 0)
        if limit:
            if start + limit < len(items):
                meta['continue'] = str(start + limit)
                meta['remainingItemCount'] = len(items) - start - limit
            items = items[start:start + limit]
        if 'as=Table' in raw.headers.get('Accept', ''):
            return {**self._maybe_table(rtype, items, raw, single=False), 'metadata': meta}
        return {'apiVersion': rtype.api_version, 'kind': f'{rtype.kind}List', 'metadata': meta, 'items': items}

    def _maybe_table(self, rtype: ResourceType, objs: list[dict[str, Any]], raw: aiohttp.web.BaseRequest,
                     single: bool) -> dict[str, Any]:
        if 'as=Table' not in raw.headers.get('Accept', ''):
            return objs[0] if single else {'items': objs}
        columns = [{'name': 'Name', 'type': 'string', 'format': 'name', 'description': 'Name', 'priority': 0}]
        columns += [{'name': c['name'], 'type': c.get('type', 'string'), 'format': c.get('format', ''),
                     'description': c.get('description', ''), 'priority': c.get('priority', 0)}
                    for c in rtype.printer_columns]
        # A CRD that declares its own Age column gets no second one; `date` cells read as ages, as upstream.
        default_age = not any(c['name'] == 'Age' for c in rtype.printer_columns)
        if default_age:
            columns.append({'name': 'Age', 'type': 'date', 'format': '', 'description': 'Age', 'priority': 0})

        def cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
            value = json_path(obj, column.get('jsonPath', ''))
            return age(value) if column.get('type') == 'date' and isinstance(value, str) else value
        rows = [{'cells': [o['metadata']['name'], *[cell(o, c) for c in rtype.printer_columns],
                           *([age(o['metadata'].get('creationTimestamp'))] if default_age else [])],
                 'object': o} for o in objs]
        return {'apiVersion': 'meta.k8s.io/v1', 'kind': 'Table', 'metadata': {'resourceVersion': str(self.store.rv)},
                'columnDefinitions': columns, 'rows': rows}

    def _scale_of(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        spec_path, status_path, selector_path = self._scale_paths(rtype)
        return {'apiVersion': 'autoscaling/v1', 'kind': 'Scale',
                'metadata': {k: obj['metadata'][k] for k in ('name', 'namespace', 'uid', 'resourceVersion',
                                                             'creationTimestamp') if k in obj['metadata']},
                'spec': {'replicas': json_path(obj, spec_path) or 0},
                'status': {'replicas': json_path(obj, status_path) or 0,
                           **({'selector': json_path(obj, selector_path)} if selector_path and json_path(obj, selector_path) else {})}}

    @staticmethod
    def _scale_paths(rtype: ResourceType) -> tuple[str, str, str]:
        if rtype.crd is not None:
            for version in rtype.crd['spec']['versions']:
                if version['name'] == rtype.version:
                    scale = (version.get('subresources') or {}).get('scale') or {}
                    return (scale.get('specReplicasPath', '.spec.replicas'), scale.get('statusReplicasPath', '.status.replicas'),
                            scale.get('labelSelectorPath', ''))
        return '.spec.replicas', '.status.replicas', ''

    # --- watch --------------------------------------------------------------------------------

    async def _watch(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType, namespace: str | None) -> aiohttp.web.StreamResponse:
        predicate = self._predicate(rtype, namespace, raw.query)
        since = raw.query.get('resourceVersion') or '0'
        bookmarks = raw.query.get('allowWatchBookmarks') in ('true', '1')
        deadline = time.monotonic() + float(raw.query.get('timeoutSeconds') or 1e9)
        # Subscribe before taking the snapshot: no change can slip in between (no await in between).
        watcher = self.store.subscribe(rtype.group_plural)
        try:
            if since == '0':
                backlog = [('ADDED', self._present(rtype, o)) for o in self._select(rtype, namespace, raw.query)]
            else:
                changes = self.store.replay_since(rtype.group_plural, int(since))
                backlog = [] if changes is None else self._visible(rtype, changes, predicate)
                if changes is None:
                    backlog = [('ERROR', ApiError(410, 'Expired', f'too old resource version: {since} '
                                                  f'({self.store.rv})').status())]
            response = aiohttp.web.StreamResponse(headers={'Content-Type': 'application/json'})
            await response.prepare(raw)
            for event_type, obj in backlog:
                await response.write(orjson.dumps({'type': event_type, 'object': obj}) + b'\n')
            if backlog and backlog[0][0] == 'ERROR':
                return response
            if bookmarks:
                await response.write(self._bookmark(rtype))
            while (left := deadline - time.monotonic()) > 0:
                if raw.transport is None or raw.transport.is_closing():
                    break
                try:
                    change = await asyncio.wait_for(watcher.queue.get(), timeout=min(left, BOOKMARK_INTERVAL_S))
                except TimeoutError:
                    if bookmarks:
                        await response.write(self._bookmark(rtype))
                    continue
                if change is None:
                    break
                for event_type, obj in self._visible(rtype, [change], predicate):
                    await response.write(orjson.dumps({'type': event_type, 'object': obj}) + b'\n')
            return response
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return aiohttp.web.Response(status=499)
        finally:
            self.store.unsubscribe(watcher)

    def _bookmark(self, rtype: ResourceType) -> bytes:
        return orjson.dumps({'type': 'BOOKMARK', 'object': {'apiVersion': rtype.api_version, 'kind': rtype.kind,
                                                            'metadata': {'resourceVersion': str(self.store.rv)}}}) + b'\n'

    def _visible(self, rtype: ResourceType, changes: list[Change], predicate: Callable[[dict[str, Any]], bool]) -> list[tuple[str, Any]]:
        """Events as a selector-filtered watcher sees them: entering the selection is ADDED,
        leaving it is DELETED (as upstream)."""
        events = []
        for change in changes:
            after = predicate(change.obj)
            before = change.old is not None and predicate(change.old)
            if change.type == 'DELETED':
                kind = 'DELETED' if after else None
            elif after and before:
                kind = 'MODIFIED'
            elif after:
                kind = 'ADDED'
            elif before:
                kind = 'DELETED'
            else:
                kind = None
            if kind:
                events.append((kind, self._present(rtype, change.obj)))
        return events

    # --- writes -------------------------------------------------------------------------------

    def _check_kind(self, rtype: ResourceType, obj: Any) -> None:
        if not isinstance(obj, dict):
            raise ApiError(400, 'BadRequest', 'the request body must be a JSON/YAML object')
        # Absent apiVersion/kind default to the endpoint's (as upstream); only mismatches fail.
        obj.setdefault('apiVersion', rtype.api_version)
        obj.setdefault('kind', rtype.kind)
        if obj.get('kind') != rtype.kind or obj.get('apiVersion') != rtype.api_version:
            raise ApiError(400, 'BadRequest', f'the API version in the data ({obj.get("apiVersion")}) and kind '
                           f'({obj.get("kind")}) do not match the endpoint ({rtype.api_version} {rtype.kind})')
        if not isinstance(obj.get('metadata', {}), dict):
            raise ApiError(400, 'BadRequest', 'metadata must be an object')

    def _validate(self, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Prune/default/validate custom objects and CRDs; returns the object to store."""
        name = obj['metadata'].get('name', '')
        errors = []
        meta_errors = name_errors(rtype, name)
        if meta_errors:
            raise invalid(rtype, name, meta_errors)
        for field in ('labels', 'annotations'):
            for key, value in (obj['metadata'].get(field) or {}).items():
                if not isinstance(value, str):
                    errors.append(f'metadata.{field}: Invalid value: {value!r}: values must be strings ({key})')
        if rtype.crd is not None:
            sent, obj = obj, crd_schema.default_and_prune(rtype.crd, obj)
            unknown = crd_schema.unknown_fields(_body_sans(sent, 'metadata'), obj)
            if unknown and _field_validation.get() == 'Strict':
                raise ApiError(400, 'BadRequest', 'strict decoding error: ' +
                               ', '.join(f'unknown field "{u}"' for u in unknown))
            errors += crd_schema.validate_custom_object(rtype.crd, obj, old)
        if rtype.plural == 'customresourcedefinitions' and rtype.group == 'apiextensions.k8s.io':
            errors += crd_definition_errors(obj)
        if errors:
            raise invalid(rtype, name, errors)
        return obj

    def _create(self, rtype: ResourceType, namespace: str | None, obj: Any, *, manager: str, dry_run: bool,
                operation: str = 'Update') -> dict[str, Any]:
        self._check_kind(rtype, obj)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault('metadata', {})
        for field in _SERVER_META:
            meta.pop(field, None)
        if rtype.namespaced:
            if namespace and meta.get('namespace') and meta['namespace'] != namespace:
                raise ApiError(400, 'BadRequest', 'the namespace of the provided object does not match the namespace sent on the request')
            namespace = namespace or meta.get('namespace')
            if not namespace:
                raise ApiError(400, 'BadRequest', f'a namespace is required to create {rtype.plural}')
            ns_obj = self.store.get(('', 'namespaces'), None, namespace)
            if ns_obj is None:
                raise ApiError(404, 'NotFound', f'namespaces "{namespace}" not found',
                               {'name': namespace, 'kind': 'namespaces'})
            if ns_obj['metadata'].get('deletionTimestamp'):
                raise ApiError(403, 'Forbidden', f'{rtype.plural} "{meta.get("name") or meta.get("generateName")}" is '
                               f'forbidden: unable to create new content in namespace {namespace} because it is being terminated')
            meta['namespace'] = namespace
        else:
            meta.pop('namespace', None)
        if not meta.get('name') and meta.get('generateName'):
            meta['name'] = meta['generateName'] + ''.join(random.choices(_GENERATE_ALPHABET, k=5))
        if rtype.has_status:
            obj.pop('status', None)  # status is written through /status only
        if rtype.plural == 'namespaces' and not rtype.group:
            obj['spec'] = {'finalizers': ['kubernetes']}
            obj['status'] = {'phase': 'Active'}
        obj = self._validate(rtype, obj, None)
        meta = obj['metadata']
        if self.store.get(rtype.group_plural, meta.get('namespace'), meta['name']) is not None:
            what = f'{rtype.plural}.{rtype.group}' if rtype.group else rtype.plural
            raise ApiError(409, 'AlreadyExists', f'{what} "{meta["name"]}" already exists',
                           {'name': meta['name'], 'group': rtype.group, 'kind': rtype.plural})
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
        if rtype.tracks_generation:
            meta['generation'] = 1
        if rtype.plural == 'customresourcedefinitions' and rtype.group == 'apiextensions.k8s.io':
            obj['status'] = crd_status(obj)
        if dry_run:
            return obj
        meta['resourceVersion'] = str(self.store.next_rv())
        self._own(meta['uid'], manager, operation, '', set(patching.owned_paths_of(obj)))
        obj = self._with_managed_fields(rtype, obj)
        self.store.put(rtype.group_plural, obj, None)
        if rtype.plural == 'customresourcedefinitions' and rtype.group == 'apiextensions.k8s.io':
            self._register_crd(obj)
        return self._present(rtype, obj)

    def _replace(self, rtype: ResourceType, namespace: str | None, name: str, sub: str | None, obj: Any,
                 manager: str, dry_run: bool) -> dict[str, Any]:
        old = self._existing(rtype, namespace, name)
        if sub == 'scale':
            return self._write_scale(rtype, old, obj, manager, dry_run)
        self._check_kind(rtype, obj)
        rv = (obj.get('metadata') or {}).get('resourceVersion')
        if rv is None and rtype.crd is not None:
            raise invalid(rtype, name, ['metadata.resourceVersion: Invalid value: 0x0: must be specified for an update'])
        if rv is not None and rv != old['metadata']['resourceVersion']:
            raise conflict(rtype, name)
        if (obj.get('metadata') or {}).get('name', name) != name:
            raise ApiError(400, 'BadRequest', 'the name of the object does not match the name on the URL')
        return self._update(rtype, old, copy.deepcopy(obj), sub, manager, 'Update', dry_run)

    def _patch(self, rtype: ResourceType, namespace: str | None, name: str, sub: str | None, body: bytes,
               raw: aiohttp.web.BaseRequest, manager: str, dry_run: bool) -> dict[str, Any]:
        content_type = raw.content_type
        patch = self._parse_body(body, content_type)
        if content_type == 'application/apply-patch+yaml':
            if not raw.query.get('fieldManager'):
                raise ApiError(422, 'Invalid', 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                               'is required for apply patch')
            return self._apply(rtype, namespace, name, sub, patch, manager, raw.query.get('force') == 'true', dry_run)
        old = self._existing(rtype, namespace, name)
        base = self._scale_of(rtype, old) if sub == 'scale' else old
        try:
            if content_type == 'application/json-patch+json':
                new = patching.json_patch(copy.deepcopy(base), patch)
            elif content_type == 'application/merge-patch+json':
                new = patching.merge_patch(base, patch)
            elif content_type == 'application/strategic-merge-patch+json':
                if rtype.crd is not None:
                    raise ApiError(415, 'UnsupportedMediaType', 'strategic merge patch is not supported for custom resources')
                new = patching.strategic_merge(base, patch)
            else:
                raise ApiError(415, 'UnsupportedMediaType', f'the patch content type {content_type!r} is not supported')
        except patching.PatchTestFailed as exc:
            raise conflict(rtype, name, str(exc)) from exc
        except patching.PatchError as exc:
            raise ApiError(422, 'Invalid', str(exc)) from exc
        if not isinstance(new, dict):
            raise ApiError(422, 'Invalid', 'the patched object is not an object')
        if (new.get('metadata') or {}).get('resourceVersion', base['metadata']['resourceVersion']) != base['metadata']['resourceVersion']:
            raise conflict(rtype, name)
        if sub == 'scale':
            return self._write_scale(rtype, old, new, manager, dry_run)
        return self._update(rtype, old, new, sub, manager, 'Update', dry_run)

    def _write_scale(self, rtype: ResourceType, old: dict[str, Any], scale: dict[str, Any], manager: str,
                     dry_run: bool) -> dict[str, Any]:
        replicas = (scale.get('spec') or {}).get('replicas')
        if not isinstance(replicas, int) or replicas < 0:
            raise invalid(rtype, old['metadata']['name'], [f'spec.replicas: Invalid value: {replicas!r}: must be a non-negative integer'])
        new = copy.deepcopy(old)
        set_json_path(new, self._scale_paths(rtype)[0], replicas)
        self._update(rtype, old, new, None, manager, 'Update', dry_run)
        return self._scale_of(rtype, self._existing(rtype, old['metadata'].get('namespace'), old['metadata']['name']))

    def _apply(self, rtype: ResourceType, namespace: str | None, name: str, sub: str | None, applied: Any,
               manager: str, force: bool, dry_run: bool) -> dict[str, Any]:
        self._check_kind(rtype, applied)
        if (applied.get('metadata') or {}).get('name', name) != name:
            raise ApiError(400, 'BadRequest', 'the name of the object does not match the name on the URL')
        old = self.store.get(rtype.group_plural, namespace, name)
        if old is None:
            if sub:
                raise not_found(rtype, name)
            applied.setdefault('metadata', {})['name'] = name
            return self._create(rtype, namespace, applied, manager=manager, dry_run=dry_run, operation='Apply')
        old = self._present(rtype, old)
        uid = old['metadata']['uid']
        mine = (manager, 'Apply', sub or '')
        applied_paths = patching.owned_paths_of(applied)
        if sub == 'status':
            applied_paths = {p: v for p, v in applied_paths.items() if p[:1] == ('f:status',)}
        current = patching.owned_paths_of(old)
        conflicts = [(owner[0], path) for owner, paths in self._owners.get(uid, {}).items() if owner != mine
                     for path in paths & applied_paths.keys() if path in current and current[path] != applied_paths[path]]
        if conflicts and not force:
            listing = '\n'.join(f'- conflict with "{m}": {patching.render_path(p)}' for m, p in conflicts)
            raise ApiError(409, 'Conflict', f'Apply failed with {len(conflicts)} conflict{"s" if len(conflicts) > 1 else ""}: {listing}',
                           {'causes': [{'reason': 'FieldManagerConflict', 'message': f'conflict with "{m}"',
                                        'field': patching.render_path(p)} for m, p in conflicts]})
        merged = patching.strategic_merge(copy.deepcopy(old), _body_sans(applied, 'status') if sub != 'status'
                                          else {'status': applied.get('status')})
        others = set().union(*[paths for owner, paths in self._owners.get(uid, {}).items() if owner != mine])
        for path in self._owners.get(uid, {}).get(mine, set()) - applied_paths.keys() - others:
            patching.remove_path(merged, path)  # fields this manager stopped applying
        return self._update(rtype, old, merged, sub, manager, 'Apply', dry_run,
                            applied_paths=set(applied_paths), force=force)

    def _update(self, rtype: ResourceType, old: dict[str, Any], new: dict[str, Any], sub: str | None, manager: str,
                operation: str, dry_run: bool, applied_paths: set[patching.Path] | None = None,
                force: bool = False) -> dict[str, Any]:
        old_meta = old['metadata']
        if sub == 'status':
            new = {**old, 'status': new.get('status')} if new.get('status') is not None else _body_sans(old, 'status')
        elif rtype.has_status:
            new = {**_body_sans(new, 'status'), **({'status': old['status']} if 'status' in old else {})}
        meta = dict(new.get('metadata') or {})
        for field in _SERVER_META:
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        meta['name'], meta['namespace'] = old_meta['name'], old_meta.get('namespace')
        if meta['namespace'] is None:
            del meta['namespace']
        new['metadata'] = meta
        new['apiVersion'], new['kind'] = rtype.api_version, rtype.kind
        if old_meta.get('deletionTimestamp'):
            added = set(meta.get('finalizers') or []) - set(old_meta.get('finalizers') or [])
            if added:
                raise invalid(rtype, meta['name'], [f'metadata.finalizers: Forbidden: no new finalizers can be added '
                                                     f'if the object is being deleted, found new finalizers {sorted(added)}'])
        new = self._validate(rtype, new, old)
        ownership_unchanged = applied_paths is None or \
            self._owners.get(old_meta['uid'], {}).get((manager, 'Apply', sub or '')) == applied_paths
        if _body_sans(new, 'metadata') == _body_sans(old, 'metadata') and ownership_unchanged and \
                _body_sans(new['metadata'], 'managedFields') == _body_sans(old_meta, 'managedFields'):
            return old  # a no-op write changes nothing, not even the resourceVersion (as upstream)
        spec_fields = ('metadata', 'status') if rtype.has_status else ('metadata',)
        if rtype.tracks_generation and _body_sans(new, *spec_fields) != _body_sans(old, *spec_fields):
            new['metadata']['generation'] = old_meta.get('generation', 1) + 1
        if rtype.plural == 'customresourcedefinitions' and rtype.group == 'apiextensions.k8s.io':
            new['status'] = crd_status(new)
        if dry_run:
            return new
        new['metadata']['resourceVersion'] = str(self.store.next_rv())
        uid = old_meta['uid']
        if applied_paths is not None:
            if force:
                self._disown(uid, applied_paths)
            self._owners.setdefault(uid, {})[(manager, 'Apply', sub or '')] = applied_paths
        else:
            before, after = patching.owned_paths_of(old), patching.owned_paths_of(new)
            changed = {p for p, v in after.items() if before.get(p, object()) != v}
            self._disown(uid, changed)
            self._own(uid, manager, operation, sub or '', changed)
        self._drop_vanished_ownership(uid, new)
        new = self._with_managed_fields(rtype, new)
        self.store.put(rtype.group_plural, new, old)
        if rtype.plural == 'customresourcedefinitions' and rtype.group == 'apiextensions.k8s.io':
            self._register_crd(new)
        if meta.get('deletionTimestamp') and not meta.get('finalizers'):
            self._remove(rtype, new)
        return self._present(rtype, new)

    def _delete(self, rtype: ResourceType, namespace: str | None, name: str, options: Any, query: Any,
                dry_run: bool) -> dict[str, Any]:
        obj = self._existing(rtype, namespace, name)
        options = options if isinstance(options, dict) else {}
        preconditions = options.get('preconditions') or {}
        if preconditions.get('uid') not in (None, obj['metadata']['uid']):
            raise conflict(rtype, name, f'Precondition failed: UID in precondition: {preconditions["uid"]}, '
                            f'UID in object meta: {obj["metadata"]["uid"]}')
        if preconditions.get('resourceVersion') not in (None, obj['metadata']['resourceVersion']):
            raise conflict(rtype, name)
        dry_run = dry_run or options.get('dryRun') == ['All']
        policy = options.get('propagationPolicy') or query.get('propagationPolicy') or 'Background'
        if options.get('orphanDependents') is True:
            policy = 'Orphan'
        if dry_run:
            return obj
        meta = obj['metadata']
        if policy == 'Orphan':
            self._orphan_dependents(meta['uid'])
        finalizers = list(meta.get('finalizers') or [])
        if policy == 'Foreground' and self._dependents(meta['uid']) and 'foregroundDeletion' not in finalizers:
            finalizers.append('foregroundDeletion')
        is_namespace = rtype.plural == 'namespaces' and not rtype.group
        if finalizers or is_namespace:
            if meta.get('deletionTimestamp') and finalizers == list(meta.get('finalizers') or []):
                return obj  # already being deleted; deleting again changes nothing
            new = copy.deepcopy(obj)
            new['metadata'].update(deletionTimestamp=meta.get('deletionTimestamp') or now(),
                                   deletionGracePeriodSeconds=0, finalizers=finalizers,
                                   resourceVersion=str(self.store.next_rv()))
            if rtype.tracks_generation:
                new['metadata']['generation'] = meta.get('generation', 1) + 1
            if not finalizers:
                del new['metadata']['finalizers']
            if is_namespace:
                new['status'] = {'phase': 'Terminating'}
            self.store.put(rtype.group_plural, new, obj)
            self._schedule_gc()
            return self._present(rtype, new)
        self._remove(rtype, obj)
        return obj

    def _remove(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        gone = {**obj, 'metadata': {**obj['metadata'], 'resourceVersion': str(self.store.next_rv())}}
        self.store.remove(rtype.group_plural, gone)
        self._owners.pop(obj['metadata']['uid'], None)
        if rtype.plural == 'customresourcedefinitions' and rtype.group == 'apiextensions.k8s.io':
            self._unregister_crd(obj)
        self._schedule_gc()

    # --- field managers -----------------------------------------------------------------------

    def _own(self, uid: str, manager: str, operation: str, sub: str, paths: set[patching.Path]) -> None:
        if paths:
            self._owners.setdefault(uid, {}).setdefault((manager, operation, sub), set()).update(paths)

    def _disown(self, uid: str, paths: set[patching.Path]) -> None:
        for owned in self._owners.get(uid, {}).values():
            owned -= paths

    def _drop_vanished_ownership(self, uid: str, obj: dict[str, Any]) -> None:
        present = patching.owned_paths_of(obj).keys()
        owners = self._owners.get(uid, {})
        for owner in list(owners):
            owners[owner] &= present
            if not owners[owner] and owner[1] != 'Apply':
                del owners[owner]

    def _with_managed_fields(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        entries = [{'manager': m, 'operation': op, 'apiVersion': rtype.api_version, 'time': now(),
                    'fieldsType': 'FieldsV1', 'fieldsV1': patching.fields_v1(paths), **({'subresource': s} if s else {})}
                   for (m, op, s), paths in self._owners.get(obj['metadata']['uid'], {}).items()]
        obj['metadata']['managedFields'] = entries
        if not entries:
            del obj['metadata']['managedFields']
        return obj

    # --- CRDs ---------------------------------------------------------------------------------

    def _register_crd(self, crd: dict[str, Any]) -> None:
        self._unregister_crd(crd, keep_objects=True)
        for rtype in types_from_crd(crd):
            self.types[(rtype.group, rtype.version, rtype.plural)] = rtype

    def _unregister_crd(self, crd: dict[str, Any], keep_objects: bool = False) -> None:
        spec = crd.get('spec', {})
        group, plural = spec.get('group'), spec.get('names', {}).get('plural')
        for key in [k for k in self.types if k[0] == group and k[2] == plural]:
            del self.types[key]
        if not keep_objects:
            for obj in self.store.drop_resource((group, plural)):
                self._owners.pop(obj['metadata']['uid'], None)

# --- running it ---------------------------------------------------------------------------------

def kubeconfig_text(url: str, namespace: str = 'default') -> str:
    return yaml.safe_dump({
        'apiVersion': 'v1', 'kind': 'Config', 'preferences': {},
        'clusters': [{'name': 'emulator', 'cluster': {'server': url}}],
        'users': [{'name': 'emulator', 'user': {'token': 'emulator'}}],
        'contexts': [{'name': 'emulator', 'context': {'cluster': 'emulator', 'user': 'emulator', 'namespace': namespace}}],
        'current-context': 'emulator',
    })


class running_apiserver:
    """``async with running_apiserver() as (emulator, url): ...`` — serve on 127.0.0.1 (free port
    unless given), and shut down promptly (open watches are ended first)."""

    def __init__(self, port: int | None = None, crds: list[dict[str, Any]] = ()) -> None:
        self.emulator = StrictKubernetesEmulator()
        self.server = kmock.Server(self.emulator, port=port)
        for crd in crds:
            self.emulator.create_object(crd)

    async def __aenter__(self) -> tuple[StrictKubernetesEmulator, str]:
        await self.emulator.__aenter__()
        await self.server.__aenter__()
        return self.emulator, str(self.server.url).rstrip('/')

    async def __aexit__(self, *exc: Any) -> None:
        self.emulator.stop_watches()
        await asyncio.sleep(0)
        await self.server.__aexit__(*exc)
        await self.emulator.__aexit__(*exc)


def load_manifests(path: str) -> list[dict[str, Any]]:
    with open(path, encoding='utf-8') as file:
        return [doc for doc in yaml.safe_load_all(file) if doc]


async def _serve(port: int, kubeconfig: str | None, crd_files: list[str]) -> None:
    crds = [doc for path in crd_files for doc in load_manifests(path)]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_apiserver(port=port, crds=crds) as (_, url):
        if kubeconfig:
            FsPath(kubeconfig).write_text(kubeconfig_text(url), encoding='utf-8')
        print(f'serving the Kubernetes API emulator at {url}', flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description='A strict in-memory Kubernetes API server for tests.')
    parser.add_argument('--port', type=int, default=0, help='TCP port on 127.0.0.1 (0: pick a free one)')
    parser.add_argument('--kubeconfig', help='write a kubeconfig pointing at the emulator to this path')
    parser.add_argument('--crd', action='append', default=[], help='a CRD manifest file to preload (repeatable)')
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.port or None, args.kubeconfig, args.crd))


if __name__ == '__main__':
    main()
