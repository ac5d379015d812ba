"""Behaviour of the strict Kubernetes API emulator (tests/support/apiserver.py) over real HTTP."""
from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.support.apiserver import StrictKubernetesEmulator
from tests.support.crd_schema import default_and_prune, validate_custom_object
from tests.support.toys import TOY_CRD, widget

CM = '/api/v1/namespaces/default/configmaps'
WIDGETS = '/apis/toys.example.com/v1/namespaces/default/widgets'

def configmap(name: str, **meta: Any) -> dict[str, Any]:
    return {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': name, **meta}, 'data': {'k': 'v'}}


class Api:
    """A thin JSON client: returns (status, body) and never raises on HTTP errors."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def call(self, method: str, path: str, body: Any = None, content_type: str = 'application/json',
                   **params: str) -> tuple[int, Any]:
        data = body if isinstance(body, str) or body is None else json.dumps(body)
        async with self.session.request(method, path, data=data, params=params,
                                        headers={'Content-Type': content_type}) as response:
            return response.status, await response.json(content_type=None)

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        return await self.call('GET', path, **params)

    async def post(self, path: str, body: Any, **params: str) -> tuple[int, Any]:
        return await self.call('POST', path, body, **params)

    async def put(self, path: str, body: Any, **params: str) -> tuple[int, Any]:
        return await self.call('PUT', path, body, **params)

    async def merge(self, path: str, body: Any, **params: str) -> tuple[int, Any]:
        return await self.call('PATCH', path, body, 'application/merge-patch+json', **params)

    async def delete(self, path: str, body: Any = None, **params: str) -> tuple[int, Any]:
        return await self.call('DELETE', path, body, **params)

    async def apply(self, path: str, yaml_text: str, manager: str, force: bool = False) -> tuple[int, Any]:
        params = {'fieldManager': manager, **({'force': 'true'} if force else {})}
        return await self.call('PATCH', path, yaml_text, 'application/apply-patch+yaml', **params)


@pytest.fixture
async def api(apiserver_url: str) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession(apiserver_url) as session:
        yield Api(session)


@pytest.fixture
async def crd(api: Api) -> dict[str, Any]:
    status, body = await api.post('/apis/apiextensions.k8s.io/v1/customresourcedefinitions', TOY_CRD)
    assert status == 201, body
    return body


# --- discovery & namespaces -------------------------------------------------------------------------

async def test_core_discovery_names_v1_and_the_builtin_groups(api: Api) -> None:
    status, core = await api.get('/api/v1')
    assert status == 200 and core['groupVersion'] == 'v1'
    assert {'namespaces', 'pods', 'services', 'configmaps', 'events'} <= {r['name'] for r in core['resources']}
    _, groups = await api.get('/apis')
    names = {g['name'] for g in groups['groups']}
    assert {'apps', 'autoscaling', 'policy', 'rbac.authorization.k8s.io', 'discovery.k8s.io',
            'coordination.k8s.io', 'events.k8s.io', 'apiextensions.k8s.io'} <= names


async def test_namespaces_are_real_objects_and_required_for_namespaced_creates(api: Api) -> None:
    _, listing = await api.get('/api/v1/namespaces')
    assert 'default' in {ns['metadata']['name'] for ns in listing['items']}
    status, _ = await api.post('/api/v1/namespaces/nowhere/configmaps', configmap('a'))
    assert status == 404
    status, ns = await api.post('/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'team'}})
    assert status == 201 and ns['status']['phase'] == 'Active'
    assert (await api.post('/api/v1/namespaces/team/configmaps', configmap('a')))[0] == 201


async def test_namespace_deletion_removes_its_contents(api: Api, apiserver: StrictKubernetesEmulator) -> None:
    await api.post('/api/v1/namespaces', {'apiVersion': 'v1', 'kind': 'Namespace', 'metadata': {'name': 'gone'}})
    await api.post('/api/v1/namespaces/gone/configmaps', configmap('a'))
    status, ns = await api.delete('/api/v1/namespaces/gone')
    assert status == 200 and ns['status']['phase'] == 'Terminating'
    await apiserver.wait_for(lambda: apiserver.get_object('v1', 'Namespace', 'gone') is None)
    assert apiserver.list_objects('v1', 'ConfigMap', 'gone') == []


# --- metadata, conflicts, updates ------------------------------------------------------------------

async def test_server_sets_metadata_with_a_global_resource_version(api: Api) -> None:
    _, a = await api.post(CM, configmap('a'))
    _, b = await api.post(CM, configmap('b'))
    assert a['metadata']['uid'] != b['metadata']['uid']
    assert int(b['metadata']['resourceVersion']) > int(a['metadata']['resourceVersion'])
    assert a['metadata']['creationTimestamp'].endswith('Z')
    assert 'generation' not in a['metadata']  # as upstream: ConfigMaps have no spec, hence no generation


async def test_stale_writes_and_duplicate_creates_conflict(api: Api) -> None:
    _, obj = await api.post(CM, configmap('a'))
    stale = copy.deepcopy(obj)
    assert (await api.merge(f'{CM}/a', {'data': {'k': 'new'}}))[0] == 200
    assert (await api.put(f'{CM}/a', stale))[0] == 409
    assert (await api.merge(f'{CM}/a', {'metadata': {'resourceVersion': obj['metadata']['resourceVersion']}}))[0] == 409
    test_op = [{'op': 'test', 'path': '/metadata/resourceVersion', 'value': obj['metadata']['resourceVersion']},
               {'op': 'replace', 'path': '/data/k', 'value': 'x'}]
    assert (await api.call('PATCH', f'{CM}/a', test_op, 'application/json-patch+json'))[0] == 409
    status, body = await api.post(CM, configmap('a'))
    assert status == 409 and body['reason'] == 'AlreadyExists'
    assert (await api.get(f'{CM}/missing'))[0] == 404


async def test_no_op_writes_keep_the_resource_version(api: Api) -> None:
    _, obj = await api.post(CM, configmap('a'))
    _, same = await api.merge(f'{CM}/a', {'data': {'k': 'v'}})
    assert same['metadata']['resourceVersion'] == obj['metadata']['resourceVersion']


async def test_generate_name_and_dry_run(api: Api, apiserver: StrictKubernetesEmulator) -> None:
    status, obj = await api.post(CM, {**configmap(''), 'metadata': {'generateName': 'gen-'}})
    assert status == 201 and obj['metadata']['name'].startswith('gen-') and len(obj['metadata']['name']) == 9
    rv_before = apiserver.store.rv
    status, dry = await api.post(CM, configmap('dry'), dryRun='All')
    assert status == 201 and dry['metadata']['name'] == 'dry'
    assert (await api.get(f'{CM}/dry'))[0] == 404
    assert apiserver.store.rv == rv_before


async def test_invalid_names_are_refused_with_422(api: Api) -> None:
    status, body = await api.post(CM, configmap('Not_Valid'))
    assert status == 422 and 'metadata.name' in body['message']


async def test_strategic_merge_merges_named_lists(api: Api) -> None:
    deployment = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'd'},
                  'spec': {'replicas': 1, 'template': {'spec': {'containers': [
                      {'name': 'a', 'image': 'a:1'}, {'name': 'b', 'image': 'b:1'}]}}}}
    await api.post('/apis/apps/v1/namespaces/default/deployments', deployment)
    patch = {'spec': {'template': {'spec': {'containers': [{'name': 'b', 'image': 'b:2'}]}}}}
    status, obj = await api.call('PATCH', '/apis/apps/v1/namespaces/default/deployments/d', patch,
                                 'application/strategic-merge-patch+json')
    assert status == 200
    assert obj['spec']['template']['spec']['containers'] == [{'name': 'a', 'image': 'a:1'}, {'name': 'b', 'image': 'b:2'}]
    assert obj['metadata']['generation'] == 2


async def test_scale_subresource_reads_and_writes_replicas(api: Api) -> None:
    deployment = {'apiVersion': 'apps/v1', 'kind': 'Deployment', 'metadata': {'name': 'd'}, 'spec': {'replicas': 1}}
    await api.post('/apis/apps/v1/namespaces/default/deployments', deployment)
    _, scale = await api.get('/apis/apps/v1/namespaces/default/deployments/d/scale')
    assert scale['kind'] == 'Scale' and scale['spec']['replicas'] == 1
    await api.merge('/apis/apps/v1/namespaces/default/deployments/d/scale', {'spec': {'replicas': 3}})
    _, obj = await api.get('/apis/apps/v1/namespaces/default/deployments/d')
    assert obj['spec']['replicas'] == 3


# --- selectors & watches ---------------------------------------------------------------------------

async def test_label_and_field_selectors_filter_lists(api: Api) -> None:
    await api.post(CM, configmap('a', labels={'app': 'x', 'tier': 'web'}))
    await api.post(CM, configmap('b', labels={'app': 'y'}))
    await api.post(CM, configmap('c'))

    async def names(**params: str) -> list[str]:
        _, body = await api.get(CM, **params)
        return [o['metadata']['name'] for o in body['items']]

    assert await names(labelSelector='app=x') == ['a']
    assert await names(labelSelector='app in (x,y),tier!=db') == ['a', 'b']
    assert await names(labelSelector='!app') == ['c']
    assert await names(fieldSelector='metadata.name=b') == ['b']
    assert await names(fieldSelector='metadata.namespace!=default') == []
    assert (await api.get(CM, fieldSelector='data.k=v'))[0] == 400
    status, _ = await api.delete(CM, labelSelector='app')
    assert status == 200 and await names() == ['c']


async def test_crd_selectable_fields_work_as_field_selectors(api: Api, crd: dict[str, Any]) -> None:
    await api.post(WIDGETS, widget('w1'))
    await api.post(WIDGETS, {**widget('w2'), 'spec': {'model': 'huge'}})
    _, body = await api.get(WIDGETS, fieldSelector='spec.model=huge')
    assert [o['metadata']['name'] for o in body['items']] == ['w2']


async def read_events(session: aiohttp.ClientSession, path: str, count: int, **params: str) -> tuple[str, list[dict[str, Any]]]:
    async with session.get(path, params={'watch': 'true', **params}) as response:
        events = []
        async for line in response.content:
            events.append(json.loads(line))
            if len(events) == count:
                break
        return response.headers['Content-Type'], events


async def test_watch_resumes_from_a_resource_version(api: Api) -> None:
    _, a = await api.post(CM, configmap('a'))
    await api.post(CM, configmap('b'))
    await api.merge(f'{CM}/a', {'data': {'k': 'changed'}})
    content_type, events = await read_events(api.session, CM, 2, resourceVersion=a['metadata']['resourceVersion'])
    assert content_type.startswith('application/json')
    assert [(e['type'], e['object']['metadata']['name']) for e in events] == [('ADDED', 'b'), ('MODIFIED', 'a')]


async def test_watch_sends_initial_state_bookmarks_and_live_changes(api: Api) -> None:
    await api.post(CM, configmap('a', labels={'app': 'x'}))
    await api.post(CM, configmap('skipped'))

    async def later() -> None:
        await asyncio.sleep(0.05)
        await api.post(CM, configmap('b', labels={'app': 'x'}))
        await api.merge(f'{CM}/a', {'metadata': {'labels': {'app': 'gone'}}})

    task = asyncio.create_task(later())
    _, events = await read_events(api.session, CM, 4, labelSelector='app=x', allowWatchBookmarks='true')
    await task
    assert [e['type'] for e in events] == ['ADDED', 'BOOKMARK', 'ADDED', 'DELETED']
    assert [e['object']['metadata'].get('name') for e in events] == ['a', None, 'b', 'a']


async def test_watch_from_a_forgotten_resource_version_is_gone(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr('tests.support.emulator.store.HISTORY_LIMIT', 2)
    _, first = await api.post(CM, configmap('a'))
    for name in 'bcd':
        await api.post(CM, configmap(name))
    _, events = await read_events(api.session, CM, 1, resourceVersion=first['metadata']['resourceVersion'])
    assert events[0]['type'] == 'ERROR' and events[0]['object']['code'] == 410


async def test_watch_ends_after_timeout_seconds(api: Api) -> None:
    async with api.session.get(CM, params={'watch': 'true', 'timeoutSeconds': '0'}) as response:
        assert await response.read() == b''


# --- server-side apply ------------------------------------------------------------------------------

async def test_server_side_apply_creates_merges_and_tracks_managers(api: Api) -> None:
    base = 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata:\n'
    status, obj = await api.apply(f'{CM}/cfg', base + '  a: "1"\n  b: "2"\n', manager='alice')
    assert status == 201 and obj['data'] == {'a': '1', 'b': '2'}
    _, again = await api.apply(f'{CM}/cfg', base + '  a: "1"\n  b: "2"\n', manager='alice')
    assert again['metadata']['resourceVersion'] == obj['metadata']['resourceVersion']  # no-op apply
    status, obj = await api.apply(f'{CM}/cfg', base + '  c: "3"\n', manager='bob')
    assert status == 200 and obj['data'] == {'a': '1', 'b': '2', 'c': '3'}
    owners = {m['manager']: m['fieldsV1'] for m in obj['metadata']['managedFields']}
    assert owners == {'alice': {'f:data': {'f:a': {}, 'f:b': {}}}, 'bob': {'f:data': {'f:c': {}}}}

    status, conflict = await api.apply(f'{CM}/cfg', base + '  a: "changed"\n', manager='bob')
    assert status == 409 and 'alice' in conflict['message'] and '.data.a' in conflict['message']
    status, obj = await api.apply(f'{CM}/cfg', base + '  a: "changed"\n  c: "3"\n', manager='bob', force=True)
    assert status == 200 and obj['data'] == {'a': 'changed', 'b': '2', 'c': '3'}

    status, obj = await api.apply(f'{CM}/cfg', base + '  a: "1"\n', manager='alice', force=True)
    assert obj['data'] == {'a': '1', 'c': '3'}  # alice stopped applying b, nobody else owns it
    assert {m['manager'] for m in obj['metadata']['managedFields']} == {'alice', 'bob'}


# --- deletion, finalizers, garbage collection -------------------------------------------------------

async def test_finalizers_hold_deletion_until_removed(api: Api) -> None:
    await api.post(CM, configmap('a', finalizers=['example.com/hold']))
    status, obj = await api.delete(f'{CM}/a')
    assert status == 200 and obj['metadata']['deletionTimestamp']
    assert (await api.get(f'{CM}/a'))[0] == 200
    status, _ = await api.merge(f'{CM}/a', {'metadata': {'finalizers': ['example.com/hold', 'new']}})
    assert status == 422
    await api.merge(f'{CM}/a', {'metadata': {'finalizers': None}})
    assert (await api.get(f'{CM}/a'))[0] == 404


async def owned_by(api: Api, owner: dict[str, Any], name: str) -> None:
    ref = {'apiVersion': 'v1', 'kind': 'ConfigMap', 'name': owner['metadata']['name'], 'uid': owner['metadata']['uid']}
    assert (await api.post(CM, configmap(name, ownerReferences=[ref])))[0] == 201


async def test_background_deletion_collects_dependents(api: Api, apiserver: StrictKubernetesEmulator) -> None:
    _, owner = await api.post(CM, configmap('owner'))
    await owned_by(api, owner, 'child')
    _, child = await api.get(f'{CM}/child')
    await owned_by(api, child, 'grandchild')
    await api.delete(f'{CM}/owner')
    await apiserver.wait_for(lambda: apiserver.list_objects('v1', 'ConfigMap', 'default') == [])


async def test_orphan_deletion_keeps_dependents_without_owner_refs(api: Api) -> None:
    _, owner = await api.post(CM, configmap('owner'))
    await owned_by(api, owner, 'child')
    await api.delete(f'{CM}/owner', propagationPolicy='Orphan')
    await asyncio.sleep(0.05)  # give a (wrongly) scheduled collection the chance to run
    status, child = await api.get(f'{CM}/child')
    assert status == 200 and 'ownerReferences' not in child['metadata']


async def test_foreground_deletion_removes_dependents_first(api: Api, apiserver: StrictKubernetesEmulator) -> None:
    _, owner = await api.post(CM, configmap('owner'))
    await owned_by(api, owner, 'child')
    status, obj = await api.delete(f'{CM}/owner', {'propagationPolicy': 'Foreground'})
    assert status == 200 and 'foregroundDeletion' in obj['metadata']['finalizers']
    await apiserver.wait_for(lambda: apiserver.list_objects('v1', 'ConfigMap', 'default') == [])


# --- CRDs ---------------------------------------------------------------------------------------------

async def test_crd_becomes_discoverable_and_established(api: Api, crd: dict[str, Any]) -> None:
    assert {c['type'] for c in crd['status']['conditions']} == {'Established', 'NamesAccepted'}
    _, resources = await api.get('/apis/toys.example.com/v1')
    assert {r['name'] for r in resources['resources']} == {'widgets', 'widgets/status', 'widgets/scale'}
    status, _ = await api.post('/apis/apiextensions.k8s.io/v1/customresourcedefinitions',
                               {**TOY_CRD, 'metadata': {'name': 'wrong.name'}})
    assert status == 422


async def test_custom_objects_are_pruned_and_defaulted(api: Api, crd: dict[str, Any]) -> None:
    status, obj = await api.post(WIDGETS, widget(unknown='dropped', extra={'kept': {'deep': 1}}, port='http'))
    assert status == 201, obj
    assert obj['spec'] == {'model': 'tiny', 'replicas': 1, 'maxReplicas': 4, 'extra': {'kept': {'deep': 1}}, 'port': 'http'}


async def test_strict_field_validation_refuses_unknown_fields(api: Api, crd: dict[str, Any]) -> None:
    status, body = await api.post(WIDGETS, widget(unknown=1), fieldValidation='Strict')
    assert status == 400 and 'unknown field "spec.unknown"' in body['message']


@pytest.mark.parametrize('spec, message', [
    ({'replicas': 'three'}, 'spec.replicas: Invalid value: "three"'),
    ({'replicas': -1}, 'spec.replicas: Invalid value: -1'),
    ({'mode': 'warp'}, 'spec.mode: Unsupported value: "warp"'),
    ({'port': 1.5}, 'spec.port: Invalid value: 1.5'),
    ({'replicas': 9}, 'spec: Invalid value: "object": replicas must not exceed maxReplicas'),
])
async def test_invalid_custom_objects_are_refused_naming_the_field(api: Api, crd: dict[str, Any],
                                                                   spec: dict[str, Any], message: str) -> None:
    status, body = await api.post(WIDGETS, widget(**spec))
    assert status == 422 and body['reason'] == 'Invalid'
    assert message in body['message']


async def test_missing_required_fields_are_reported(api: Api, crd: dict[str, Any]) -> None:
    status, body = await api.post(WIDGETS, {**widget(), 'spec': {}})
    assert status == 422 and 'spec.model: Required value' in body['message']


async def test_cel_transition_rules_see_the_old_object(api: Api, crd: dict[str, Any]) -> None:
    await api.post(WIDGETS, widget())
    status, body = await api.merge(f'{WIDGETS}/w1', {'spec': {'model': 'other'}})
    assert status == 422 and 'model is immutable' in body['message']


async def test_put_on_custom_objects_requires_a_resource_version(api: Api, crd: dict[str, Any]) -> None:
    await api.post(WIDGETS, widget())
    status, body = await api.put(f'{WIDGETS}/w1', widget(replicas=2))
    assert status == 422 and 'metadata.resourceVersion' in body['message']


async def test_status_subresource_isolates_status_and_generation(api: Api, crd: dict[str, Any]) -> None:
    _, obj = await api.post(WIDGETS, {**widget(), 'status': {'ignored': True}})
    assert 'status' not in obj
    _, obj = await api.merge(f'{WIDGETS}/w1/status', {'status': {'phase': 'Ready'}, 'spec': {'replicas': 3}})
    assert obj['status'] == {'phase': 'Ready'} and obj['spec']['replicas'] == 1 and obj['metadata']['generation'] == 1
    _, obj = await api.merge(f'{WIDGETS}/w1', {'status': {'phase': 'Hacked'}, 'metadata': {'labels': {'a': 'b'}}})
    assert obj['status'] == {'phase': 'Ready'} and obj['metadata']['generation'] == 1
    _, obj = await api.merge(f'{WIDGETS}/w1', {'spec': {'replicas': 2}})
    assert obj['metadata']['generation'] == 2


async def test_deleting_a_crd_removes_its_objects(api: Api, crd: dict[str, Any]) -> None:
    await api.post(WIDGETS, widget())
    await api.delete('/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.toys.example.com')
    assert (await api.get(WIDGETS))[0] == 404


def test_crd_schema_module_is_usable_without_a_server() -> None:
    obj = default_and_prune(TOY_CRD, widget(junk=1))
    assert obj['spec'] == {'model': 'tiny', 'replicas': 1, 'maxReplicas': 4}
    assert validate_custom_object(TOY_CRD, obj) == []
    changed = {**obj, 'spec': {**obj['spec'], 'model': 'other'}}
    assert validate_custom_object(TOY_CRD, changed, old=obj) == ['spec: Invalid value: "object": model is immutable']


# --- events & accounting ------------------------------------------------------------------------------

async def test_events_of_both_apis_are_accepted_and_listed(api: Api) -> None:
    core = {'apiVersion': 'v1', 'kind': 'Event', 'metadata': {'generateName': 'x.'}, 'reason': 'Tested',
            'involvedObject': {'kind': 'ConfigMap', 'name': 'a', 'namespace': 'default'}, 'message': 'hi'}
    assert (await api.post('/api/v1/namespaces/default/events', core))[0] == 201
    new = {'apiVersion': 'events.k8s.io/v1', 'kind': 'Event', 'metadata': {'name': 'e.1'}, 'reason': 'Tested',
           'regarding': {'kind': 'ConfigMap', 'name': 'a'}, 'note': 'hi', 'action': 'Test',
           'reportingController': 'me', 'reportingInstance': 'me-1', 'eventTime': '2026-01-01T00:00:00.000000Z'}
    assert (await api.post('/apis/events.k8s.io/v1/namespaces/default/events', new))[0] == 201
    _, listing = await api.get('/api/v1/namespaces/default/events', fieldSelector='involvedObject.name=a')
    assert [e['message'] for e in listing['items']] == ['hi']


async def test_requests_are_recorded_for_write_accounting(api: Api, apiserver: StrictKubernetesEmulator) -> None:
    await api.post(CM, configmap('a'))
    mark = apiserver.mark()
    await api.get(CM)
    await api.get(f'{CM}/a')
    assert apiserver.count_writes(since=mark) == 0
    await api.merge(f'{CM}/a', {'data': {'k': 'x'}})
    [write] = apiserver.writes(since=mark)
    assert (write.method, write.path, write.status) == ('PATCH', f'{CM}/a', 200)
    assert write.content_type == 'application/merge-patch+json' and write.user_agent


async def test_injected_failures_answer_matching_requests_then_stop(api: Api, apiserver: StrictKubernetesEmulator) -> None:
    apiserver.inject_failure('POST', r'/configmaps$', code=503, times=2)
    assert (await api.get(CM))[0] == 200
    assert [(await api.post(CM, configmap('a')))[0] for _ in range(3)] == [503, 503, 201]
