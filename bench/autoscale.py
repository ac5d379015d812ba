"""`make bench-autoscale`: the encoder autoscaling loop on the local cluster's real node, measured.

The loop of tests/node/test_autoscaling_loop.py (tests/support/autoscale_loop.py): a cluster with a real
node, the operator chart, examples/epd-local-cpu.yaml with an autoscaled encoder tier, Prometheus and
prometheus-adapter (the chart's rules) in the node's network namespace, and chat clients with never-seen
images through the router Service: light load, a step, light load again. Each profile runs it twice, the
router's spill-over off and then on, each on a fresh EPDDeployment:

- `big` (the default, `make bench-autoscale`): 1 to 4 encoders at a target of 1 item per encoder and a
  step of 8 items wanted at once (tests/support/autoscale_loop.py's BIG_STEP), so that the first decision
  can ask for all 4. bench/results/autoscale.md: per run, the first scale-up decision (the replicas the
  HPA asked for and when, from its Event), the first spilled request, every needed encoder serving, the
  first new encoder's timeline, client p50/p90/p99, spilled items, failures; autoscale.png and .json.
  About 16 minutes on 2 shared cores when the node's image store holds the vLLM image, most of it vLLM
  starting.
- `small` (`--profile small`): the node test's 1 to 2 loop (`load: {targetPerPod: 4}`, 30 s scale-down
  window), the new encoder's timeline and its share of the encoder requests; autoscale-small.md.

Needs root and the real node's packages, like `make test-node`.

`--keda` runs the same loop with the KEDA engine instead (tests/node/test_keda_loop.py's loop): the
encoder tier from zero, KEDA's operator and metrics server in the node's network namespace reading the
loop's Prometheus (no prometheus-adapter). It writes bench/results/autoscale-keda.md (the seconds from
the load step's first request to an encoder serving, the woken encoder's timeline, client latency at zero,
while the tier wakes and after, the way back to zero, failed requests), autoscale-keda.png (encoder
replicas, ready encoders, KEDA's activity, the load, every request's latency) and autoscale-keda.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from tests.support.autoscale_loop import (
    BIG_STEP,
    KEDA_LOOP,
    KEDA_TIMELINE,
    TIMELINE,
    LoopConfig,
    LoopRecord,
    metrics_pipeline,
    record_from_json,
    run_loop,
    run_loops,
    start_keda,
    write_record,
)
from tests.support.mission import mission_cluster
from tests.support.real_node import unavailable

from .procs import commit, cpu_model

RESULTS = Path(__file__).with_name("results")


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _rel(record: LoopRecord, mark: str) -> str:
    t = record.marks.get(mark)
    return f"{round(t - record.marks['step_start'])} s" if t is not None else "n/a"


# The runs of each profile, the router's spill-over off, then on: `big` (`make bench-autoscale`), 1 to 4
# encoders on a step that needs all 4, and `small`, the node test's loop, 1 to 2 (its new encoder's share and
# timeline), each with the report it writes. `make bench-autoscale` runs `big` only, to stay within its time.
PROFILES = {
    "big": ((replace(BIG_STEP, spill_over=False), replace(BIG_STEP, spill_over=True)), "autoscale"),
    "small": ((LoopConfig(spill_over=False), LoopConfig(spill_over=True)), "autoscale-small"),
}
CONFIGS = PROFILES["small"][0]


def _spill(record: LoopRecord) -> str:
    return "on" if record.config.spill_over else "off"


def _window(record: LoopRecord, start: str, end: str) -> str:
    lat = record.latencies(start, end) if start in record.marks and end in record.marks else []
    if not lat:
        return "n/a"
    return f"{_pct(lat, 0.5):.2f} / {_pct(lat, 0.9):.2f} / {_pct(lat, 0.99):.2f} s ({len(lat)})"


def _first_decision(record: LoopRecord) -> str:
    """The HPA's first rescale after the step: the replicas it asked for, of those the load needs, and when."""
    if not record.decisions:
        return "n/a"
    first = record.decisions[0]
    return f"{first['size']} (the load needs {record.config.needed}), {_since_step(record, first['t'])}"


def _decisions(record: LoopRecord) -> str:
    return ", ".join(f"{d['size']} at {_since_step(record, d['t'])}" for d in record.decisions) or "n/a"


