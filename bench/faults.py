"""`make bench-faults`: the fault table on real pods, in figures.

The same table as tests/node/test_faults.py (tests/support/fault_table.py): two pods in every tier of
examples/epd-local-cpu.yaml on the local cluster's real node, steady chat load with never-seen images
through the router Service's ClusterIP, and the faults one after another; then the metric-source rows
on a deployment of their own (an autoscaled encoder tier, Prometheus and prometheus-adapter stopped for
a minute each). Writes bench/results/faults.md (one row per fault: requests sent, failed by status or
error, p99 latency, seconds to recover, and what the row checks besides) and faults.json (every run's
record, with every request). Needs root and the real node's packages, like `make test-node`.

    python -m bench.faults                      # run every row (about 50 minutes on 2 shared cores)
    python -m bench.faults --only prometheus_lost,adapter_lost
                                                # run these rows alone; faults.json keeps the other rows'
                                                # runs, and the report shows every row with its run
    python -m bench.faults --from-record PATH   # the report of a test run's faults.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.support.fault_table import (
    ALL_ROWS,
    METRIC_ROWS,
    ROWS,
    SECOND,
    Row,
    record_document,
    record_from_json,
    run_metric_rows,
    run_table,
)
from tests.support.mission import mission_cluster, remove
from tests.support.real_node import unavailable

from .procs import commit, cpu_model

RESULTS = Path(__file__).with_name("results")


def _metric_source(f: dict) -> str:
    warnings = len(f["warning_events"])
    return (
        f"status: `{f['status'][:400]}`; {warnings} Warning Event{'' if warnings == 1 else 's'} AutoscalingInactive, "
        f"{f['normal_events']} Normal AutoscalingActive; inactive {f['inactive_after_s']:.0f} s after the stop, "
        f"active again {f['active_again_after_s']:.0f} s after the restart (source away {f['outage_s']:.0f} s); "
        f"encoder replicas throughout: {', '.join(str(n) for n in f['replicas_seen'])} (before: "
        f"{f['replicas_before']}), fewest ready {f['ready_min']}; {f['spilled_items']:.0f} items spilled meanwhile"
    )


# What each row checks besides the request figures, as the report states it.
FACTS = {
    "prometheus_lost": _metric_source,
    "adapter_lost": _metric_source,
    "all_encoders_deleted": lambda f: f"{f['fallback_requests']:.0f} requests sent to the consumer raw meanwhile",
    "rolling_image_change": lambda f: (
        f"{f['generations_seen']} generations seen; {f['no_encoder_in_generation']:.0f} requests whose generation had "
        "no encoder yet went to their consumer raw"
    ),
    "missing_image": lambda f: (
        f"status: `{f['status'].strip()}`; {f['warning_events']} Warning Event; "
        f"{f['ready_encoders_while_failing']} encoders Ready meanwhile; consumers' generations meanwhile "
        f"{', '.join(f.get('consumer_generations_while_failing', [])) or '?'} (before: {f.get('generation_before', '?')}); "
        f"{f['no_encoder_in_generation']:.0f} requests sent raw to consumers whose generation had no encoder"
    ),
    "operator_killed_mid_apply": lambda f: (
        (
            f"killed with {len(f['applied_at_kill'])} objects applied and {len(f['missing_at_kill'])} not; "
            if "applied_at_kill" in f
            else ""
        )
        + f"missing {f['missing'] or 'none'}, unexpected {f['unexpected'] or 'none'}, pods per tier {f['pods_per_tier']}"
    ),
    "control_plane_restarted": lambda f: (
        f"API unavailable {f['api_down_s']} s; the operator {'restarted' if f['operator_restarted'] else 'kept running'}, "
        f"its writes after it: {f['operator_writes'] or 'none'}; {f['container_restarts']} serving container restarts"
    ),
    "kubelet_restarted": lambda f: (
        f"pods replaced: {f['pods_replaced'] or 'none'}; {f['container_restarts']} container restarts"
        + (
            f"; the new kubelet's first heartbeat {f['heartbeat_after_restart_s']} s after the restart"
            if "heartbeat_after_restart_s" in f
            else ""
        )
    ),
}


def _failed(row: Row) -> str:
    if not row.failures:
        return "0"
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(row.failed.items()))
    return f"**{row.failures}** ({kinds}; {row.failed_started_before} had started before the fault)"


def _run_line(run: dict, names: list[str]) -> str:
    la = run.get("load_average") or [0.0, 0.0, 0.0]
    started = datetime.fromisoformat(run["started"])
    rows = f"the rows {', '.join(f'`{n}`' for n in names)}" if len(names) < len(ROWS) else f"{len(names)} rows"
    commit_, cpu = run.get("commit", "not recorded"), run.get("cpu", "CPU not recorded")
    machine = run.get("machine", platform.machine())
    return (
        f"Run {started:%Y-%m-%d %H:%M} UTC, commit `{commit_}`, {cpu} ({machine}), load average {la[0]:.1f} / "
        f"{la[1]:.1f} / {la[2]:.1f} at the end; {run['wall'] / 60:.1f} min in all: {rows}."
    )


def _setup(load: dict) -> str:
    replicas = load.get("replicas") or {}
    autoscaling = load.get("encoder_autoscaling")
    pods = ", ".join(f"{n} {role}" for role, n in replicas.items())
    encoder = (
        f"; the encoder tier autoscaled by its HPA on its demand (`{autoscaling}`), read through Prometheus and "
        "prometheus-adapter (the chart's rules) in the node's network namespace"
        if autoscaling
        else ""
    )
    return (
        f"pods per tier: {pods}{encoder}; {load.get('clients')} closed-loop clients, "
        f"{load.get('images_per_request')} never-seen image per request, {load.get('pause_s')} s between requests"
    )


def report(runs: list[dict]) -> str:
    """The table of every row of these runs (faults.json's), in the table's order, each from its run."""
    records = [record_from_json(run["record"]) for run in runs]
    names = {row.name: i for i, record in enumerate(records) for row in record.rows}
    order = [n for n in ALL_ROWS if n in names] + [n for n in names if n not in ALL_ROWS]
    lines = [
        "# Faults on real pods (`make bench-faults`)",
        "",
        " ".join(_run_line(run, [r.name for r in record.rows]) for run, record in zip(runs, records, strict=True))
        + " Shared cores: latencies and recovery times are upper bounds.",
        "",
        "Setup: the local cluster's real node (kubelet, containerd, runc, kube-proxy, CoreDNS); "
        "`examples/epd-local-cpu.yaml` (vLLM 0.32 for CPU, tiny Qwen2-VL, SharedStorage EC); the operator from its "
        "chart. Load: each request a new connection to the router Service's ClusterIP from the node's network "
        "namespace. "
        + " ".join(f"Run {i + 1} ({len(record.rows)} rows): {_setup(record.load)}." for i, record in enumerate(records))
        + " Faults one after another; a request counts for a row when it overlaps the row's window (from the fault "
        "until the cluster has recovered, plus 10 s).",
        "",
        "| fault | expectation | sent | failed | p99 latency | recovered after | also |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in order:
        row = records[names[name]].row(name)
        if "error" in row.facts:
            also = f"**did not complete**: {row.facts['error'][:200]}"
        else:
            also = FACTS[row.name](row.facts) if row.name in FACTS else ""
        p99 = f"{row.p99_ms / 1000:.2f} s" if row.p99_ms is not None else "n/a"
        recovered = f"{row.recover_s:.0f} s" if row.recover_s is not None else "n/a"
        lines.append(
            f"| {row.fault} | {row.expectation} | {row.sent} | {_failed(row)} | {p99} | {recovered} | {also} |"
        )
    lines.append("")
    for i, record in enumerate(records):
        failed = [r for r in record.requests if r["status"] != 200]
        lines += [
            f"All requests of run {i + 1}: {len(record.requests)}, failed {len(failed)}.",
            *(f"- failed: {json.dumps(r)[:300]}" for r in failed[:10]),
        ]
    lines += [
        "",
        "Recovery is the time from the fault until the cluster says so: the tier's Deployment has all its pods of "
        "the current template Ready and the EPDDeployment is Ready (vLLM's start on a shared CPU sets most of it); "
        "for a metric source, until the EPDDeployment says its autoscaling is active again. docs/faults.md says "
        "what each row proves and which failures remain by design.",
    ]
    return "\n".join(lines) + "\n"


def runs_of(raw: dict) -> list[dict]:
    """The runs of a faults.json: `runs`, or the one run of a file written before runs were kept apart."""
    runs: list[dict] = raw.get("runs", [raw])
    return runs


def merged(runs: list[dict], new: dict) -> list[dict]:
    """`runs` with the rows the new run has taken out of them (runs left without rows dropped), then the new run."""
    names = {row["name"] for row in new["record"]["rows"]}
    out = []
    for run in runs:
        rows = [row for row in run["record"]["rows"] if row["name"] not in names]
        if rows:
            out.append({**run, "record": {**run["record"], "rows": rows}})
    return [*out, new]


def write(raw: dict, out: Path) -> None:
    out.write_text(report(runs_of(raw)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "faults.md")
    parser.add_argument("--from-record", type=Path, help="write the report from a run's faults.json instead of running")
    parser.add_argument(
        "--only",
        type=lambda text: tuple(text.split(",")),
        help=f"comma-separated rows to run alone (of: {', '.join(ALL_ROWS)}); the other rows stay as recorded",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.from_record:
        write(json.loads(args.from_record.read_text()), out)
        print(f"wrote {out} from {args.from_record}", file=sys.stderr)
        return 0
    only: tuple[str, ...] = args.only or ALL_ROWS
    if unknown := [n for n in only if n not in ALL_ROWS]:
        parser.error(f"no such rows: {', '.join(unknown)} (rows: {', '.join(ALL_ROWS)})")
    if why := unavailable():
        print(f"bench-faults: {why}", file=sys.stderr)
        return 2
    path = out.with_suffix(".json")
    runs = runs_of(json.loads(path.read_text())) if path.exists() and args.only else []

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    tables = [
        (rows, run)
        for rows, run in (
            (tuple(n for n in ROWS if n in only), run_table),
            (tuple(n for n in METRIC_ROWS if n in only), run_metric_rows),
        )
        if rows
    ]
    # One cluster for both tables, each on its own deployment (removed before the next one deploys).
    with tempfile.TemporaryDirectory(prefix="epd-bench-faults-") as tmp, mission_cluster(Path(tmp)) as m:
        for i, (rows, run) in enumerate(tables):
            work = Path(tmp) / f"table-{i}"
            work.mkdir()
            started, t, ran_at = datetime.now(UTC), time.monotonic(), commit()
            try:
                record = run(m, work, say, rows)
            finally:
                remove(m, m.name, SECOND)
            new = record_document(record, started, t, commit=ran_at, cpu=cpu_model(), machine=platform.machine())
            runs = merged(runs, new)
            out.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"runs": runs}, indent=1))
            out.write_text(report(runs))
            print(f"wrote {out} and {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
