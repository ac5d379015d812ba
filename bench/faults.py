"""`make bench-faults`: the fault table on real pods, in figures.

The same table as tests/node/test_faults.py (tests/support/fault_table.py): two pods in every tier of
examples/epd-local-cpu.yaml on the local cluster's real node, steady chat load with never-seen images
through the router Service's ClusterIP, and the faults one after another. Writes
bench/results/faults.md (one row per fault: requests sent, failed by status or error, p99 latency,
seconds to recover, and what the row checks besides) and faults.json (every request's record). Needs
root and the real node's packages, like `make test-node`.

    python -m bench.faults                      # run it (about 30 minutes on 2 shared cores)
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

from tests.support.fault_table import FaultRecord, Row, record_document, record_from_json, run_table
from tests.support.mission import mission_cluster
from tests.support.real_node import unavailable

from .procs import commit, cpu_model

RESULTS = Path(__file__).with_name("results")

# What each row checks besides the request figures, as the report states it.
FACTS = {
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


def report(record: FaultRecord, started: datetime, wall: float, load_average: list[float], ran_at: str) -> str:
    load = record.load
    lines = [
        "# Faults on real pods (`make bench-faults`)",
        "",
        f"Run {started:%Y-%m-%d %H:%M} UTC, commit `{ran_at}`, {cpu_model()} ({platform.machine()}), load average "
        f"{load_average[0]:.1f} / {load_average[1]:.1f} / {load_average[2]:.1f} at the end; {wall / 60:.1f} min in all. "
        "Shared cores: latencies and recovery times are upper bounds.",
        "",
        "Setup: the local cluster's real node (kubelet, containerd, runc, kube-proxy, CoreDNS); "
        "`examples/epd-local-cpu.yaml` with two encoders, two prefill+decode pods and two routers (vLLM 0.32 for "
        "CPU, tiny Qwen2-VL, SharedStorage EC); the operator from its chart. Load: "
        f"{load.get('clients')} closed-loop clients, {load.get('images_per_request')} never-seen image per request, "
        f"{load.get('pause_s')} s between requests, each request a new connection to the router Service's ClusterIP "
        "from the node's network namespace. Faults one after another; a request counts for a row when it overlaps "
        "the row's window (from the fault until the cluster has recovered, plus 10 s).",
        "",
        "| fault | expectation | sent | failed | p99 latency | recovered after | also |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in record.rows:
        if "error" in row.facts:
            also = f"**did not complete**: {row.facts['error'][:200]}"
        else:
            also = FACTS[row.name](row.facts) if row.name in FACTS else ""
        p99 = f"{row.p99_ms / 1000:.2f} s" if row.p99_ms is not None else "n/a"
        recovered = f"{row.recover_s:.0f} s" if row.recover_s is not None else "n/a"
        lines.append(
            f"| {row.fault} | {row.expectation} | {row.sent} | {_failed(row)} | {p99} | {recovered} | {also} |"
        )
    failed = [r for r in record.requests if r["status"] != 200]
    lines += [
        "",
        f"All requests of the run: {len(record.requests)}, failed {len(failed)}.",
        *(f"- failed: {json.dumps(r)[:300]}" for r in failed[:10]),
        "",
        "Recovery is the time from the fault until the cluster says so: the tier's Deployment has all its pods of "
        "the current template Ready and the EPDDeployment is Ready (vLLM's start on a shared CPU sets most of it). "
        "docs/faults.md says what each row proves and which failures remain by design.",
    ]
    return "\n".join(lines) + "\n"


def write(raw: dict, out: Path) -> None:
    record = record_from_json(raw["record"])
    started = datetime.fromisoformat(raw["started"])
    text = report(
        record, started, raw["wall"], raw.get("load_average", [0.0, 0.0, 0.0]), raw.get("commit", "not recorded")
    )
    out.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "faults.md")
    parser.add_argument("--from-record", type=Path, help="write the report from a run's faults.json instead of running")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.from_record:
        write(json.loads(args.from_record.read_text()), out)
        print(f"wrote {out} from {args.from_record}", file=sys.stderr)
        return 0
    if why := unavailable():
        print(f"bench-faults: {why}", file=sys.stderr)
        return 2
    started, t, ran_at = datetime.now(UTC), time.monotonic(), commit()
    with tempfile.TemporaryDirectory(prefix="epd-bench-faults-") as tmp, mission_cluster(Path(tmp)) as m:
        record = run_table(m, Path(tmp), say=lambda line: print(line, file=sys.stderr))
    raw = record_document(record, started, t, commit=ran_at)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
    write(raw, out)
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
