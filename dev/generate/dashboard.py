"""The EPD Grafana dashboard shipped by the epd-operator chart (dashboards/epd.json).

Panels are declared here, compactly, and written out as Grafana JSON by `make generate`; a unit test
fails while the committed file differs, and a chart test (tests/helm/test_operator_chart.py) checks every
query against the metrics the router and the operator really export.

Series come from three places: the router and the operator (scraped through the chart's
PodMonitors/ServiceMonitor; the `epd` label is the EPDDeployment, from a relabeling), vLLM pods
(`role` = the tier, also from a relabeling) and kube-state-metrics (Deployments, HPAs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PATH = "charts/epd-operator/dashboards/epd.json"

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'namespace=~"$namespace", epd=~"$epd"'
RATE = "$__rate_interval"
# The router's per-backend series name the backend pod `backend_pod` (the target's `pod` is the router).
TIER_DEPLOYMENTS = 'namespace=~"$namespace", deployment=~"($epd)-(encoder|prefill|decode|router)"'


def rate(metric: str, extra: str = "", by: str = "") -> str:
    grouping = f"sum by ({by}) " if by else "sum"
    return f"{grouping}(rate({metric}{{{SEL}{extra}}}[{RATE}]))"


def quantile(q: float, metric: str, by: str, extra: str = "", selector: str = SEL) -> str:
    return (
        f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) (rate({metric}{{{selector}{extra}}}[{RATE}])))"
    )


def ratio(numerator: str, denominator: str) -> str:
    return f"{numerator} / clamp_min({denominator}, 1e-9)"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    stack: bool = False
    width: int = 12
    height: int = 8


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


ROWS = [
    Row(
        "Overview",
        [
            Panel("Requests / s", [(rate("epd_router_requests_total"), "")], "reqps", "stat", width=6, height=4),
            Panel(
                "Error ratio (5xx)",
                [(ratio(rate("epd_router_requests_total", ', status=~"5.."'), rate("epd_router_requests_total")), "")],
                "percentunit",
                "stat",
                width=6,
                height=4,
            ),
            Panel(
                "p95 time to first byte",
                [(quantile(0.95, "epd_router_stage_seconds_bucket", "", ', stage="ttfb"'), "")],
                "s",
                "stat",
                width=6,
                height=4,
            ),
            Panel(
                "Media items reused",
                [(ratio(rate("epd_router_items_total", ', outcome="reused"'), rate("epd_router_items_total")), "")],
                "percentunit",
                "stat",
                width=6,
                height=4,
                description="Share of media items whose embeddings were reused instead of encoded again.",
            ),
        ],
    ),
    Row(
        "Requests and latency per stage (router)",
        [
            Panel(
                "Requests / s by route and status",
                [(rate("epd_router_requests_total", by="route, status"), "{{route}} {{status}}")],
                "reqps",
            ),
            Panel(
                "Backend errors, retries and ejections / s",
                [
                    (rate("epd_router_backend_errors_total", by="role, kind"), "error {{role}} {{kind}}"),
                    (rate("epd_router_retries_total", by="stage, reason"), "retry {{stage}} {{reason}}"),
                    (rate("epd_router_ejections_total", by="role"), "ejected {{role}}"),
                ],
                "ops",
                description="Failed calls to encoder/prefill/decode pods, retries, and endpoints taken out of rotation.",
            ),
            Panel(
                "p50 latency per stage",
                [(quantile(0.5, "epd_router_stage_seconds_bucket", "stage"), "{{stage}}")],
                "s",
                description="encode: media fan-out to encoders; prefill; decode; ttfb: first byte to the client; total.",
            ),
            Panel(
                "p95 latency per stage",
                [(quantile(0.95, "epd_router_stage_seconds_bucket", "stage"), "{{stage}}")],
                "s",
            ),
            Panel(
                "Time to first token",
                [
                    (quantile(0.5, "epd_router_stage_seconds_bucket", "", ', stage="ttfb"'), "router ttfb p50"),
                    (quantile(0.95, "epd_router_stage_seconds_bucket", "", ', stage="ttfb"'), "router ttfb p95"),
                    (quantile(0.95, "vllm:time_to_first_token_seconds_bucket", "role"), "vLLM TTFT p95 {{role}}"),
                ],
                "s",
                description="As the client sees it (router) and as vLLM measures it per tier.",
            ),
            Panel(
                "p99 latency per stage",
                [(quantile(0.99, "epd_router_stage_seconds_bucket", "stage"), "{{stage}}")],
                "s",
            ),
        ],
    ),
    Row(
        "Encoder",
        [
            Panel(
                "Media items / s by outcome",
                [(rate("epd_router_items_total", by="outcome"), "{{outcome}}")],
                "ops",
                stack=True,
                description="encoded: by an encoder; reused: embeddings already held; "
                "fallback: raw media sent to the consumer (no encoder available); "
                "spilled: raw media sent to the consumer while every encoder was full (spill-over).",
            ),
            Panel(
                "Encoder queue (vLLM waiting / running)",
                [
                    (f'sum by (pod) (vllm:num_requests_waiting{{{SEL}, role="encoder"}})', "waiting {{pod}}"),
                    (f'sum by (pod) (vllm:num_requests_running{{{SEL}, role="encoder"}})', "running {{pod}}"),
                ],
            ),
            Panel(
                "Encoder demand (all routers)",
                [(f"sum by (epd_deployment) (epd_router_encoder_demand{{{SEL}}})", "{{epd_deployment}}")],
                description="What the encoder autoscaler scales on, HPA or KEDA: media items the routers want "
                "encoded and have not finished (on an encoder, spilled, or raw while no encoder serves).",
            ),
            Panel(
                "In flight per encoder (all routers)",
                [
                    (
                        f'sum by (backend_pod) (epd_router_endpoint_inflight{{{SEL}, role="encoder"}})',
                        "{{backend_pod}}",
                    ),
                ],
                description="Media items on each encoder: the part of the demand the encoders hold.",
            ),
            Panel(
                "Fallback requests / s by reason",
                [
                    (rate("epd_router_encoder_fallback_requests_total", by="reason"), "{{reason}}"),
                ],
                "reqps",
                description="Requests whose media went raw to prefill/decode because no encoder could take them.",
            ),
            Panel(
                "Spill-over / s by reason",
                [
                    (rate("epd_router_spilled_items_total", by="reason"), "items {{reason}}"),
                    (rate("epd_router_spilled_requests_total", by="reason"), "requests {{reason}}"),
                ],
                "ops",
                description="Media sent raw to the consumers instead of queuing while every encoder was at the "
                "spill-over bound (spec.router.spillOver); sustained spill-over means the encoder tier is short.",
            ),
        ],
    ),
    Row(
        "Prefill and decode",
        [
            Panel(
                "In flight per prefill/decode pod",
                [
                    (
                        f'sum by (role, backend_pod) (epd_router_endpoint_inflight{{{SEL}, role!="encoder"}})',
                        "{{role}} {{backend_pod}}",
                    ),
                ],
            ),
            Panel(
                "vLLM waiting requests per tier",
                [
                    (f'sum by (role) (vllm:num_requests_waiting{{{SEL}, role!="encoder"}})', "{{role}}"),
                ],
            ),
            Panel(
                "KV handoff: lease expiries and failures / s",
                [
                    (rate("vllm:nixl_num_kv_expired_reqs_total", by="role"), "lease expired {{role}}"),
                    (rate("vllm:nixl_num_notifications_after_expiry_total", by="role"), "read after expiry {{role}}"),
                    (rate("vllm:nixl_num_failed_transfers_total", by="role"), "failed transfers {{role}}"),
                    (rate("epd_router_kv_handoffs_total", by="outcome"), "router: decode {{outcome}}"),
                ],
                "ops",
                width=24,
                description="Anything but the router's `pulled` should stay at zero. Lease expired / read after "
                "expiry: prefill released KV blocks before decode finished reading them, so answers can be wrong "
                "while requests succeed (alert EPDKVLeaseExpired). Failed transfers and router `failed`: decode could "
                "not load prefill's KV (alert EPDKVTransferFailures). Router `missing`: prefill handed no KV, decode "
                "computed the prompt itself.",
            ),
        ],
    ),
    Row(
        "vLLM engines: caches, token latency, KV transfer",
        [
            Panel(
                "Multimodal processor cache hit rate",
                [
                    (
                        ratio(
                            rate("vllm:mm_cache_hits_total", by="role"), rate("vllm:mm_cache_queries_total", by="role")
                        ),
                        "{{role}}",
                    ),
                ],
                "percentunit",
                description="vLLM's own cache of preprocessed media items (vllm:mm_cache_hits / queries), per tier.",
            ),
            Panel(
                "Prompt tokens / s by source",
                [
                    (rate("vllm:prompt_tokens_by_source_total", by="role, source"), "{{role}} {{source}}"),
                ],
                "ops",
                stack=True,
                description="local_compute: prefilled here; local_cache_hit: prefix cache; external_kv_transfer: "
                "KV received from prefill (E/P/D).",
            ),
            Panel(
                "Inter-token latency (ITL) and time per output token (TPOT)",
                [
                    (quantile(0.5, "vllm:inter_token_latency_seconds_bucket", "role"), "ITL p50 {{role}}"),
                    (quantile(0.95, "vllm:inter_token_latency_seconds_bucket", "role"), "ITL p95 {{role}}"),
                    (quantile(0.95, "vllm:request_time_per_output_token_seconds_bucket", "role"), "TPOT p95 {{role}}"),
                ],
                "s",
                description="Decode speed as vLLM measures it: between two tokens, and per request.",
            ),
            Panel(
                "KV-cache usage per pod",
                [
                    (f'max by (role, pod) (vllm:kv_cache_usage_perc{{{SEL}, role!="encoder"}})', "{{role}} {{pod}}"),
                ],
                "percentunit",
                description="Share of the KV-cache blocks in use; near 1 means preemptions and queueing.",
            ),
            Panel(
                "NIXL KV transfer: bytes / s and p95 time",
                [
                    (f"sum by (role) (rate(vllm:nixl_bytes_transferred_sum{{{SEL}}}[{RATE}]))", "bytes/s {{role}}"),
                ],
                "Bps",
                description="KV moved from prefill to decode over NIXL (E/P/D with kvTransfer: Nixl).",
            ),
            Panel(
                "NIXL transfer time and failures",
                [
                    (quantile(0.95, "vllm:nixl_xfer_time_seconds_bucket", "role"), "xfer p95 {{role}}"),
                    (quantile(0.95, "vllm:nixl_post_time_seconds_bucket", "role"), "post p95 {{role}}"),
                    (rate("vllm:nixl_num_failed_transfers_total", by="role"), "failed transfers/s {{role}}"),
                    (rate("vllm:nixl_num_failed_notifications_total", by="role"), "failed notifications/s {{role}}"),
                ],
                "s",
            ),
        ],
    ),
    Row(
        "Replicas per tier",
        [
            Panel(
                "Available replicas",
                [
                    (
                        f"sum by (deployment) (kube_deployment_status_replicas_available{{{TIER_DEPLOYMENTS}}})",
                        "{{deployment}}",
                    )
                ],
                description="From kube-state-metrics.",
            ),
            Panel(
                "Desired replicas (spec and HPA)",
                [
                    (
                        f"sum by (deployment) (kube_deployment_spec_replicas{{{TIER_DEPLOYMENTS}}})",
                        "spec {{deployment}}",
                    ),
                    (
                        "sum by (horizontalpodautoscaler) (kube_horizontalpodautoscaler_status_desired_replicas"
                        '{namespace=~"$namespace", horizontalpodautoscaler=~"($epd)-.*"})',
                        "HPA {{horizontalpodautoscaler}}",
                    ),
                ],
            ),
            Panel(
                "Router endpoints available",
                [
                    (f"sum by (role) (max by (role, backend) (epd_router_endpoint_available{{{SEL}}}))", "{{role}}"),
                ],
                description="Backends each role has ready and not ejected, as the routers see them.",
            ),
        ],
    ),
    Row(
        "Operator",
        [
            Panel(
                "Reconciles / s by result",
                [
                    (
                        "sum by (kind, result) (rate(epd_operator_reconciles_total[$__rate_interval]))",
                        "{{kind}} {{result}}",
                    ),
                    ("sum(rate(epd_operator_reconcile_errors_total[$__rate_interval]))", "errors"),
                ],
                "ops",
                width=6,
            ),
            Panel(
                "Reconcile p95",
                [
                    (quantile(0.95, "epd_operator_reconcile_duration_seconds_bucket", "kind", selector=""), "{{kind}}"),
                ],
                "s",
                width=6,
            ),
            Panel(
                "EPDDeployments by phase",
                [
                    (
                        'sum by (phase) (epd_operator_deployment_phase{epd_namespace=~"$namespace", epd_name=~"$epd"})',
                        "{{phase}}",
                    ),
                ],
                width=6,
                description="From the operator: how many of the selected EPDDeployments are in each phase.",
            ),
            Panel(
                "API writes and drift repairs / s",
                [
                    (
                        "sum by (verb, kind) (rate(epd_operator_api_writes_total[$__rate_interval]))",
                        "{{verb}} {{kind}}",
                    ),
                    ("sum by (kind) (rate(epd_operator_drift_repairs_total[$__rate_interval]))", "drift {{kind}}"),
                ],
                "ops",
                width=6,
                description="Zero in steady state, Lease renewals aside.",
            ),
        ],
    ),
]


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(65 + i)}
        for i, (expr, legend) in enumerate(panel.targets)
    ]
    common = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "targets": targets,
    }
    if panel.kind == "stat":
        return {
            **common,
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "options": {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value",
                "graphMode": "area",
            },
        }
    return {
        **common,
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "custom": {
                    "fillOpacity": 10,
                    "lineWidth": 1,
                    "stacking": {"mode": "normal" if panel.stack else "none"},
                },
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {},
        "sort": 1,
        "hide": 0,
        "options": [],
        "regex": "",
    }


def build_dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = line_height = 0
        for panel in row.panels:
            if x + panel.width > 24:  # wrap onto the next line of this row
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, len(panels) + 1, x, y))
            x, line_height = x + panel.width, max(line_height, panel.height)
        y += line_height
    return {
        "title": "EPD — vLLM Encoder / Prefill / Decode",
        "uid": "epd-operator-overview",
        "description": "Router stages, time to first token, encoder reuse and queues, per-tier replicas, the operator.",
        "tags": ["epd", "vllm", "inference"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                },
                # build_info exists from a router's first scrape, before any request.
                _variable("namespace", "Namespace", "label_values(epd_router_build_info, namespace)"),
                _variable("epd", "EPDDeployment", 'label_values(epd_router_build_info{namespace=~"$namespace"}, epd)'),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build_dashboard(), indent=2, ensure_ascii=False) + "\n"
