"""`make bench` / `make bench-quick`: run the benchmarks and write bench/results/*.md.

Every number in the results file comes from the run that wrote it. A section that cannot
run (a contender or a component missing) is written down as not measured, with why.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from . import contenders, operator_scale, overhead, routing, tracing
from .loadgen import LoadgenMissing, wrk_binary
from .procs import BENCH_NICE, commit, cpu_model, cpus, isolate
from .report import Target, targets_table

RESULTS = Path(__file__).with_name("results")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _machine(cores: list[int], prioritised: bool) -> str:
    nice = f"benchmark processes at nice {BENCH_NICE}" if prioritised else "benchmark processes at normal priority"
    return f"{len(cores)} usable cores ({cpu_model()}), {nice}, Python {platform.python_version()}, commit `{commit()}`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller matrix (about 3 minutes)")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    parser.add_argument("--out", type=Path, help="results file (default bench/results/bench[-quick].md)")
    args = parser.parse_args(argv)
    sections = args.only or list(SECTIONS)
    out = args.out or RESULTS / ("bench-quick.md" if args.quick else "bench.md")
    log_dir = Path(os.environ.get("EPD_BENCH_LOGS", "/tmp")) / f"epd-bench-logs-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)

    cores = cpus()
    if len(cores) < 2 or {overhead.ROUTER_CORE, overhead.LOAD_CORE} - set(cores):
        parser.error(
            f"needs cores {overhead.ROUTER_CORE} and {overhead.LOAD_CORE} (the router gets one of its own); "
            f"this process may use {cores}"
        )
    # The harness (this process and what it starts unpinned: backends, routing client) waits most of the time;
    # keep it off the router's core.
    prioritised = isolate(overhead.LOAD_CORE)

    started = time.monotonic()
    load_before = os.getloadavg()
    bodies: list[str] = []
    all_targets: list[Target] = []

    for key in sections:
        title, measure = SECTIONS[key]
        _log(f"[bench] {title.lower()}")
        try:
            targets, body = measure(args.quick, log_dir)
        except LoadgenMissing as e:
            _log(f"[bench] {e}")
            targets, body = [Target(title.lower(), "all", "", str(e), None)], f"**Not measured:** {e}"
        except Exception:
            tb = traceback.format_exc()
            _log(tb)
            targets = [Target(title.lower(), "all", "", "section failed", None)]
            body = f"**Not measured: the section failed.**\n\n```\n{tb.strip()[-3000:]}\n```"
        all_targets += targets
        bodies.append(f"## {title}\n\n{body}")

    elapsed = time.monotonic() - started
    load_after = os.getloadavg()
    header = (
        f"# Benchmark results ({'quick' if args.quick else 'full'})\n\n"
        f"Written by `python -m bench.run{' --quick' if args.quick else ''}` on "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC in {elapsed / 60:.1f} min. Machine: {_machine(cores, prioritised)}. "
        f"Load average (1 min) before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
        "(other work on the machine shows up as noise, mostly in p99).\n\n"
        "End-to-end serving on real vLLM tiers behind each router (TTFT, req/s, encoder calls on a Zipf image "
        "workload): [bench-e2e.md](bench-e2e.md), written by `make bench-e2e`.\n\n"
        "## Targets\n\n" + targets_table(all_targets)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + "\n\n" + "\n\n".join(bodies) + "\n")
    _log(f"[bench] wrote {out} in {elapsed:.0f}s (process logs in {log_dir})")
    return 0


def _overhead_section(quick: bool, log_dir: Path) -> tuple[list[Target], str]:
    plan = overhead.QUICK if quick else overhead.FULL
    wrk_binary()
    result = overhead.run(plan, contenders.ALL, log_dir, progress=_log)
    return overhead.targets(result), f"{_overhead_intro(plan)}\n\n{overhead.markdown(result)}"


def _routing_section(quick: bool, log_dir: Path) -> tuple[list[Target], str]:
    result = routing.run(routing.QUICK if quick else routing.FULL, log_dir, progress=_log)
    return routing.targets(result), routing.markdown(result)


def _operator_section(quick: bool, log_dir: Path) -> tuple[list[Target], str]:
    result = operator_scale.run(operator_scale.QUICK if quick else operator_scale.FULL, log_dir, progress=_log)
    return operator_scale.targets(result), operator_scale.markdown(result)


def _tracing_section(quick: bool, log_dir: Path) -> tuple[list[Target], str]:
    wrk_binary()
    return tracing.run(quick, log_dir, progress=_log)


def _overhead_intro(plan: overhead.Plan) -> str:
    return (
        "Fake vLLM backends (bench/backends.py: raw asyncio on uvloop, canned replies: `ec_transfer_params` from the "
        "encoder, NIXL-shaped `kv_transfer_params` from prefill, a completion or a 16-chunk SSE stream from decode). "
        f"Each router pinned to core {overhead.ROUTER_CORE}; backends and the load generator (wrk, one thread, closed "
        f"loop, {plan.seconds} s per cell after a {plan.warmup_seconds} s warm-up) share core {overhead.LOAD_CORE}. "
        "Contenders interleaved cell by cell. Router CPU is user+system time of the router's process tree over the "
        "measured seconds (ms per request = CPU seconds per 1000 requests). `load core busy` is backends + wrk CPU over "
        "wall time: near 100% means the load side, not the router, set the pace. E/P calls per request are counted by "
        "the backends (in-flight requests cut off at the end make them slightly above 1). "
        f"Contenders: " + "; ".join(f"`{c.name}`: {c.note}" for c in contenders.ALL) + "."
    )


# name on the command line: (title in the results, what measures it)
SECTIONS = {
    "overhead": ("Router overhead", _overhead_section),
    "routing": ("Routing quality", _routing_section),
    "operator": ("Operator scale", _operator_section),
    "tracing": ("Router overhead, tracing off and on", _tracing_section),
}


if __name__ == "__main__":
    sys.exit(main())