def first_spill(record: LoopRecord) -> float | None:
    """Unix time of the first media item spilled after the step (the routers' counter, as Prometheus scraped
    it every second), None when none was."""
    points = record.series.get("spilled:total") or []
    t0 = record.marks["step_start"]
    before = max((v for t, v in points if t < t0), default=0.0)
    return next((t for t, v in points if t >= t0 and v > before), None)


def _first_spill(record: LoopRecord) -> str:
    t = first_spill(record)
    if t is not None:
        return _since_step(record, t)
    return "none (spill-over off)" if not record.config.spill_over else "none"


def _new_encoders(record: LoopRecord) -> str:
    return ", ".join(_since_step(record, t) for t in sorted(record.serving.values())) or "n/a"


def _step_loads(record: LoopRecord) -> str:
    loads = [s.load for s in record.samples if s.phase == "step" and s.load is not None]
    if not loads:
        return "n/a"
    return f"{max(loads):.2f} / {statistics.median(loads):.2f} (target {record.config.target_per_pod})"


def big_rows(records: list[LoopRecord]) -> list[tuple[str, list[str]]]:
    """The rows of a step that needs several new encoders: the first decision, the first spill, every needed
    encoder serving."""
    needed = records[0].config.needed
    return [
        ("first scale-up decision: replicas asked for, seconds since the step", [_first_decision(r) for r in records]),
        ("first spilled request, seconds since the step", [_first_spill(r) for r in records]),
        (
            f"every needed encoder serving ({needed}: the first and {needed - 1} new), seconds since the step",
            [_rel(r, "all_serving") for r in records],
        ),
        ("the HPA's rescales during the step (replicas at seconds since the step)", [_decisions(r) for r in records]),
        (
            "each new encoder's first request from the router, seconds since the step",
            [_new_encoders(r) for r in records],
        ),
        *(
            (f"timeline of the first new encoder: {label}", [_since_step(r, r.timeline.get(name)) for r in records])
            for name, label in TIMELINE
        ),
        ("the HPA's reading per encoder during the step: max / median", [_step_loads(r) for r in records]),
        (
            "client p50 / p90 / p99 from the step until every needed encoder serves (requests)",
            [_window(r, "step_start", "all_serving") for r in records],
        ),
        (
            "client p50 / p90 / p99 after it, to the step's end (requests)",
            [_window(r, "all_serving", "light_after_start") for r in records],
        ),
        (
            "spilled items / requests (in the step; in the whole run)",
            [
                f"{r.spilled.get('step_items', 0):.0f} / {r.spilled.get('step_requests', 0):.0f}; "
                f"{r.spilled.get('items', 0):.0f} / {r.spilled.get('requests', 0):.0f}"
                for r in records
            ],
        ),
        ("failed client requests (target 0), of all", [f"{len(r.failures())} of {len(r.requests)}" for r in records]),
    ]


def comparison(records: list[LoopRecord]) -> list[str]:
    """One table, a column per run: what the issue's targets are measured on."""
    head = "| | " + " | ".join(f"spill-over {_spill(r)}" for r in records) + " |"
    if records[0].config.needed > 2:
        rows = big_rows(records)
        return [head, "|---" * (len(records) + 1) + "|", *(f"| {name} | " + " | ".join(v) + " |" for name, v in rows)]
    rows = [
        ("seconds from the load step to the new encoder serving", [_rel(r, "second_serving") for r in records]),
        *((f"timeline: {label}", [_since_step(r, r.timeline.get(name)) for r in records]) for name, label in TIMELINE),
        (
            "client p50 / p90 / p99 during the scale-out window (requests)",
            [_window(r, "step_start", "second_serving") for r in records],
        ),
        (
            "client p50 / p90 / p99 after it, to the step's end (requests)",
            [_window(r, "second_serving", "light_after_start") for r in records],
        ),
        (
            "new encoder's share of encoder requests in the minute after it first served (target 35-65 %)",
            [f"{100 * r.new_share():.0f}%" for r in records],
        ),
        (
            "spilled items / requests (in the step; in the whole run)",
            [
                f"{r.spilled.get('step_items', 0):.0f} / {r.spilled.get('step_requests', 0):.0f}; "
                f"{r.spilled.get('items', 0):.0f} / {r.spilled.get('requests', 0):.0f}"
                for r in records
            ],
        ),
        ("failed client requests (target 0), of all", [f"{len(r.failures())} of {len(r.requests)}" for r in records]),
    ]
    return [head, "|---" * (len(records) + 1) + "|", *(f"| {name} | " + " | ".join(v) + " |" for name, v in rows)]


