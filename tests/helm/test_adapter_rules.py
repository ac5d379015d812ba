"""The prometheus-adapter rules the operator chart ships serve exactly what the rendered HPAs ask for.

Evaluated against what is really exported: the router's own /metrics exposition (RouterMetrics with
discovered backends and work in flight), labelled as the chart's PodMonitor scrape labels it, and the
metric names the renderer puts into the HPAs. The adapter's side follows its documented rule semantics
(seriesQuery selects series, `resources.overrides` maps labels to resources, `name` renames, and
`metricsQuery` is templated with `<<.Series>>`, `<<.LabelMatchers>>` and `<<.GroupBy>>`); the PromQL
itself is evaluated by Prometheus' own engine (`promtool test rules`, Debian's prometheus package).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from epd_operator.render import render
from epd_operator.render.autoscaling import load_metric_name
from epd_operator.router.backends import DiscoveredEndpoint, Pool
from epd_operator.router.config import RouterConfig
from epd_operator.router.contract import DEMAND_DEPLOYMENT_LABEL, ENCODER_DEMAND_METRIC
from epd_operator.router.metrics import RouterMetrics
from tests.support.render_examples import NIXL_AUTOSCALED, example

from .charts import OPERATOR_CHART, by_kind

RULES = yaml.safe_load((OPERATOR_CHART / "prometheus-adapter" / "values.yaml").read_text())["rules"]
NAMESPACE = "inference"  # the example's namespace
Series = tuple[dict[str, str], float]  # labels (with __name__), value

# Work in flight per router pod, tier and backend pod: two routers of the example, and one router of
# another deployment in another namespace whose encoder pod has the same name (it must not count).
INFLIGHT = {
    (NAMESPACE, "qwen-vl-epd-router-a"): {
        "encoder": {"qwen-vl-epd-encoder-0": 3, "qwen-vl-epd-encoder-1": 1},
        "prefill": {"qwen-vl-epd-prefill-0": 2},
        "decode": {"qwen-vl-epd-decode-0": 4},
    },
    (NAMESPACE, "qwen-vl-epd-router-b"): {
        "encoder": {"qwen-vl-epd-encoder-0": 2, "qwen-vl-epd-encoder-1": 0},
        "prefill": {"qwen-vl-epd-prefill-0": 1},
        "decode": {"qwen-vl-epd-decode-0": 1},
    },
    ("other", "qwen-vl-epd-router-c"): {"encoder": {"qwen-vl-epd-encoder-0": 7}},
}

# The encoder demand of each router pod (the deployment it serves, items): the example's two routers,
# a router of another deployment in the same namespace, and one of a same-named deployment elsewhere.
DEMAND = {
    (NAMESPACE, "qwen-vl-epd-router-a"): ("qwen-vl-epd", 9),
    (NAMESPACE, "qwen-vl-epd-router-b"): ("qwen-vl-epd", 3),
    (NAMESPACE, "other-epd-router-d"): ("other-epd", 40),
    ("other", "qwen-vl-epd-router-c"): ("qwen-vl-epd", 7),
}


@pytest.fixture(scope="module")
def monitors(helm) -> list[dict[str, Any]]:
    """The chart's PodMonitors (the scrape configuration of routers and vLLM pods)."""
    return by_kind(helm.template(OPERATOR_CHART, None, "metrics.podMonitors.enabled=true"), "PodMonitor")


def podmonitor_target_labels(monitors, role: str, namespace: str, pod: str) -> dict[str, str]:
    """What Prometheus Operator puts on a series scraped through the chart's PodMonitor for `role`
    pods: its target labels, then the PodMonitor's relabelings (from pod labels the operator sets)."""
    name = "routers" if role == "router" else "vllm"
    (monitor,) = [m for m in monitors if m["metadata"]["name"].endswith(f"-{name}")]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    labels = {
        "namespace": namespace,
        "pod": pod,
        "container": "router" if role == "router" else "vllm",
        "endpoint": endpoint["port"],
        "job": f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}",
    }
    pod_labels = {"app_kubernetes_io_instance": "qwen-vl-epd", "serving_epd_dev_role": role}
    for relabel in endpoint.get("relabelings", []):
        (source,) = relabel["sourceLabels"]
        labels[relabel["targetLabel"]] = pod_labels[source.removeprefix("__meta_kubernetes_pod_label_")]
    return labels


