"""Real clients against the API emulator: kubectl (subprocess), kopf (in-process), standalone mode."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import kopf
import yaml

from tests.support.apiserver import StrictKubernetesEmulator
from tests.support.kubectl import kubectl, needs_kubectl
from tests.support.toys import TOY_CRD, widget

REPO = Path(__file__).resolve().parents[2]


@needs_kubectl
async def test_kubectl_applies_gets_and_deletes(kube_env: dict[str, str], apiserver: StrictKubernetesEmulator) -> None:
    manifests = yaml.safe_dump_all([TOY_CRD, widget('w1', replicas=2)])
    # The CR's type does not exist until the CRD is served: apply the CRD first, as one would.
    await kubectl(kube_env, 'apply', '--validate=false', '-f', '-', stdin=yaml.safe_dump(TOY_CRD))
    out = await kubectl(kube_env, 'apply', '--validate=false', '-f', '-', stdin=manifests)
    assert 'widget.toys.example.com/w1 created' in out

    listing = json.loads(await kubectl(kube_env, 'get', 'widgets', '-o', 'json'))
    assert [(w['metadata']['name'], w['spec']['replicas'], w['spec']['maxReplicas']) for w in listing['items']] == [('w1', 2, 4)]
    table = await kubectl(kube_env, 'get', 'wd')
    assert table.split('\n')[0].split() == ['NAME', 'REPLICAS', 'AGE'] and table.split('\n')[1].split()[:2] == ['w1', '2']

    await kubectl(kube_env, 'patch', 'widget', 'w1', '--type=merge', '-p', '{"spec": {"replicas": 3}}')
    await kubectl(kube_env, 'label', 'widget', 'w1', 'team=a')
    assert (await kubectl(kube_env, 'get', 'widgets', '-l', 'team=a', '-o', 'name')).strip() == 'widget.toys.example.com/w1'

    await kubectl(kube_env, 'delete', 'widget', 'w1')
    assert apiserver.list_objects('toys.example.com/v1', 'Widget') == []


@needs_kubectl
async def test_kubectl_refusal_shows_the_field_path(kube_env: dict[str, str], apiserver: StrictKubernetesEmulator) -> None:
    apiserver.create_object(TOY_CRD)
    process = await asyncio.create_subprocess_exec(
        'kubectl', 'apply', '--validate=false', '-f', '-', env=kube_env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = await process.communicate(yaml.safe_dump(widget(replicas=9)).encode())
    assert process.returncode != 0
    assert 'spec: Invalid value: "object": replicas must not exceed maxReplicas' in err.decode()


@needs_kubectl
async def test_kubectl_watch_streams_changes(kube_env: dict[str, str], apiserver: StrictKubernetesEmulator) -> None:
    apiserver.create_object({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'first', 'namespace': 'default'}})
    process = await asyncio.create_subprocess_exec(
        'kubectl', 'get', 'configmaps', '--watch', '-o', 'name', env=kube_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert (await process.stdout.readline()).decode().strip() == 'configmap/first'
        apiserver.create_object({'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'second', 'namespace': 'default'}})
        assert (await process.stdout.readline()).decode().strip() == 'configmap/second'
    finally:
        process.terminate()
        await process.wait()


async def test_kopf_operator_handles_create_status_and_finalizers(
        apiserver: StrictKubernetesEmulator, kopf_registry: kopf.OperatorRegistry) -> None:
    registry = kopf_registry
    apiserver.create_object(TOY_CRD)
    deleted: list[str] = []

    @kopf.on.create('toys.example.com', 'v1', 'widgets', id='on_create', registry=registry)
    def on_create(spec: Any, patch: kopf.Patch, body: kopf.Body, **_: Any) -> dict[str, Any]:
        patch.status['phase'] = 'Ready'
        kopf.info(body, reason='Created', message='the widget is ready')  # posted as a core v1 Event
        return {'model': spec['model']}

    @kopf.on.delete('toys.example.com', 'v1', 'widgets', registry=registry)
    def on_delete(name: str, **_: Any) -> None:
        deleted.append(name)

    settings = kopf.OperatorSettings()
    settings.networking.connect_timeout = 5
    stop = asyncio.Event()
    operator = asyncio.create_task(kopf.operator(registry=registry, settings=settings, standalone=True,
                                                 clusterwide=True, stop_flag=stop))
    try:
        apiserver.create_object({**widget('w1'), 'metadata': {'name': 'w1', 'namespace': 'default'}})

        def current() -> dict[str, Any]:
            return apiserver.get_object('toys.example.com/v1', 'Widget', 'w1', 'default') or {}

        await apiserver.wait_for(lambda: current().get('status', {}).get('phase') == 'Ready')
        assert current()['status']['on_create'] == {'model': 'tiny'}
        assert current()['metadata']['finalizers'] == ['kopf.zalando.org/KopfFinalizerMarker']
        await apiserver.wait_for(lambda: apiserver.list_objects('v1', 'Event', 'default'))
        [event] = apiserver.list_objects('v1', 'Event', 'default')
        assert (event['reason'], event['involvedObject']['name']) == ('Created', 'w1')

        status_writes = apiserver.writes(path_contains='/widgets/w1/status')
        assert status_writes and all(w.content_type == 'application/merge-patch+json' for w in status_writes)

        apiserver.delete_object('toys.example.com/v1', 'Widget', 'w1', 'default')
        await apiserver.wait_for(lambda: not current())
        assert deleted == ['w1']
    finally:
        stop.set()
        await asyncio.wait_for(operator, timeout=30)


async def test_standalone_mode_serves_until_terminated(tmp_path: Path) -> None:
    crd_file = tmp_path / 'crd.yaml'
    crd_file.write_text(yaml.safe_dump(TOY_CRD), encoding='utf-8')
    kubeconfig = tmp_path / 'kubeconfig'
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / 'tests/support/apiserver.py'), '--port', '0', '--kubeconfig', str(kubeconfig),
        '--crd', str(crd_file), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path),
        env={**os.environ, 'PYTHONPATH': ''})
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), timeout=30)).decode()
        assert 'serving the Kubernetes API emulator at http://127.0.0.1:' in line
        url = line.rsplit(' ', 1)[1].strip()
        assert yaml.safe_load(kubeconfig.read_text())['clusters'][0]['cluster']['server'] == url
        import aiohttp
        async with aiohttp.ClientSession() as session, session.get(f'{url}/apis/toys.example.com/v1') as response:
            assert response.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0
