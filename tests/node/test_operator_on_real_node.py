"""tests/e2e/kind's lifecycle on the local cluster instead of kind: the operator installed from its
chart (the locally built image, loaded into the real node; the node tier's shared cluster), then the
same body (tests/support/operator_e2e.py) drives kubectl against it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.mission import Mission
from tests.support.operator_e2e import NAMESPACE, an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete
from tests.support.real_node import unavailable

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(unavailable() is not None, reason=unavailable() or ""),
]


def test_an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(shared_mission: Mission):
    system = shared_mission.system
    system.kubectl("create", "namespace", NAMESPACE)
    try:
        kubectl_dir = str(Path(shared_mission.cluster.kubectl_path).parent)
        env = {**system.env(), "PATH": f"{kubectl_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
        an_example_becomes_owned_tiers_with_status_and_is_collected_on_delete(env)
    finally:
        system.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