def _since_step(record: LoopRecord, t: float | None) -> str:
    # whole seconds (Events have 1 s resolution): an Event in the step's own second reads 0, not -0
    return f"{round(t - record.marks['step_start'])} s" if t is not None and "step_start" in record.marks else "n/a"


def report(
    records: list[LoopRecord],
    started: datetime,
    wall: float,
    load_average: tuple[float, float, float],
    ran_at: str,
) -> str:
    c = records[0].config
    big = c.needed > 2
    title = "`make bench-autoscale`" if big else "`python -m bench.autoscale --profile small`"
    lines = [
        f"# Encoder autoscaling loop on real pods ({title})",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC, commit `{ran_at}`, {cpu_model()} ({platform.machine()}), "
        f"load average {load_average[0]:.1f} / {load_average[1]:.1f} / {load_average[2]:.1f} (1/5/15 min) at the end; "
        f"{wall / 60:.1f} min in all (cluster, images, vLLM starts, {len(records)} loops). Shared cores: times are "
        "upper bounds.",
        "",
        "Setup: the local cluster's real node; `examples/epd-local-cpu.yaml` (E+PD, vLLM 0.32 for CPU, tiny "
        f"Qwen2-VL, SharedStorage EC) with `encoder.autoscaling: {{minReplicas: 1, maxReplicas: {c.max_replicas}, "
        f"load: {{targetPerPod: {c.target_per_pod}}}, behavior: {{scaleDown: {{stabilizationWindowSeconds: "
        f"{c.scale_down_window}}}}}}}`; kube-controller-manager's HPA (1 s sync) reads `epd_router_encoder_demand` "
        "from prometheus-adapter v0.12.0 (the operator chart's rules, unchanged), which reads Prometheus scraping the "
        "router and vLLM pods every second. Clients: chat requests (4 tokens out) with 224×224 PNGs never sent "
        "before, to the router Service's ClusterIP from the node's network namespace; "
        f"light = {c.light.clients} client × {c.light.images} image, {c.light.pause:g} s between requests; "
        f"step = {c.step.clients} closed-loop clients × {c.step.images} images per request "
        f"({c.step.clients * c.step.images} items wanted at once: {c.needed} encoders needed at the target, within "
        f"maxReplicas). The loop runs once per column of the table below, each on a fresh EPDDeployment: "
        "`spec.router.spillOver.enabled` false, then true (its default bound: 2 × the target, "
        f"{2 * c.target_per_pod} items in flight per encoder).",
        "",
        "## Both runs",
        "",
        *comparison(records),
        "",
        (
            "Times are seconds since the load step. The first scale-up decision is the HPA's first SuccessfulRescale "
            "Event after the step (its time has 1 s resolution); the first spilled request, the first rise of the "
            "routers' `epd_router_spilled_items_total` (Prometheus, every second); an encoder serves when its own "
            "vLLM counter first moves (the loop's 1 s poll). p99 over fewer than 100 requests is the slowest one."
            if big
            else "Times are seconds since the load step. The scale-out window runs from the load step to the new "
            "encoder's first request from the router; p99 over fewer than 100 requests is the slowest one."
        ),
        "",
        f"![both runs: encoder replicas, ready encoders and load over time]({'autoscale' if big else 'autoscale-small'}.png)",
        "",
    ]
    for record in records:
        lines += run_report(record)
    lines += [
        "## What this shows, and what it does not",
        "",
        "- The loop closes on real pods: load through the router Service raises the routers' encoder demand, "
        "Prometheus and prometheus-adapter serve it with the chart's rules, the HPA scales the encoder "
        "Deployment, the router discovers each new encoder when it is Ready and sends it images, and the scale-down "
        "drains encoders while requests keep coming.",
        *(
            [
                "- The demand counts spilled items until the consumer answers: with spill-over on, the HPA reads the "
                "whole step while one encoder holds only its bound, so one decision can ask for every encoder the "
                "step needs (docs/autoscaling.md).",
                "- The gauge shows the most items wanted at once over the router's last `--demand-window` (15 s): "
                "with spill-over off, each request's items are with the one encoder for part of the request only, "
                "so a scrape of the count itself can fall between its batches and ask for less; the peak reads the "
                "step at any scrape.",
                "- The new encoders start side by side on the same two cores as the load, the encoder and the "
                "consumer: the time until every needed encoder serves is vLLM's start under that contention "
                "(model load, profiling each allowed image), far longer than on GPUs with pre-pulled images; the "
                "steps the operator and chart control (probes every 2 s, the router's EndpointSlice watch) add "
                "seconds.",
            ]
            if big
            else [
                "- The time to a serving second encoder is dominated by vLLM's start on a shared CPU (model load, "
                "profiling each allowed image), between the container's start and vLLM listening; the steps the "
                "operator and chart control (probes every 2 s, the router's EndpointSlice watch) add seconds. On "
                "GPUs with a real model, vLLM's start (weights, CUDA graphs) sets it too (docs/autoscaling.md says "
                "what cuts it there).",
                "- The share after the scale-up is the cache-aware picker's doing: a newcomer with nothing in flight "
                "takes new images while the old encoder is past the in-flight bound, then the hash ring shares them "
                "by recent work (router/pickers.py). Images already encoded go back to the encoder that has them.",
            ]
        ),
        f"- Spill-over moves images to the consumer while every encoder is past {2 * c.target_per_pod} items in "
        "flight: the client latency until the new encoders serve is the comparison. Here the consumer is a CPU "
        "vLLM sharing the same two cores, so encoding on it costs what encoding on the encoder costs; on GPUs it "
        "costs the consumer's decodes (docs/router.md#spill-over).",
        "- One router, one decode pod, a tiny random-weight model on CPU: the items-in-flight numbers are this "
        "machine's, not a GPU encoder's. See docs/autoscaling.md for what the default target rests on.",
    ]
    return "\n".join(lines) + "\n"


