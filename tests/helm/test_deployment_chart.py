"""The epd-deployment chart turns values into exactly one EPDDeployment, field for field."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from dev.local.runner import load_spec

from .charts import DEPLOYMENT_CHART, REPO, ci_values

pytestmark = pytest.mark.helm


def render_spec(helm, values=None, *sets, release="my-vl", namespace="ml") -> dict:
    (cr,) = helm.template(DEPLOYMENT_CHART, values, *sets, release=release, namespace=namespace)
    assert (cr["apiVersion"], cr["kind"]) == ("serving.epd.dev/v1alpha1", "EPDDeployment")
    assert (cr["metadata"]["name"], cr["metadata"]["namespace"]) == (release, namespace)
    return cr["spec"]


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_ci_values_reproduce_each_example(helm, example):
    """`helm install -f ci/<example>-values.yaml` yields exactly the EPDDeployment of examples/."""
    wanted = load_spec(example)
    values = DEPLOYMENT_CHART / "ci" / f"{example.stem}-values.yaml"
    assert values.exists(), f"no {values.relative_to(REPO)}: run `python -m tests.helm.ci_values`"
    (cr,) = helm.template(DEPLOYMENT_CHART, values, release="release", namespace=wanted["metadata"]["namespace"])
    assert cr["metadata"]["name"] == wanted["metadata"]["name"]
    assert cr["spec"] == wanted["spec"], "ci values drifted from the example: run `python -m tests.helm.ci_values`"


def test_every_ci_values_file_mirrors_an_example():
    stems = {p.stem for p in EXAMPLES}
    orphans = [p.name for p in ci_values(DEPLOYMENT_CHART) if p.name.removesuffix("-values.yaml") not in stems]
    assert not orphans, f"ci values without an example in examples/: {orphans}"


def test_defaults_are_e_plus_pd_on_shared_storage(helm):
    spec = render_spec(helm)
    assert "prefill" not in spec and "kvTransfer" not in spec
    assert spec["ecTransfer"] == {
        "connector": "SharedStorage",
        "sharedStorage": {"claimName": "ec-cache", "path": "/ec-cache", "maxSize": "50Gi", "ttlSeconds": 600},
    }


def test_only_the_chosen_connectors_settings_are_sent(helm):
    """Switching connector must not drag the default sharedStorage block along (the API refuses it)."""
    spec = render_spec(helm, None, "ecTransfer.connector=CPU", "ecTransfer.cpu.bytes=8Gi")
    assert spec["ecTransfer"] == {"connector": "CPU", "cpu": {"bytes": "8Gi"}}


def test_prefill_makes_it_e_p_d_with_kv_transfer(helm):
    spec = render_spec(helm, None, "prefill.replicas=2", "kvTransfer.connector=Nixl")
    assert spec["prefill"] == {"replicas": 2}
    assert spec["kvTransfer"] == {"connector": "Nixl"}


def test_network_policy_reaches_the_spec(helm, tmp_path):
    assert "networkPolicy" not in render_spec(helm)  # the API's default: on
    values = tmp_path / "values.yaml"
    policy = {"enabled": False, "scrapers": [{"namespaceSelector": {}}]}
    values.write_text(yaml.safe_dump({"networkPolicy": policy}))
    assert render_spec(helm, values)["networkPolicy"] == policy


def test_tracing_reaches_the_spec(helm, tmp_path):
    endpoint = "http://otel-collector.observability:4318/v1/traces"
    assert "tracing" not in render_spec(helm)
    values = tmp_path / "values.yaml"  # a file: `--set` would pass 0.5 as a string, which the schema refuses
    values.write_text(yaml.safe_dump({"tracing": {"otlpEndpoint": endpoint, "sampleRatio": 0.5}}))
    assert render_spec(helm, values)["tracing"] == {"otlpEndpoint": endpoint, "sampleRatio": 0.5}


def test_metadata_from_values(helm):
    (cr,) = helm.template(DEPLOYMENT_CHART, None, "fullnameOverride=qwen", "labels.team=ml", "annotations.owner=alice")
    assert cr["metadata"]["name"] == "qwen"
    assert cr["metadata"]["labels"]["team"] == "ml"
    assert cr["metadata"]["annotations"] == {"owner": "alice"}


def test_notes_give_the_endpoint_and_a_curl_example(helm):
    notes = helm.notes(DEPLOYMENT_CHART, "router.service.port=9000", release="my-vl", namespace="ml")
    assert "get epd my-vl -o jsonpath='{.status.endpoint}'" in notes
    assert "http://my-vl.ml.svc:9000" in notes  # the router Service carries the EPDDeployment's name
    assert "port-forward svc/my-vl 9000:9000" in notes
    assert "curl -s http://127.0.0.1:9000/v1/chat/completions" in notes
    assert '"model": "qwen-vl"' in notes


def _crd_defaults(schema: dict, values: dict, path: str = "") -> Iterator[tuple[str, object, object]]:
    """(path, chart value, CRD default) for each chart value whose field the CRD defaults."""
    for key, value in values.items():
        node = (schema.get("properties") or {}).get(key)
        if node is None:
            continue
        if "default" in node:
            yield f"{path}{key}", value, node["default"]
        if isinstance(value, dict):
            yield from _crd_defaults(node, value, f"{path}{key}.")


def test_chart_defaults_that_the_api_also_defaults_agree_with_it():
    """values.yaml spells out some of the API's own defaults (the vLLM image, replicas, router policies,
    ports) so a user sees the knobs; each must stay the API's value, or bumping the API's default
    (spec.py) would leave chart users on the old one."""
    crd = yaml.safe_load((REPO / "crds" / "serving.epd.dev_epddeployments.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    values = yaml.safe_load((DEPLOYMENT_CHART / "values.yaml").read_text())
    shared = list(_crd_defaults(spec, values))
    assert {path for path, _, _ in shared} >= {"image", "encoder.replicas", "router.replicas", "router.service.port"}
    assert [(p, v, d) for p, v, d in shared if v != d] == [], "values.yaml disagrees with the CRD's defaults"


def test_notes_fall_back_to_the_apis_router_port(helm):
    """With `router: null` nothing is sent and the API defaults the port; NOTES.txt's own fallback must be it."""
    crd = yaml.safe_load((REPO / "crds" / "serving.epd.dev_epddeployments.yaml").read_text())
    router = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["router"]
    port = router["properties"]["service"]["properties"]["port"]["default"]
    (cr,) = helm.template(DEPLOYMENT_CHART, None, "router=null", release="my-vl", namespace="ml")
    assert "router" not in cr["spec"]
    notes = helm.notes(DEPLOYMENT_CHART, "router=null", release="my-vl", namespace="ml")
    assert f"http://my-vl.ml.svc:{port}" in notes and f"port-forward svc/my-vl {port}:{port}" in notes
