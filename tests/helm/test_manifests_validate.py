"""Every object the charts render is valid for the Kubernetes versions we support.

Built-in kinds are checked against the Kubernetes OpenAPI schemas in strict mode (unknown fields
are errors), the EPDDeployment against the CRD's own schema and CEL rules, as the API server
would. Prometheus Operator kinds have no schema available offline; their shape is asserted in
test_operator_chart.py.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from dev.builds.k8s_binaries import NEWEST, OLDEST, minor
from epd_operator.api import spec as api_spec

from .charts import CHARTS, OPERATOR_CHART, REPO, case_id, ci_values, values_cases

pytestmark = pytest.mark.helm

KUBERNETES_VERSIONS = (f"{minor(OLDEST)}.0", f"{minor(NEWEST)}.0")  # the pinned range (dev/builds/k8s_binaries.py)
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
CRD_PATH = REPO / "crds" / "serving.epd.dev_epddeployments.yaml"


def kube_errors(obj: dict[str, Any], version: str) -> list[str]:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        return [f"{obj['kind']}/{obj['metadata']['name']} at {where}: {exc.message}"]
    return []


def custom_object_errors(obj: dict[str, Any]) -> list[str]:
    from tests.support.crd_schema import default_and_prune, validate_custom_object

    crd = yaml.safe_load(CRD_PATH.read_text())
    pruned = default_and_prune(crd, obj)
    dropped = _dropped_paths(obj, pruned)
    errors = [f"{obj['kind']}: the API server would silently drop {p}" for p in dropped]
    return errors + validate_custom_object(crd, pruned)


def _dropped_paths(original: Any, pruned: Any, path: str = "") -> list[str]:
    if isinstance(original, dict) and isinstance(pruned, dict):
        return [
            p
            for key, value in original.items()
            for p in ([f"{path}.{key}"] if key not in pruned else _dropped_paths(value, pruned[key], f"{path}.{key}"))
        ]
    if isinstance(original, list) and isinstance(pruned, list):
        return [
            p
            for i, (a, b) in enumerate(zip(original, pruned, strict=False))
            for p in _dropped_paths(a, b, f"{path}[{i}]")
        ]
    return []


def validate_all(objects: list[dict[str, Any]], version: str) -> list[str]:
    errors: list[str] = []
    for obj in objects:
        if obj["apiVersion"].startswith("serving.epd.dev/"):
            errors += custom_object_errors(obj)
        elif obj["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["apiVersion"]
        else:
            errors += kube_errors(obj, version)
    return errors


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("case", values_cases(), ids=case_id)
def test_rendered_objects_are_valid(helm, case, version):
    chart, values = case
    objects = helm.template(CHARTS[chart], values)
    assert objects, "nothing rendered"
    assert validate_all(objects, version) == []


def test_operator_ci_values_cover_every_optional_kind(helm):
    """The scenarios above include the Prometheus Operator objects, cluster-wide and namespaced."""
    for values in ci_values(OPERATOR_CHART):
        objects = helm.template(OPERATOR_CHART, values)
        kinds = {o["kind"] for o in objects}
        assert kinds >= PROMETHEUS_OPERATOR_KINDS, values.name
        # The operator's own ClusterRole; the aggregated tenant roles (-edit/-view) bind no one.
        bound = {o["kind"] for o in objects if o["kind"] == "ClusterRoleBinding"}
        assert bool(bound) != ("watchNamespaces" in values.read_text()), values.name


def test_deployment_chart_renders_what_the_api_models_accept(helm):
    """The same spec through the operator's own pydantic models (what the controller parses)."""
    api = api_spec
    for values in [None, *sorted((CHARTS["epd-deployment"] / "ci").glob("*-values.yaml"))]:
        (cr,) = helm.template(CHARTS["epd-deployment"], values, release="my-vl", namespace="ml")
        parsed = api.EPDDeployment.model_validate(cr)
        assert parsed.metadata.name == cr["metadata"]["name"]
