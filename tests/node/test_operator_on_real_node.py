"""tests/e2e/kind's lifecycle on the local cluster instead of kind: the operator installed from its
chart (the locally built image, loaded into the real node), then the same body
(tests/support/operator_e2e.py) drives kubectl against it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dev.cluster import LocalCluster, RealNodeSpec
from tests.support.operator_e2e import NAMESPACE, an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete
from tests.support.real_node import install_operator_chart, unavailable

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


def test_an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(
    tmp_path_factory: pytest.TempPathFactory,
):
    # A short folder: the kubelet's Unix sockets live under it, and their paths must fit 108 bytes.
    tmp_path = tmp_path_factory.mktemp("op")
    with LocalCluster(tmp_path / "k8s", real_nodes=(RealNodeSpec(),)) as cluster:
        installed = install_operator_chart(cluster, tmp_path)
        installed.system.kubectl("create", "namespace", NAMESPACE)
        kubectl_dir = str(Path(cluster.kubectl_path).parent)
        env = {**installed.system.env(), "PATH": f"{kubectl_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(env)
