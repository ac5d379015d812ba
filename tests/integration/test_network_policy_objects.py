"""The rendered NetworkPolicies as a real API server takes them: every example and variant's policies
pass the server's own validation (strict field validation, dry run), so a spec the API accepts never
half-applies on a policy the server refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.local import NEWEST, LocalCluster
from epd_operator.api import parse_epd
from epd_operator.render import render
from tests.support.cluster import KubeView, api_path, new_namespace
from tests.support.render_examples import example_document, example_files, variants

SPECS = {**{path.name: parse_epd(example_document(path.name)) for path in example_files()}, **variants()}


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("netpol"), version=NEWEST, apiserver_only=True) as cluster:
        yield cluster


@pytest.fixture
def kube(apiserver: LocalCluster, tmp_path: Path) -> KubeView:
    return new_namespace(apiserver, tmp_path, "netpol")


def test_the_api_server_accepts_every_rendered_network_policy(kube: KubeView):
    refused, seen = [], 0
    for case, epd in sorted(SPECS.items()):
        for obj in render(epd):
            if obj["kind"] != "NetworkPolicy":
                continue
            seen += 1
            obj = {**obj, "metadata": {**obj["metadata"], "namespace": kube.ns}}
            path = api_path(obj["apiVersion"], obj["kind"], kube.ns, obj["metadata"]["name"])
            status, body = kube.request(
                "PATCH",
                f"{path}?fieldManager=epd-operator&dryRun=All&fieldValidation=Strict",
                obj,
                content_type="application/apply-patch+yaml",
            )
            if status >= 400:
                refused.append(f"{case}: {obj['metadata']['name']}: {status} {json.dumps(body)[:400]}")
    assert seen >= 2 * len(SPECS)  # two policies per deployment, every case has them on
    assert not refused, "\n".join(refused)
