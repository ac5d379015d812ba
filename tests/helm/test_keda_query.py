"""The load query of a KEDA-scaled encoder tier's ScaledObject asks Prometheus for the demand the adapter
rule serves the HPA: one quantity, in one unit, for both engines and for waking from zero.

Evaluated by Prometheus' own engine (`promtool test rules`) over what is really exported: the routers'
/metrics exposition (RouterMetrics with the encoder demand they hold), labelled as the operator chart's
router PodMonitor scrape labels it, beside the series of another deployment whose names a loose pattern
would mix in. KEDA hands the query's value to its HPA as an AverageValue external metric (divided by the
tier's pod count), as the HPA divides the adapter's Object metric: the same target per pod.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from epd_operator.render import render
from epd_operator.router.contract import ENCODER_DEMAND_METRIC
from epd_operator.router.metrics import RouterMetrics
from tests.support.render_examples import find, variants

from .test_adapter_rules import (  # noqa: F401  (monitors: a fixture)
    monitors,
    object_query,
    podmonitor_target_labels,
    promtool,
    serving_rules,
)

VARIANT = "keda-encoder-scale-to-zero"  # EPDDeployment qwen-vl in namespace default, encoder at 0..4
# (namespace, router pod): (the deployment it serves, its encoder demand in items)
ROUTERS = {
    ("default", "qwen-vl-router-7c9d5b8f4-abcde"): ("qwen-vl", 5),
    ("default", "qwen-vl-router-7c9d5b8f4-fghij"): ("qwen-vl", 2),
    # the same deployment name in another namespace, and another deployment ("qwen-vl-encoder") here: not ours
    ("other", "qwen-vl-router-7c9d5b8f4-klmno"): ("qwen-vl", 70),
    ("default", "qwen-vl-encoder-router-6b8d7c5f9-pqrst"): ("qwen-vl-encoder", 50),
}


def scraped(monitors) -> list[tuple[dict[str, str], str]]:  # noqa: F811
    """Every router's demand series, with promtool's value notation over 3 minutes."""
    out = []
    for (namespace, router_pod), (deployment, items) in ROUTERS.items():
        metrics = RouterMetrics()
        metrics.encoder_demand.labels(deployment).inc(items)
        target = podmonitor_target_labels(monitors, "router", namespace, router_pod)
        for family in text_string_to_metric_families(metrics.exposition()[0].decode()):
            out += [
                ({"__name__": s.name, **s.labels, **target}, f"{s.value:g}x3")
                for s in family.samples
                if s.name == ENCODER_DEMAND_METRIC
            ]
    assert len(out) == len(ROUTERS)
    return out


def evaluate(tmp_path: Path, series, checks: list[tuple[str, float]]) -> None:
    def notation(labels: dict[str, str]) -> str:
        rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return f"{labels['__name__']}{{{rest}}}"

    test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": notation(labels), "values": values} for labels, values in series],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "3m", "exp_samples": [{"labels": "{}", "value": value}]}
                    for expr, value in checks
                ],
            }
        ],
    }
    path = tmp_path / "keda-query-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def load_query() -> str:
    so = find(render(variants()[VARIANT]), "ScaledObject", "qwen-vl-encoder")
    return so["spec"]["triggers"][0]["metadata"]["query"]


def test_the_load_query_sums_the_deployments_demand_as_the_adapter_serves_it(monitors, tmp_path):  # noqa: F811
    promtool()
    series = scraped(monitors)
    (rule,) = serving_rules(ENCODER_DEMAND_METRIC, [(labels, 0.0) for labels, _ in series])
    adapter = f"sum({object_query(rule, ENCODER_DEMAND_METRIC, 'default', 'epddeployments', 'qwen-vl')})"
    # this deployment's routers in this namespace: 5 + 2 items, by KEDA's query and by the HPA's
    evaluate(tmp_path, series, [(load_query(), 7), (adapter, 7)])


def test_the_load_query_of_an_idle_tier_at_zero_is_zero(monitors, tmp_path):  # noqa: F811
    """No router of this deployment reports: 0, not an empty answer, so KEDA reads an inactive trigger
    instead of an error."""
    promtool()
    others = [(labels, values) for labels, values in scraped(monitors) if "-router-7c9d5b8f4-" not in labels["pod"]]
    evaluate(tmp_path, others, [(load_query(), 0)])
