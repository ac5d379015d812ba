"""An optional kind whose CRD is installed after the operator started: the operator, which kopf cannot
make watch it from then on, stops (exit status 0) so that Kubernetes restarts it watching that kind.
A control plane of its own (apiserver-only), because the kind must be missing when the operator starts
and CRDs are cluster-scoped."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.local import LocalCluster
from dev.ports import free_port
from epd_operator.controller.main import parse_args, run
from tests.support.cluster import KubeView, epd_crd, install_crd, keda_crd, new_namespace


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("bare-k8s"), apiserver_only=True) as cluster:
        install_crd(cluster, epd_crd())
        yield cluster


@pytest.fixture
def ns(bare_cluster: LocalCluster, tmp_path: Path) -> KubeView:
    return new_namespace(bare_cluster, tmp_path, "kinds")


async def test_a_kind_served_after_the_start_stops_the_operator_to_be_restarted_watching_it(ns, caplog):
    options = parse_args(
        [
            *("--namespace", ns.ns, "--no-leader-election", "--optional-kinds-poll-seconds", "0.2"),
            *("--bind-address", "127.0.0.1", "--liveness-port", str(free_port()), "--metrics-port", str(free_port())),
        ]
    )
    stop = asyncio.Event()
    # kopf gets a loop of its own (it cancels every task created in its loop after it started).
    operator = asyncio.ensure_future(
        asyncio.to_thread(asyncio.run, run(options, stop=stop, credentials=ns.credentials))
    )
    try:
        with caplog.at_level(logging.WARNING, logger="epd_operator"):
            done, _ = await asyncio.wait({operator}, timeout=3)
            assert not done, "the operator stopped with every optional kind as it was at its start"
            await asyncio.to_thread(install_crd, ns.cluster, keda_crd())
            assert await asyncio.wait_for(operator, 60) == 0
        said = [r.getMessage() for r in caplog.records if "now served" in r.getMessage()]
        assert said == [
            "now served, which it was not at the start: keda.sh/v1alpha1 ScaledObject; "
            "stopping, to be restarted watching it"
        ]
    finally:
        stop.set()
        await asyncio.gather(operator, return_exceptions=True)