def router_series(monitors) -> list[Series]:
    """Every epd_router_endpoint_inflight sample of every router, as Prometheus stores it."""
    out: list[Series] = []
    for (namespace, router_pod), tiers in INFLIGHT.items():
        metrics = RouterMetrics()
        for role, backends in tiers.items():
            pool = Pool(role, metrics)
            pool.update([DiscoveredEndpoint(f"http://10.1.0.{i}:8000", pod=p) for i, p in enumerate(backends)])
            for ep in pool.endpoints.values():
                pool.acquire(ep, backends[ep.pod])
        target = podmonitor_target_labels(monitors, "router", namespace, router_pod)
        for family in text_string_to_metric_families(metrics.exposition()[0].decode()):
            if family.name == "epd_router_endpoint_inflight":
                out += [({"__name__": s.name, **s.labels, **target}, s.value) for s in family.samples]
    assert out, "the router exported no in-flight series"
    return out


def demand_series(monitors) -> list[Series]:
    """Every epd_router_encoder_demand sample of every router, as Prometheus stores it: each router's
    RouterMetrics, named for its deployment as the rendered `--deployment` flag names it, with items
    held raw (spilled or at zero) as the encoder stage holds them."""
    out: list[Series] = []
    for (namespace, router_pod), (deployment, items) in DEMAND.items():
        metrics = RouterMetrics()
        metrics.encoder_demand.labels(RouterConfig(deployment=deployment).deployment).inc(items)
        target = podmonitor_target_labels(monitors, "router", namespace, router_pod)
        for family in text_string_to_metric_families(metrics.exposition()[0].decode()):
            if family.name == ENCODER_DEMAND_METRIC:
                out += [({"__name__": s.name, **s.labels, **target}, s.value) for s in family.samples]
    assert len(out) == len(DEMAND), "the router exported no demand series"
    return out


def expected_demand(namespace: str, deployment: str) -> float:
    return sum(n for (ns, _), (d, n) in DEMAND.items() if (ns, d) == (namespace, deployment))


def vllm_series(monitors) -> list[Series]:
    """vLLM 0.32's queue gauge (labels model_name, engine) on two encoder pods, as scraped."""
    return [
        (
            {
                "__name__": "vllm:num_requests_waiting",
                "engine": "0",
                "model_name": "qwen-vl",
                **podmonitor_target_labels(monitors, "encoder", NAMESPACE, pod),
            },
            value,
        )
        for pod, value in (("qwen-vl-epd-encoder-0", 2), ("qwen-vl-epd-encoder-1", 5))
    ]


# ----------------------------------------------------------------------------- the adapter's side

_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def selector(query: str) -> tuple[str, list[tuple[str, str, str]]]:
    """A PromQL series selector `name{l="v",...}` as (name, [(label, op, value)])."""
    m = re.fullmatch(r"([A-Za-z_:][\w:]*)\{(.*)\}", query.strip())
    assert m, f"not a series selector: {query}"
    body, pos = m.group(2), 0
    matchers: list[tuple[str, str, str]] = []
    while pos < len(body):
        found = _MATCHER.match(body, pos)
        assert found, f"cannot read matchers {body[pos:]!r} of {query}"
        label, op, value = found.groups()
        matchers.append((label, op, value))
        pos = found.end()
    return str(m.group(1)), matchers


def matches(series: dict[str, str], query: str) -> bool:
    name, matchers = selector(query)
    if series["__name__"] != name:
        return False
    for label, op, value in matchers:
        have = series.get(label, "")
        ok = {
            "=": have == value,
            "!=": have != value,
            "=~": re.fullmatch(value, have) is not None,
            "!~": re.fullmatch(value, have) is None,
        }[op]
        if not ok:
            return False
    return True


def served_name(rule: dict[str, Any], series_name: str) -> str | None:
    """The custom metric name a rule gives a series (`name.matches`, default `^(.*)$`; `as`, default `$1`)."""
    naming = rule.get("name") or {}
    found = re.search(naming.get("matches") or "^(.*)$", series_name)
    if found is None:
        return None
    template = naming.get("as") or ("$1" if found.re.groups else "$0")
    return re.sub(r"\$(\d+)", lambda g: found.group(int(g.group(1))) or "", template)


def resource_label(rule: dict[str, Any], resource: str) -> str:
    """The series label the rule maps to a resource (pods, namespaces, epddeployments)."""
    (label,) = [k for k, v in rule["resources"]["overrides"].items() if v["resource"] in (resource, resource + "s")]
    return label


