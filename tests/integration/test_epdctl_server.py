"""`epdctl validate --server`: the cluster's own verdict on a spec (a server-side dry-run apply through
the access layer), against the real API server. What the cluster adds to the local rules here is an
admission policy (ValidatingAdmissionPolicy, evaluated by the API server itself)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dev.cluster.local import LocalCluster
from epd_operator.cli import main
from tests.support.cluster import KubeView, epd_crd, install_crd, new_namespace, wait_for
from tests.support.operator_run import epd_doc

EPD_API = "serving.epd.dev/v1alpha1"


def validate(capsys: pytest.CaptureFixture[str], kube: KubeView, path: Path, *more: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        main(["validate", "-f", str(path), "--server", "--kubeconfig", str(kube.kubeconfig), *more])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def decode_cap_policy(kube: KubeView) -> None:
    """An organisation's rule the local checks cannot know: at most one decode replica here."""
    name = f"{kube.ns}-decode-cap"
    api = "/apis/admissionregistration.k8s.io/v1"
    kube.ok(
        "POST",
        f"{api}/validatingadmissionpolicies",
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["serving.epd.dev"],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["epddeployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "object.spec.decode.replicas <= 1",
                        "reason": "Invalid",
                        "fieldPath": "spec.decode.replicas",
                        "message": "at most 1 decode replica in this namespace",
                    }
                ],
            },
        },
        content_type="application/json",
    )
    kube.ok(
        "POST",
        f"{api}/validatingadmissionpolicybindings",
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": kube.ns}}},
            },
        },
        content_type="application/json",
    )


def test_the_cluster_accepts_a_spec_and_nothing_is_created(kube: KubeView, tmp_path: Path, capsys):
    path = tmp_path / "epd.yaml"
    path.write_text(yaml.safe_dump(epd_doc()))  # no namespace: the kubeconfig context's
    code, out, err = validate(capsys, kube, path)
    assert code == 0, err
    assert f"EPDDeployment {kube.ns}/vl: accepted by {kube.cluster.server} (dry run, nothing changed)" in out
    assert kube.get(EPD_API, "EPDDeployment", "vl") is None


def test_an_admission_policys_refusal_is_printed(kube: KubeView, tmp_path: Path, capsys):
    path = tmp_path / "epd.yaml"
    path.write_text(yaml.safe_dump(epd_doc()))  # two decode replicas: valid locally
    decode_cap_policy(kube)
    # The API server enforces a new policy once it has compiled it (its informer): poll until it does.
    _code, out, err = wait_for(
        lambda: (r := validate(capsys, kube, path))[0] == 1 and r, 30, "the policy never applied"
    )
    assert "EPDDeployment vl: valid" in out  # the local verdict first
    assert f"EPDDeployment {kube.ns}/vl: refused by {kube.cluster.server} (422 Invalid): " in err, err
    assert "denied request: at most 1 decode replica in this namespace" in err, err
    assert kube.get(EPD_API, "EPDDeployment", "vl") is None


def stricter_epd_crd() -> dict:
    """The CRD as a cluster might run it in another version than this epdctl's: at most one decode replica."""
    crd = epd_crd()
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["decode"]["properties"]["replicas"]["maximum"] = 1
    return crd


@pytest.fixture(scope="module")
def strict_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("strict-k8s"), apiserver_only=True) as cluster:
        install_crd(cluster, stricter_epd_crd())
        yield cluster


def test_the_clusters_schema_refusal_names_each_field(strict_cluster: LocalCluster, tmp_path: Path, capsys):
    kube = new_namespace(strict_cluster, tmp_path, "strict")
    doc = epd_doc()
    doc["spec"]["decode"]["replicas"] = 3  # valid here, over the cluster's limit
    path = tmp_path / "epd.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out, err = validate(capsys, kube, path)
    assert code == 1 and "EPDDeployment vl: valid" in out, (out, err)
    assert f"EPDDeployment {kube.ns}/vl: refused by {strict_cluster.server} (422 Invalid): " in err, err
    assert (
        "\n  spec.decode.replicas: Invalid value: 3: spec.decode.replicas in body should be less than or equal to 1"
        in err
    ), err
    assert kube.get(EPD_API, "EPDDeployment", "vl") is None


def test_without_credentials_it_says_so(kube: KubeView, tmp_path: Path, capsys, monkeypatch):
    path = tmp_path / "epd.yaml"
    path.write_text(yaml.safe_dump(epd_doc()))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code, _out, err = validate(capsys, kube, path, "--kubeconfig", str(tmp_path / "absent"))
    assert code == 1 and "epdctl: no Kubernetes credentials" in err, err