def run_report(record: LoopRecord) -> list[str]:
    """One run's section: the scale-up, the share, the scale-down, every client request."""
    c = record.config
    m = record.marks
    share = record.share_after_second()
    total = sum(share.values()) or 1.0
    phases = ("light", "step", "light_after")
    names = {"light": "light (before)", "step": "step", "light_after": "light (after, through the scale-down)"}
    down = [r for r in record.requests if r["phase"] == "light_after"]
    draining = [r for r in down if r["end"] >= m["scaled_down"] and r["start"] <= m["left_gone"]]
    step_loads = [s.load for s in record.samples if s.phase == "step" and s.load is not None]
    lines = [
        f"## Spill-over {_spill(record)}",
        "",
        "### Scale-up",
        "",
        "| event | since the load step |",
        "|---|---|",
        f"| HPA scales the encoder Deployment up (seen by the loop) | {_rel(record, 'scaled_up')} |",
        *(f"| {label} | {_since_step(record, record.timeline.get(name))} |" for name, label in TIMELINE),
        f"| **second encoder answers its first request from the router** | **{_rel(record, 'second_serving')}** |",
        *(
            [f"| **every needed encoder ({c.needed}) serving** | **{_rel(record, 'all_serving')}** |"]
            if "all_serving" in m
            else []
        ),
        "",
        f"The HPA's own reading of the load (average items in flight per encoder) during the step: max "
        f"{max(step_loads, default=float('nan')):.2f}, median {statistics.median(step_loads) if step_loads else float('nan'):.2f} "
        f"(target {c.target_per_pod}). Its conditions when the loop saw it scale up: "
        + "; ".join(
            f"{x['type']}={x['status']} ({x.get('reason')})" for x in record.scaled_up_hpa.get("conditions") or []
        )
        + f". The EPDDeployment's `AutoscalingActive`: {record.autoscaling_active.get('status')} "
        f"({record.autoscaling_active.get('reason')}).",
        "",
        "### Share of encoder requests from the second encoder's first request to the step's end",
        "",
        "vLLM's own `vllm:request_success_total` on each encoder pod (one encoder request carries the images of one "
        "client request bound for that encoder):",
        "",
        "| encoder | requests | share |",
        "|---|---|---|",
        *(
            f"| `{pod}`{' (first)' if pod == record.first_encoder else ' (new)'} | {n:.0f} | {100 * n / total:.0f}% |"
            for pod, n in sorted(share.items())
        ),
        "",
        "### Scale-down",
        "",
        f"The step ends {_rel(record, 'light_after_start')} after it started; the HPA sets 1 encoder "
        f"{m['scaled_down'] - m['light_after_start']:.0f} s later (window {c.scale_down_window} s), and the leaving "
        f"encoders (`{record.leaving_encoder or 'n/a'}`) are gone {m['left_gone'] - m['scaled_down']:.0f} s after that "
        f"(preStop, then vLLM's shutdown). **Failed client requests during the scale-down: "
        f"{sum(1 for r in draining if r['status'] != 200)} of {len(draining)}** (requests in flight between the HPA's 1 "
        f"and the leaving pod's end); in the whole light-after phase {sum(1 for r in down if r['status'] != 200)} of "
        f"{len(down)}.",
        "",
        "### Every client request",
        "",
        "| phase | requests | failed | p50 latency | p90 latency | p99 latency |",
        "|---|---|---|---|---|---|",
    ]
    for phase in phases:
        rs = [r for r in record.requests if r["phase"] == phase]
        lat = [r["end"] - r["start"] for r in rs if r["status"] == 200]
        lines.append(
            f"| {names[phase]} | {len(rs)} | {sum(1 for r in rs if r['status'] != 200)} | "
            f"{_pct(lat, 0.5):.2f} s | {_pct(lat, 0.9):.2f} s | {_pct(lat, 0.99):.2f} s |"
        )
    failures = record.failures()
    lines += [
        f"| **all** | {len(record.requests)} | **{len(failures)}** | | | |",
        "",
        *(f"- failed: {json.dumps(r)[:300]}" for r in failures[:10]),
        "",
    ]
    return lines