def object_query(rule: dict[str, Any], series_name: str, namespace: str, resource: str, name: str) -> str:
    """What the adapter sends Prometheus when an HPA asks for an Object metric of the object `name`."""
    label = resource_label(rule, resource)
    matchers = f'{resource_label(rule, "namespace")}="{namespace}",{label}="{name}"'
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series_name)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", label)
    )


def serving_rules(name: str, series: list[Series]) -> list[dict[str, Any]]:
    """The rules that serve the custom metric `name` from `series`."""
    return [
        rule
        for rule in RULES["custom"]
        if any(
            matches(labels, rule["seriesQuery"]) and served_name(rule, labels["__name__"]) == name
            for labels, _ in series
        )
    ]


def metrics_query(rule: dict[str, Any], series_name: str, namespace: str, pods: list[str]) -> str:
    """What the adapter sends Prometheus when an HPA asks for the pods `pods` of `namespace`."""
    pod_label = resource_label(rule, "pod")
    matchers = f'{resource_label(rule, "namespace")}="{namespace}",{pod_label}=~"{"|".join(pods)}"'
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series_name)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", pod_label)
    )


def rendered_hpa_metrics() -> dict[str, dict[str, Any]]:
    """Tier -> the load metric its rendered HPA asks for: the example's encoder (its own `load`) and
    prefill and decode given `load` too."""
    epd = example(
        NIXL_AUTOSCALED,
        **{
            "spec.prefill.autoscaling": {"maxReplicas": 4, "load": {"targetPerPod": 8}},
            "spec.decode.autoscaling": {"maxReplicas": 4, "load": {"targetPerPod": 64}},
        },
    )
    found = {}
    for hpa in (o for o in render(epd) if o["kind"] == "HorizontalPodAutoscaler"):
        tier = hpa["metadata"]["labels"]["serving.epd.dev/role"]
        (metric,) = [m for m in hpa["spec"]["metrics"] if m["type"] in ("Pods", "Object")]
        found[tier] = metric
    return found


def hpa_metric_names() -> dict[str, str]:
    """Tier -> the per-pod metric its rendered HPA asks for (prefill and decode)."""
    return {
        tier: metric["pods"]["metric"]["name"]
        for tier, metric in rendered_hpa_metrics().items()
        if metric["type"] == "Pods"
    }


def expected_load(tier: str, namespace: str = NAMESPACE) -> dict[str, float]:
    """Each backend pod's in-flight work summed over the routers of `namespace`."""
    totals: dict[str, float] = {}
    for (ns, _), tiers in INFLIGHT.items():
        for pod, n in tiers.get(tier, {}).items():
            if ns == namespace:
                totals[pod] = totals.get(pod, 0) + n
    return totals


# ----------------------------------------------------------------------------- tests


def test_the_adapter_rules_read_no_recorded_series_and_name_no_colon():
    assert RULES["default"] is False  # only these rules: no adapter-wide defaults that would shadow a name
    for rule in RULES["custom"]:
        resources = sorted(v["resource"] for v in rule["resources"]["overrides"].values())
        assert resources in (["namespace", "pod"], ["epddeployments", "namespace"]), rule
        assert ":" not in rule["name"]["as"], "custom metric names cannot contain ':'"


def test_the_encoder_hpa_reads_its_deployments_demand_through_one_rule(monitors):
    metric = rendered_hpa_metrics()["encoder"]
    assert metric["type"] == "Object"
    described = metric["object"]["describedObject"]
    assert (described["kind"], described["name"]) == ("EPDDeployment", "qwen-vl-epd")
    assert metric["object"]["metric"]["name"] == ENCODER_DEMAND_METRIC
    assert metric["object"]["target"]["type"] == "AverageValue"  # divided by the tier's pods
    (rule,) = serving_rules(ENCODER_DEMAND_METRIC, demand_series(monitors))
    override = rule["resources"]["overrides"][DEMAND_DEPLOYMENT_LABEL]
    group = described["apiVersion"].split("/")[0]
    assert (override["group"], override["resource"]) == (group, "epddeployments")


