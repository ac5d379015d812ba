"""`helm lint --strict` of both charts, and bad values refused by the values schemas with words a user can act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from .charts import CHARTS, DEPLOYMENT_CHART, OPERATOR_CHART, case_id, values_cases

pytestmark = pytest.mark.helm


@pytest.mark.parametrize("case", values_cases(), ids=case_id)
def test_chart_lints_strictly(helm, case):
    chart, values = case
    result = helm.lint(CHARTS[chart], values)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout, result.stdout


# Each bad values file, and the words helm's schema error must contain so a user can fix it.
BAD_VALUES = {
    "deployment-typo-in-tier": (DEPLOYMENT_CHART, "encoder:\n  replica: 2\n", ["encoder", "replica"]),
    "deployment-unknown-connector": (
        DEPLOYMENT_CHART,
        "ecTransfer:\n  connector: Nixl\n",
        ["ecTransfer", "connector", "SharedStorage"],
    ),
    "deployment-bad-pd-policy": (DEPLOYMENT_CHART, "router:\n  pdPolicy: random\n", ["pdPolicy", "least-loaded"]),
    "deployment-bad-encoder-policy": (
        DEPLOYMENT_CHART,
        "router:\n  encoderPolicy: sticky\n",
        ["encoderPolicy", "cache-aware"],
    ),
    "deployment-replicas-not-a-number": (DEPLOYMENT_CHART, "decode:\n  replicas: two\n", ["replicas"]),
    "deployment-top-level-typo": (DEPLOYMENT_CHART, "routr:\n  replicas: 1\n", ["routr"]),
    "operator-bad-namespace": (OPERATOR_CHART, "watchNamespaces: [Team_A]\n", ["watchNamespaces", "pattern"]),
    "operator-typo": (OPERATOR_CHART, "metrics:\n  serviceMonitr: {enabled: true}\n", ["serviceMonitr"]),
}


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_bad_values_are_refused_with_a_clear_message(helm, tmp_path: Path, name: str):
    chart, text, words = BAD_VALUES[name]
    values = tmp_path / "bad-values.yaml"
    values.write_text(text)
    for result in (helm.lint(chart, values), helm.template_text(chart, values)):
        assert result.returncode != 0, f"{name} was accepted"
        message = result.stdout + result.stderr
        for word in words:
            assert word in message, f"{word!r} missing from helm's message:\n{message}"
