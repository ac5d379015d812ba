"""
pytest fixtures around the strict API emulator (registered in ``tests/conftest.py``).

- ``apiserver``: a running :class:`StrictKubernetesEmulator` on a free 127.0.0.1 port, with the
  ``default``, ``kube-system`` and ``kube-public`` namespaces; its URL is ``apiserver_url``.
- ``kubeconfig``: a kubeconfig file pointing at it (for kubectl, ``kopf run``, ``epd-operator``).
- ``kube_env``: ``os.environ`` plus ``KUBECONFIG`` for subprocesses.
- ``kopf_registry``: registers a kopf login handler for in-process operators (``kopf.operator()``).
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.apiserver import StrictKubernetesEmulator, kubeconfig_text, running_apiserver


@pytest.fixture
async def _apiserver_running() -> AsyncIterator[tuple[StrictKubernetesEmulator, str]]:
    async with running_apiserver() as (emulator, url):
        yield emulator, url


@pytest.fixture
def apiserver(_apiserver_running: tuple[StrictKubernetesEmulator, str]) -> StrictKubernetesEmulator:
    return _apiserver_running[0]


@pytest.fixture
def apiserver_url(_apiserver_running: tuple[StrictKubernetesEmulator, str]) -> str:
    return _apiserver_running[1]


@pytest.fixture
def kubeconfig(apiserver_url: str, tmp_path: Path) -> Path:
    path = tmp_path / 'kubeconfig'
    path.write_text(kubeconfig_text(apiserver_url), encoding='utf-8')
    return path


@pytest.fixture
def kube_env(kubeconfig: Path) -> dict[str, str]:
    return {**os.environ, 'KUBECONFIG': str(kubeconfig)}


@pytest.fixture
def kopf_registry(apiserver_url: str):  # type: ignore[no-untyped-def]
    """A kopf registry whose login handler points at the emulator; pass it as ``registry=``."""
    import kopf

    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def _login(**_: object) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=apiserver_url, insecure=True)

    return registry
