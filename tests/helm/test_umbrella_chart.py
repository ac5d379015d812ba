"""Both charts as subcharts of an umbrella chart (file:// dependencies), with `global` values set,
as a platform team composes them: `helm dependency build`, `helm lint --strict`, `helm template`.
Also the operator chart's metadata and its CRD upgrade story."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from .charts import DEPLOYMENT_CHART, KUBE_VERSION, OPERATOR_CHART, REPO, by_kind

pytestmark = pytest.mark.helm

UMBRELLA_VALUES = """\
global:
  imageRegistry: registry.example
  labels: {team: ml-platform}
epd-operator:
  watchNamespaces: [ml]
  metrics:
    podMonitors: {enabled: true}
    prometheusRule: {enabled: true}
epd-deployment:
  fullnameOverride: qwen-vl
"""


@pytest.fixture
def umbrella(helm, tmp_path):
    chart = tmp_path / "platform"
    chart.mkdir()
    (chart / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "version": "1.0.0",
                "type": "application",
                "description": "Umbrella chart around epd-operator and epd-deployment.",
                "icon": "https://example.com/icon.svg",
                "dependencies": [
                    {"name": "epd-operator", "version": "0.1.0", "repository": f"file://{OPERATOR_CHART}"},
                    {"name": "epd-deployment", "version": "0.1.0", "repository": f"file://{DEPLOYMENT_CHART}"},
                ],
            }
        )
    )
    (chart / "values.yaml").write_text(UMBRELLA_VALUES)
    (chart / "templates").mkdir()
    result = helm.run("dependency", "build", str(chart))
    assert result.returncode == 0, result.stdout + result.stderr
    return chart


def test_both_charts_work_as_subcharts_with_global_values(helm, umbrella):
    lint = helm.run("lint", "--strict", "--kube-version", KUBE_VERSION, str(umbrella))
    assert lint.returncode == 0 and "[WARNING]" not in lint.stdout, lint.stdout + lint.stderr
    result = helm.run(
        "template", "platform", str(umbrella), "--namespace", "epd-system", "--kube-version", KUBE_VERSION
    )
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    (epd,) = by_kind(objects, "EPDDeployment")
    assert epd["metadata"]["name"] == "qwen-vl"
    (operator,) = by_kind(objects, "Deployment")
    assert "--namespace=ml" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert by_kind(objects, "PrometheusRule") and len(by_kind(objects, "PodMonitor")) == 2


def test_global_alone_is_accepted_by_the_operator_chart(helm, tmp_path):
    values = tmp_path / "global.yaml"
    values.write_text("global: {imageRegistry: registry.example, anything: [1, 2]}\n")
    for result in (helm.lint(OPERATOR_CHART, values), helm.template_text(OPERATOR_CHART, values)):
        assert result.returncode == 0, result.stdout + result.stderr


def test_operator_chart_metadata():
    chart = yaml.safe_load((OPERATOR_CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://") and all(s.startswith("https://") for s in chart["sources"])
    assert chart["icon"].startswith("https://") and chart["icon"].endswith("/charts/epd-operator/icon.svg")
    assert (OPERATOR_CHART / "icon.svg").read_text().lstrip().startswith("<svg")
    assert chart["maintainers"] and all(m.get("name") for m in chart["maintainers"])
    json.loads((OPERATOR_CHART / "values.schema.json").read_text())["properties"]["global"]


def test_docs_say_how_the_crd_is_upgraded():
    """helm never upgrades what is in crds/: docs/helm.md and the chart's README must say how to apply a new CRD."""
    text = (REPO / "docs" / "helm.md").read_text() + (OPERATOR_CHART / "README.md").read_text()
    assert re.search(r"kubectl apply --server-side[^\n]*charts/epd-operator/crds/", text), "no CRD upgrade command"
    assert "helm upgrade" in text and "crds/" in text
