"""The CRD as real API servers take it: the newest minor the project tests and the oldest minor it
claims (docs/install.md, Chart.yaml `kubeVersion`). Each gets an apiserver of its own (etcd + kube-apiserver),
`kubectl apply -f crds/` and a bad spec refused with its field path in the server's words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dev.cluster.local import NEWEST, OLDEST, LocalCluster
from dev.local.runner import load_spec
from tests.support.cluster import CRD_FILE, KubeView, new_namespace, wait_for
from tests.support.operator_run import epd_doc

REPO = Path(__file__).resolve().parents[2]


# The oldest apiserver is a late build: `make test` runs its tests once `make k8s` has built it (dev/testing/test_streams.py).
@pytest.fixture(
    scope="module", params=[NEWEST, pytest.param(OLDEST, marks=pytest.mark.late_build)], ids=lambda v: f"k8s-{v}"
)
def apiserver(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp(f"crd-{request.param}"), version=request.param, apiserver_only=True
    ) as cluster:
        yield cluster


@pytest.fixture
def kube(apiserver: LocalCluster, tmp_path: Path) -> KubeView:
    return new_namespace(apiserver, tmp_path, "crd")


def test_kubectl_apply_installs_the_crd_and_it_is_served(kube: KubeView):
    out = kube.kubectl("apply", "--server-side", "-f", str(CRD_FILE)).stdout
    assert "customresourcedefinition.apiextensions.k8s.io/epddeployments.serving.epd.dev serverside-applied" in out

    def established():
        crd = kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "epddeployments.serving.epd.dev") or {}
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )

    wait_for(established, 30, "the CRD was not established")
    for example in sorted((REPO / "examples").glob("*.yaml")):
        doc = load_spec(example)
        doc["metadata"]["namespace"] = kube.ns
        kube.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc))
    wait_for(lambda: kube.kubectl("get", "epd", check=False).returncode == 0, 30)
    header = kube.kubectl("get", "epd").stderr + kube.kubectl("get", "epd").stdout
    assert "No resources found" in header


@pytest.mark.parametrize(
    "change, field, words",
    [
        ({"kvTransfer": {"connector": "Nixl"}}, "spec.kvTransfer", "kvTransfer moves KV from prefill to decode"),
        ({"decode": {"replicas": -1}}, "spec.decode.replicas", "should be greater than or equal to 0"),
        ({"decode": {"replicsa": 2}}, "spec.decode.replicsa", "unknown field"),
    ],
)
def test_a_bad_spec_is_refused_with_its_field_path(kube: KubeView, change, field, words):
    kube.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    wait_for(lambda: kube.kubectl("get", "epd", check=False).returncode == 0, 30)
    doc = epd_doc(namespace=kube.ns)
    for key, value in change.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    result = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert result.returncode != 0
    assert field in result.stderr and words in result.stderr, result.stderr


def _server_refusal(kube: KubeView, doc: dict) -> tuple[int, dict]:
    doc = {**doc, "metadata": {**doc["metadata"], "namespace": kube.ns}}
    name = doc["metadata"]["name"]
    path = (
        f"/apis/serving.epd.dev/v1alpha1/namespaces/{kube.ns}/epddeployments/{name}"
        "?fieldManager=kubectl&dryRun=All&fieldValidation=Strict"
    )
    return kube.request("PATCH", path, doc, content_type="application/apply-patch+yaml")


def test_the_api_server_refuses_every_spec_parse_epd_refuses_and_accepts_the_rest(kube: KubeView):
    """The real witness for the table in tests/unit/api/test_validation.py (which also checks an
    offline reading of the CRD): the same rows through the real server's schema, CEL and strict
    field validation."""
    import copy

    from tests.unit.api.test_validation import BAD_SPECS, GOOD_SPECS

    kube.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    wait_for(lambda: kube.kubectl("get", "epd", check=False).returncode == 0, 30)
    disagreements = []
    for case in BAD_SPECS:
        doc, path = case.values
        status, body = _server_refusal(kube, copy.deepcopy(doc))
        text = json.dumps(body)
        if status < 400 or path not in text:
            disagreements.append(f"{path}: server answered {status}: {text[:300]}")
    for case in GOOD_SPECS:
        (doc,) = case.values
        assert isinstance(doc, dict)
        status, body = _server_refusal(kube, copy.deepcopy(doc))
        if status >= 400:
            disagreements.append(f"good spec refused: {json.dumps(body)[:400]}")
    assert not disagreements, "\n".join(disagreements)