def plot(records: list[LoopRecord], path: Path) -> None:
    """A column per run: encoder replicas and ready encoders; items in flight per encoder and the HPA's
    load; vLLM's queue; over seconds since the load step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(3, len(records), figsize=(7 * len(records), 8), sharex="col", squeeze=False)
    for col, record in enumerate(records):
        axes = grid[:, col]
        t0 = record.marks["step_start"]
        s = record.samples
        ts = [x.t - t0 for x in s]
        axes[0].step(ts, [x.replicas for x in s], where="post", label="encoder replicas (HPA)")
        axes[0].step(ts, [x.ready for x in s], where="post", label="ready encoders", linestyle="--")
        axes[0].set_ylabel("encoders")
        axes[0].set_ylim(0, record.config.max_replicas + 0.6)
        for key, points in sorted(record.series.items()):
            kind, _, pod = key.partition(":")
            if kind == "inflight":
                axes[1].plot([t - t0 for t, _ in points], [v for _, v in points], label=f"items in flight: {pod[-5:]}")
            elif kind == "waiting" and "encoder" in pod:
                axes[2].plot([t - t0 for t, _ in points], [v for _, v in points], label=f"vLLM waiting: {pod[-5:]}")
        loads = [(x.t - t0, x.load) for x in s if x.load is not None]
        axes[1].plot([t for t, _ in loads], [v for _, v in loads], "k.", markersize=3, label="HPA's load (avg per pod)")
        axes[1].axhline(record.config.target_per_pod, color="grey", linestyle=":", label="target per pod")
        axes[1].set_ylabel("encoder items in flight")
        axes[2].set_ylabel("vLLM requests waiting")
        axes[2].set_xlabel("seconds since the load step")
        lines = (("step_start", "red"), ("second_serving", "green"), ("all_serving", "darkgreen"))
        for name, color in (*lines, ("light_after_start", "red")):
            if name in record.marks:
                for ax in axes:
                    ax.axvline(record.marks[name] - t0, color=color, alpha=0.4)
        if record.decisions:
            axes[0].plot([record.decisions[0]["t"] - t0], [record.decisions[0]["size"]], "kx", label="first decision")
        if (spilled := first_spill(record)) is not None:
            axes[1].axvline(spilled - t0, color="orange", alpha=0.6, linestyle="--", label="first spilled request")
        for ax in axes:
            ax.legend(loc="upper right", fontsize=7)
        served = "every needed encoder serving" if "all_serving" in record.marks else "second encoder serving"
        axes[0].set_title(f"spill-over {_spill(record)} (red: load step on/off, green: {served})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------- the KEDA loop (--keda)


def _since(record: LoopRecord, mark: str, base: str = "step_start") -> str:
    t, t0 = record.marks.get(mark), record.marks.get(base)
    return f"{round(t - t0)} s" if t is not None and t0 is not None else "n/a"


def keda_phases(record: LoopRecord) -> list[tuple[str, str, str]]:
    """The windows client latency is reported over: (label, start mark, end mark), those the run reached."""
    windows = [
        ("light load, tier at zero (served raw by the consumer)", "light_start", "step_start"),
        (
            "step, from its first request to an encoder serving (raw, then spilled or encoded)",
            "step_start",
            "first_serving",
        ),
        ("step, after an encoder serves", "first_serving", "light_after_start"),
        ("light load, encoders still up", "light_after_start", "scaled_down"),
        ("light load, tier back at zero", "scaled_down", "load_end"),
    ]
    return [w for w in windows if w[1] in record.marks and w[2] in record.marks]


def keda_report(
    record: LoopRecord, started: datetime, wall: float, load_average: tuple[float, ...], ran_at: str
) -> str:
    c, m = record.config, record.marks
    idle, again = record.statuses.get("idle") or {}, record.statuses.get("zero_again") or {}
    drain = [
        r
        for r in record.requests
        if r["end"] >= m.get("scaled_down", float("inf")) and r["start"] <= m.get("left_gone", 0)
    ]
    step_loads = [s.load for s in record.samples if s.phase == "step" and s.load is not None]
    by_encoder = record.counts_at_step_end
    failures = record.failures()
    lines = [
        "# Encoder scale to zero with KEDA on real pods (`make bench-autoscale-keda`)",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC, commit `{ran_at}`, {cpu_model()} ({platform.machine()}), "
        f"load average {load_average[0]:.1f} / {load_average[1]:.1f} / {load_average[2]:.1f} (1/5/15 min) at the end; "
        f"{wall / 60:.1f} min in all (KEDA's start, Prometheus, the deployment, the loop). Shared cores: times are "
        "upper bounds.",
        "",
        "Setup: the local cluster's real node; `examples/epd-local-cpu.yaml` (E+PD, vLLM 0.32 for CPU, tiny "
        "Qwen2-VL, SharedStorage EC) with `encoder.autoscaling: {engine: KEDA, minReplicas: 0, maxReplicas: 2, load: "
        f"{{targetPerPod: {c.target_per_pod}}}, keda: {{pollingInterval: {c.keda_polling}, cooldownPeriod: "
        f"{c.keda_cooldown}, activationThreshold: {c.keda_activation:g}}}, behavior: {{scaleDown: "
        f"{{stabilizationWindowSeconds: {c.scale_down_window}}}}}}}`. KEDA v2.21.0's operator and metrics server "
        "(built from its Go module) run in the node's network namespace; its Prometheus trigger (the operator's "
        "rendered query: the routers' items in flight to the tier's pods plus the media items per second they sent "
        "raw) reads Prometheus scraping the router and vLLM pods every second; kube-controller-manager's HPA (1 s "
        "sync) reads KEDA's external metric. Clients: chat requests (4 tokens out) with 224×224 PNGs never sent "
        "before, to the router Service's ClusterIP from the node's network namespace; "
        f"light = {c.light.clients} client × {c.light.images} image, {c.light.pause:g} s between requests (under "
        f"the activation threshold of {c.keda_activation:g} raw item per second); step = {c.step.clients} "
        f"closed-loop clients × {c.step.images} images per request; spill-over "
        f"{'on' if c.spill_over else 'off'}.",
        "",
        "## Figures",
        "",
        "| | |",
        "|---|---|",
        f"| EPDDeployment idle, before any load | phase {idle.get('phase')}, encoder tier "
        f"{(idle.get('encoder') or {}).get('ready')} `{(idle.get('encoder') or {}).get('reason')}`, ScaledObject "
        f"Ready={(idle.get('scaled_object') or {}).get('Ready')} Active={(idle.get('scaled_object') or {}).get('Active')} |",
        f"| media items the router sent raw by the light phase's end (tier at zero) | "
        f"{record.statuses.get('raw_items_at_light_end', float('nan')):.0f} |",
        f"| **seconds from the step's first request to an encoder serving** (its vLLM counter moves) | "
        f"**{_since(record, 'first_serving')}** |",
        *(f"| timeline: {label} | {_since_step(record, record.timeline.get(name))} |" for name, label in KEDA_TIMELINE),
        f"| KEDA's HPA sets 2 encoders (seen by the loop) | {_since(record, 'scaled_up')} |",
        f"| second encoder answers its first request from the router | {_since(record, 'second_serving')} |",
        "| encoder requests each encoder answered by the step's end | "
        + (", ".join(f"`{pod}` {n:.0f}" for pod, n in sorted(by_encoder.items())) or "n/a")
        + " |",
        f"| KEDA's load per encoder during the step (its HPA's external metric): max / median | "
        f"{max(step_loads, default=float('nan')):.2f} / "
        f"{statistics.median(step_loads) if step_loads else float('nan'):.2f} (target {c.target_per_pod}) |",
        f"| step ends → tier at zero (replicas 0) | {_since(record, 'scaled_down', 'light_after_start')} |",
        f"| tier at zero → last encoder gone (preStop, vLLM's shutdown) | {_since(record, 'left_gone', 'scaled_down')} |",
        f"| EPDDeployment back at zero | phase {again.get('phase')}, encoder tier "
        f"{(again.get('encoder') or {}).get('ready')} `{(again.get('encoder') or {}).get('reason')}`; Events: "
        f"{', '.join(record.statuses.get('events') or []) or 'n/a'} |",
        f"| spilled items / requests (step; whole run) | {record.spilled.get('step_items', 0):.0f} / "
        f"{record.spilled.get('step_requests', 0):.0f}; {record.spilled.get('items', 0):.0f} / "
        f"{record.spilled.get('requests', 0):.0f} |",
        f"| failed client requests while the last encoders drained (target 0) | "
        f"{sum(1 for r in drain if r['status'] != 200)} of {len(drain)} |",
        f"| **failed client requests, whole run (target 0)** | **{len(failures)} of {len(record.requests)}** |",
        "",
        "Times are seconds since the load step's first request unless the row says otherwise.",
        "",
        "![encoder replicas, ready encoders, KEDA's activity, load and client latency](autoscale-keda.png)",
        "",
        "## Client latency",
        "",
        "| window | requests | failed | p50 | p90 | p99 |",
        "|---|---|---|---|---|---|",
    ]
    for label, start, end in keda_phases(record):
        rs = [r for r in record.requests if m[start] <= r["start"] < m[end]]
        lat = record.latencies(start, end)
        lines.append(
            f"| {label} | {len(rs)} | {sum(1 for r in rs if r['status'] != 200)} | {_pct(lat, 0.5):.2f} s | "
            f"{_pct(lat, 0.9):.2f} s | {_pct(lat, 0.99):.2f} s |"
        )
    lines += [
        "",
        *(f"- failed: {json.dumps(r)[:300]}" for r in failures[:10]),
        "",
        "p99 over fewer than 100 requests is the slowest one.",
        "",
    ]
    return "\n".join(lines) + "\n"


def keda_plot(record: LoopRecord, path: Path) -> None:
    """Encoder replicas, ready encoders and KEDA's Active; the load (KEDA's per-encoder value and the
    routers' items in flight per encoder); every client request's latency, by phase; over seconds since
    the load step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    t0 = record.marks["step_start"]
    s = record.samples
    ts = [x.t - t0 for x in s]
    axes[0].step(ts, [x.replicas for x in s], where="post", label="encoder replicas (KEDA / its HPA)")
    axes[0].step(ts, [x.ready for x in s], where="post", linestyle="--", label="ready encoders")
    axes[0].step(ts, [0.1 if x.active else None for x in s], where="post", color="grey", label="KEDA Active")
    axes[0].set_ylabel("encoders")
    axes[0].set_ylim(-0.1, 2.6)
    axes[0].legend(loc="upper right", fontsize=7)
    for key, points in sorted(record.series.items()):
        kind, _, pod = key.partition(":")
        if kind == "inflight":
            axes[1].plot([t - t0 for t, _ in points], [v for _, v in points], label=f"items in flight: {pod[-5:]}")
    loads = [(x.t - t0, x.load) for x in s if x.load is not None]
    axes[1].plot([t for t, _ in loads], [v for _, v in loads], "k.", markersize=3, label="KEDA's load (avg per pod)")
    axes[1].axhline(record.config.target_per_pod, color="grey", linestyle=":", label="target per pod")
    axes[1].set_ylabel("encoder load")
    axes[1].legend(loc="upper right", fontsize=7)
    for phase, color in (("light", "tab:blue"), ("step", "tab:red"), ("light_after", "tab:green")):
        rs = [r for r in record.requests if r["phase"] == phase]
        axes[2].scatter(
            [r["start"] - t0 for r in rs],
            [r["end"] - r["start"] for r in rs],
            s=4,
            color=color,
            label=f"{phase} ({sum(1 for r in rs if r['status'] != 200)} failed)",
        )
    axes[2].set_ylabel("client latency (s)")
    axes[2].set_xlabel("seconds since the load step")
    axes[2].legend(loc="upper right", fontsize=7)
    for name, color in (
        ("step_start", "red"),
        ("first_serving", "green"),
        ("light_after_start", "red"),
        ("scaled_down", "grey"),
    ):
        if name in record.marks:
            for ax in axes:
                ax.axvline(record.marks[name] - t0, color=color, alpha=0.4)
    axes[0].set_title(
        "KEDA, encoders from zero (red: step on/off, green: an encoder serving, grey: back to zero)", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def records_from_json(data: dict) -> list[LoopRecord]:
    """The runs of an autoscale.json: `runs` (one record each), or one `record` (a single-run file)."""
    return [record_from_json(r) for r in data["runs"]] if "runs" in data else [record_from_json(data["record"])]


def write_records(path: Path, records: list[LoopRecord], started: datetime, wall: float, ran_at: str) -> None:
    raw = {
        "started": started.isoformat(),
        "commit": ran_at or "not recorded",
        "wall": wall,
        "load_average": os.getloadavg(),
        "runs": [r.to_json() for r in records],
    }
    path.write_text(json.dumps(raw, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscale", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: bench/results/autoscale.md (autoscale-keda.md with --keda)")
    parser.add_argument(
        "--from-record", type=Path, help="write the report and plot from a run's autoscale.json instead of running"
    )
    parser.add_argument("--keda", action="store_true", help="the KEDA engine's loop: encoders from zero and back")
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="big",
        help="big (`make bench-autoscale`): 1 to 4 encoders on a step that needs 4, writes autoscale.md; small: the "
        "node test's 1 to 2 loop, writes autoscale-small.md",
    )
    args = parser.parse_args(argv)
    configs, stem = PROFILES[args.profile]
    out: Path = args.out or RESULTS / ("autoscale-keda.md" if args.keda else f"{stem}.md")
    if args.from_record:
        data = json.loads(args.from_record.read_text())
        records = records_from_json(data)
        run = (
            datetime.fromisoformat(data["started"]),
            data["wall"],
            tuple(data["load_average"]),
            data.get("commit", "not recorded"),
        )
        if args.keda:
            [record] = records
            assert record.config.engine == "KEDA", f"{args.from_record} is a run of the {record.config.engine} engine"
            keda_plot(record, out.with_suffix(".png"))
            out.write_text(keda_report(record, *run))
        else:
            plot(records, out.with_suffix(".png"))
            out.write_text(report(records, *run))
        print(f"wrote {out} and {out.with_suffix('.png')} from {args.from_record}", file=sys.stderr)
        return 0
    if why := unavailable():
        print(f"bench-autoscale: {why}", file=sys.stderr)
        return 2
    started, t, ran_at = datetime.now(UTC), time.monotonic(), commit()
    if args.keda:
        record_path = out.with_suffix(".json")
        with tempfile.TemporaryDirectory(prefix="epd-bench-autoscale-keda-") as tmp:
            work = Path(tmp)
            with mission_cluster(work) as m:
                start_keda(m)
                with metrics_pipeline(m, work, adapter=False) as pipeline:
                    record = run_loop(m, pipeline, KEDA_LOOP, work, say=lambda line: print(line, file=sys.stderr))
        out.parent.mkdir(parents=True, exist_ok=True)
        write_record(record_path, record, started, time.monotonic() - t, ran_at)
        return main(["--keda", "--from-record", str(record_path), "--out", str(out)])
    out.parent.mkdir(parents=True, exist_ok=True)

    def done(records: list[LoopRecord]) -> None:  # after each run: a run cut short keeps the earlier ones
        write_records(out.with_suffix(".json"), records, started, time.monotonic() - t, ran_at)
        print(f"wrote {out.with_suffix('.json')} ({len(records)} of {len(configs)} runs)", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="epd-bench-autoscale-") as tmp:
        work = Path(tmp)
        with mission_cluster(work) as m, metrics_pipeline(m, work) as pipeline:
            run_loops(m, pipeline, list(configs), work, say=lambda line: print(line, file=sys.stderr), done=done)
    return main(["--from-record", str(out.with_suffix(".json")), "--out", str(out)])


if __name__ == "__main__":
    sys.exit(main())
