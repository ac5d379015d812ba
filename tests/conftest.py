"""The test tiers, each a folder named by what its tests need (docs/development.md):

- ``unit``: nothing but Python; pure (tests/unit/conftest.py fails a test that starts a process or opens a socket).
- ``loopback``: processes and loopback servers on this machine (routers, workers, fake vLLM backends).
- ``integration``: the real Kubernetes control plane (built once into ~/.cache/epd-operator/k8s).
- ``helm``: pinned helm binaries (fetched once) and, for installs, the real control plane.
- ``e2e``: real vLLM on CPU (the cached vLLM venv); ``e2e/kind`` also needs kind and Docker.
- ``node``: pods on the local cluster's real node (root, containerd, runc, CNI plugins, a kubelet).

Every test carries its tier's marker, so ``-m`` selects by need as well as by folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.support.cluster"]

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "loopback", "integration", "helm", "e2e", "node")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(
                f"{item.nodeid}: a test lives in one of the tier folders tests/{{{','.join(TIERS)}}}"
            )
        item.add_marker(tier)
