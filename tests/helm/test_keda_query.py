"""The load query of a KEDA-scaled tier's ScaledObject asks Prometheus for the load the adapter rules serve.

Evaluated by Prometheus' own engine (`promtool test rules`) over what is really exported: the routers'
/metrics exposition (RouterMetrics with discovered backends, work in flight and media items sent raw),
labelled as the operator chart's router PodMonitor scrape labels it, beside the series of another
deployment whose names a loose pattern would mix in. KEDA hands the query's value to its HPA as an
AverageValue external metric (divided by the tier's pod count), so the sum over the tier's pods is the
same target per pod as the adapter's per-pod metric.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from epd_operator.render import render
from epd_operator.router.backends import DiscoveredEndpoint, Pool
from epd_operator.router.metrics import RouterMetrics
from tests.support.render_examples import find, variants

from .test_adapter_rules import monitors, podmonitor_target_labels, promtool  # noqa: F401  (monitors: a fixture)

VARIANT = "keda-encoder-scale-to-zero"  # EPDDeployment qwen-vl in namespace default, encoder at 0..4
POD_A, POD_B = "qwen-vl-encoder-5f7d8c9b6-x2kqz", "qwen-vl-encoder-5f7d8c9b6-p9mwd"
# (namespace, router pod): work in flight per encoder pod, media items sent raw per minute
ROUTERS = {
    ("default", "qwen-vl-router-7c9d5b8f4-abcde"): ({POD_A: 3, POD_B: 1}, 60),
    ("default", "qwen-vl-router-7c9d5b8f4-fghij"): ({POD_A: 2}, 0),
    # same names in another namespace, and another deployment ("qwen-vl-encoder") in this one: not ours
    ("other", "qwen-vl-router-7c9d5b8f4-klmno"): ({POD_A: 7}, 600),
    ("default", "qwen-vl-encoder-router-6b8d7c5f9-pqrst"): ({"qwen-vl-encoder-encoder-6d5c4b3a2-uvwxy": 5}, 600),
}


def scraped(monitors) -> list[tuple[dict[str, str], str]]:  # noqa: F811
    """Every in-flight and raw-items series of every router, with promtool's value notation over 3 minutes."""
    out = []
    for (namespace, router_pod), (inflight, raw_per_minute) in ROUTERS.items():
        metrics = RouterMetrics()
        pool = Pool("encoder", metrics)
        pool.update([DiscoveredEndpoint(f"http://10.1.0.{i}:8000", pod=p) for i, p in enumerate(inflight)])
        for ep in pool.endpoints.values():
            pool.acquire(ep, inflight[ep.pod])
        metrics.count_items("fallback", 1)  # the counter exists; its growth is given below
        target = podmonitor_target_labels(monitors, "router", namespace, router_pod)
        for family in text_string_to_metric_families(metrics.exposition()[0].decode()):
            for s in family.samples:
                labels = {"__name__": s.name, **s.labels, **target}
                if s.name == "epd_router_endpoint_inflight":
                    out.append((labels, f"{s.value:g}x3"))
                elif s.name == "epd_router_items_total" and s.labels.get("outcome") == "fallback":
                    out.append((labels, f"0+{raw_per_minute}x3"))
    assert {labels["__name__"] for labels, _ in out} == {"epd_router_endpoint_inflight", "epd_router_items_total"}
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


def test_the_load_query_sums_the_tiers_work_in_flight_and_its_raw_items(monitors, tmp_path):  # noqa: F811
    promtool()
    so = find(render(variants()[VARIANT]), "ScaledObject", "qwen-vl-encoder")
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    # in flight to this tier's pods from this namespace's routers: 3 + 1 + 2; raw: 60 items a minute = 1/s
    evaluate(tmp_path, scraped(monitors), [(query, 6 + 1)])


def test_the_load_query_of_an_idle_tier_at_zero_is_zero(monitors, tmp_path):  # noqa: F811
    """Nothing in flight and nothing sent raw (no series of this deployment at all): 0, not an empty
    answer, so KEDA reads an inactive trigger instead of an error."""
    promtool()
    so = find(render(variants()[VARIANT]), "ScaledObject", "qwen-vl-encoder")
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    others = [(labels, values) for labels, values in scraped(monitors) if "-router-7c9d5b8f4-" not in labels["pod"]]
    evaluate(tmp_path, others, [(query, 0)])