def test_each_rendered_hpa_metric_is_served_by_one_rule_for_the_tiers_own_pods(monitors):
    names = hpa_metric_names()
    assert names == {tier: load_metric_name(tier) for tier in ("prefill", "decode")}
    series = router_series(monitors)
    for tier, name in names.items():
        rules = serving_rules(name, series)
        assert len(rules) == 1, f"{name}: served by {len(rules)} rules"
        (rule,) = rules
        pod_label = resource_label(rule, "pod")
        selected = [labels for labels, _ in series if matches(labels, rule["seriesQuery"])]
        in_namespace = [s for s in selected if s[resource_label(rule, "namespace")] == NAMESPACE]
        # the pods the metric is attached to are the tier's own, never the routers that measured it
        assert {s[pod_label] for s in in_namespace} == set(expected_load(tier)), name
        assert not any(s[pod_label].startswith("qwen-vl-epd-router") for s in selected)


def test_the_vllm_queue_rule_serves_the_vllm_pods_under_a_valid_name(monitors):
    series = vllm_series(monitors)
    (rule,) = serving_rules("vllm_num_requests_waiting", series)
    assert {labels[resource_label(rule, "pod")] for labels, _ in series} == {
        "qwen-vl-epd-encoder-0",
        "qwen-vl-epd-encoder-1",
    }


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian/Ubuntu: apt-get install prometheus; `make test-tools`)")
    return found


def evaluate(tmp_path: Path, series: list[Series], checks: list[tuple[str, list[Series]]]) -> None:
    """Prometheus' engine evaluates each (expression, expected samples) over `series`; fails with
    promtool's own report of what it got instead."""

    def notation(labels: dict[str, str]) -> str:
        name = labels.get("__name__", "")
        rest = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return f"{name}{{{rest}}}"

    test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": notation(labels), "values": f"{value:g}x3"} for labels, value in series],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "2m",
                        "exp_samples": [{"labels": notation(labels), "value": value} for labels, value in expected],
                    }
                    for expr, expected in checks
                ],
            }
        ],
    }
    path = tmp_path / "adapter-rules-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_answers_the_adapters_queries_with_each_pods_load(monitors, tmp_path):
    promtool()
    series = router_series(monitors)
    checks = []
    for tier, name in hpa_metric_names().items():
        (rule,) = serving_rules(name, series)
        series_name = selector(rule["seriesQuery"])[0]
        # the series the adapter discovers: exactly the routers' series about this tier's pods
        selected = [(labels, value) for labels, value in series if labels["role"] == tier and labels["backend_pod"]]
        checks.append((rule["seriesQuery"], selected))
        # the query it sends when the HPA asks for this tier's pods: per pod, summed over the routers
        # of the namespace (the other namespace's router, with a same-named pod, is left out)
        load = expected_load(tier)
        expected = [({resource_label(rule, "pod"): pod}, value) for pod, value in sorted(load.items())]
        checks.append((metrics_query(rule, series_name, NAMESPACE, sorted(load)), expected))
    # the encoder HPA's Object metric: the deployment's demand summed over its routers of the namespace
    # (another deployment's router, and a same-named deployment's in another namespace, left out)
    demand = demand_series(monitors)
    (rule,) = serving_rules(ENCODER_DEMAND_METRIC, demand)
    checks.append((rule["seriesQuery"], demand))
    query = object_query(rule, ENCODER_DEMAND_METRIC, NAMESPACE, "epddeployments", "qwen-vl-epd")
    checks.append((query, [({DEMAND_DEPLOYMENT_LABEL: "qwen-vl-epd"}, expected_demand(NAMESPACE, "qwen-vl-epd"))]))
    series += demand
    vllm = vllm_series(monitors)
    (rule,) = serving_rules("vllm_num_requests_waiting", vllm)
    pods = ["qwen-vl-epd-encoder-0", "qwen-vl-epd-encoder-1"]
    checks.append(
        (
            metrics_query(rule, "vllm:num_requests_waiting", NAMESPACE, pods),
            [({"pod": "qwen-vl-epd-encoder-0"}, 2), ({"pod": "qwen-vl-epd-encoder-1"}, 5)],
        )
    )
    evaluate(tmp_path, series + vllm, checks)


def test_a_wrong_expectation_fails_the_evaluation(tmp_path):
    """The evaluation above can fail: promtool reports a value that differs."""
    promtool()
    with pytest.raises(AssertionError, match=r"exp:.*got:"):
        evaluate(tmp_path, [({"__name__": "x", "a": "1"}, 3)], [('sum(x{a="1"}) by (a)', [({"a": "1"}, 4)])])
