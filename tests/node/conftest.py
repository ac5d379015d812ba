"""One local cluster with a real node for the node tier's deployments (the mission, the faults, the
kind e2e body): vLLM for CPU and the operator image loaded into its node, the operator chart
`helm install`ed. Each module deploys into it and removes what it deployed; the tests that are about
the cluster itself (its start, its crash, its image store) start clusters of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mission import Mission, mission_cluster
from tests.support.real_node import unavailable


@pytest.fixture(scope="session")
def shared_mission(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mission]:
    if (why := unavailable()) is not None:
        pytest.skip(why)
    # A short folder: the kubelet's Unix sockets live under it, and their paths must fit 108 bytes.
    with mission_cluster(tmp_path_factory.mktemp("node")) as m:
        yield m
