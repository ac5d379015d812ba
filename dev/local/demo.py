"""`make demo`: an EPDDeployment rendered by the operator's own code, run on this machine's CPU.

Sets up what it needs on first use (the vLLM CPU venv and a tiny Qwen2-VL, cached under
~/.cache/epd-operator), renders an example, starts real vLLM for each tier plus `epd-router`,
sends an image, the same image again and a text-only request, prints what each stage did,
and stops everything.

    python -m dev.local.demo [--example examples/epd-nixl-autoscaled.yaml] [--keep-logs]

With an E/P/D example the KV moves from prefill to decode over NIXL, and the demo fails unless
vLLM's own counters show it did, with no failed transfer and no expired KV lease (`kv_transfer`).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from dev.builds import tiny_model, venv
from dev.local import kv_transfer
from dev.local.client import chat, chat_body, image_part, metric_sum, metrics, text_part
from dev.local.cpu_sizing import fit_to_cpu
from dev.local.plan import LocalPlan, PlanError
from dev.local.runner import LocalEPD, LocalRunError, load_spec, local_plan
from epd_operator.api import SpecError

REPO = Path(__file__).resolve().parents[2]
DEFAULT_EXAMPLE = REPO / "examples" / "epd-shared-storage.yaml"
STAGES = ("encode", "prefill", "decode", "total")
OUTCOMES = ("encoded", "reused", "fallback")


def say(msg: str = "") -> None:
    print(msg, flush=True)


def step(n: int, total: int, msg: str) -> None:
    say(f"\n[{n}/{total}] {msg}")


def _wrapped(argv: list[str], indent: str) -> str:
    text = " ".join(a if " " not in a else repr(a) for a in argv)
    return textwrap.fill(
        text,
        width=110,
        initial_indent=indent,
        subsequent_indent=" " * (len(indent) + 4),
        break_long_words=False,
        break_on_hyphens=False,
    )


def show_topology(plan: LocalPlan, changes: list[str]) -> None:
    say(f"  topology: {plan.topology}   model served as {plan.served_model!r}")
    for process in plan.processes:
        say(f"  - {process.role:8} {process.name}")
        say(_wrapped(process.rendered_argv, "      rendered: "))
        for note in process.deviations:
            say(f"      local:    {note}")
    say("  sized for this CPU (spec fields, before rendering): " + "; ".join(changes))


class StageClock:
    """Per-request stage latencies from the router's own histogram (difference of sums)."""

    def __init__(self, epd: LocalEPD) -> None:
        self.epd = epd
        self.last = self._read()

    def _read(self) -> dict[str, float]:
        samples = metrics(self.epd.router_url)
        sums = {labels.get("stage"): value for name, labels, value in samples if name == "epd_router_stage_seconds_sum"}
        items = {labels.get("outcome"): value for name, labels, value in samples if name == "epd_router_items_total"}
        return {**{s: sums.get(s, 0.0) for s in STAGES}, **{o: items.get(o, 0.0) for o in OUTCOMES}}

    def lap(self) -> dict[str, float]:
        now = self._read()
        delta = {k: now[k] - self.last[k] for k in now}
        self.last = now
        return delta


def run_requests(epd: LocalEPD) -> list[tuple[str, dict[str, float], int]]:
    clock = StageClock(epd)
    requests: list[tuple[str, list[dict] | str]] = [
        ("image", [text_part("What is in this picture?"), image_part(7)]),
        ("same image again", [text_part("And now?"), image_part(7)]),
        ("text only", "Say hello to the encoder."),
    ]
    results = []
    for label, content in requests:
        reply = chat(epd.router_url, chat_body(epd.plan.served_model, content))
        if not reply.ok:
            raise LocalRunError(f"request {label!r} failed: {reply}")
        results.append((label, clock.lap(), reply.completion_tokens))
        say(f"  - {label:17} HTTP {reply.status}, {reply.completion_tokens} tokens in {reply.seconds * 1000:.0f} ms")
    return results


def summary(epd: LocalEPD, results: list[tuple[str, dict[str, float], int]]) -> None:
    decode = "PD" if epd.plan.topology == "E+PD" else "decode"
    head = f"  {'request':17} {'encode':>8} {'prefill':>8} {decode:>8} {'total':>8}   media items"
    say(head)
    say("  " + "-" * (len(head) - 2))
    for label, lap, _ in results:
        ms = {s: f"{lap[s] * 1000:.0f} ms" if lap[s] >= 0.0005 else "-" for s in STAGES}
        items = ", ".join(f"{int(lap[o])} {o}" for o in OUTCOMES if lap[o]) or "none"
        say(f"  {label:17} {ms['encode']:>8} {ms['prefill']:>8} {ms['decode']:>8} {ms['total']:>8}   {items}")
    encoded = metric_sum(epd.router_url, "epd_router_items_total", outcome="encoded")
    reused = metric_sum(epd.router_url, "epd_router_items_total", outcome="reused")
    served = {
        role: metric_sum(epd.url(role), "vllm:request_success_total")
        for role in ("encoder", "prefill", "decode")
        if epd.plan.of_role(role)
    }
    say(f"\n  media items: {int(encoded)} encoded by the encoder, {int(reused)} reused without an encoder call")
    say("  requests finished per vLLM tier: " + ", ".join(f"{role} {int(n)}" for role, n in served.items()))
    say("  (the tiny model has random weights: its answers are noise; the pipeline is the point)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--example", type=Path, default=DEFAULT_EXAMPLE, help="EPDDeployment YAML to run")
    parser.add_argument("--keep-logs", action="store_true", help="keep the vLLM and router logs afterwards")
    args = parser.parse_args(argv)
    # Ctrl-C and `kill` both unwind through run_local's cleanup.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    total = 5
    say("epd-operator demo: real vLLM encoder / prefill / decode on this CPU, no GPU or cluster needed")
    started = time.monotonic()
    step(1, total, f"vLLM {venv.VLLM_VERSION} CPU venv: {venv.VENV}")
    say("  cached" if venv.is_ready() else "  building it once (a few minutes; pip's progress follows)")
    venv.ensure()
    step(2, total, f"tiny random-weight Qwen2-VL: {tiny_model.MODEL_DIR}")
    say("  cached" if tiny_model.is_ready() else "  building it once (seconds)")
    tiny_model.ensure()

    step(
        3,
        total,
        f"render {args.example.relative_to(REPO) if args.example.is_relative_to(REPO) else args.example}"
        " with the operator's render()",
    )
    spec, changes = fit_to_cpu(load_spec(args.example))
    workdir = Path(tempfile.mkdtemp(prefix="epd-demo-"))
    ok = False
    try:
        plan = local_plan(spec, workdir)
        show_topology(plan, changes)
        step(4, total, "start every tier as a local process (about 30-60 s on 2 cores)")
        with LocalEPD(plan, workdir, progress=lambda m: say(f"  {m}")) as epd:
            epd.start()
            step(5, total, f"requests through the router at {epd.router_url}")
            kv_before = kv_transfer.read(epd) if epd.plan.of_role("prefill") else None
            results = run_requests(epd)
            say("\nSummary")
            summary(epd, results)
            if kv_before is not None:
                moved = kv_transfer.read(epd).since(kv_before)
                say(f"  KV prefill -> decode over NIXL (vLLM's metrics): {moved.line()}")
                if moved.problems():
                    raise LocalRunError("KV transfer over NIXL went wrong: " + "; ".join(moved.problems()))
            say("\nstopping every process ...")
        ok = True
        say(f"done in {time.monotonic() - started:.0f} s. Next: `make test`, or deploy to a cluster (README).")
        return 0
    except (LocalRunError, PlanError, SpecError) as exc:
        say(f"\ndemo failed: {exc}")
        return 1
    except KeyboardInterrupt:
        say("\ninterrupted: every process it started has been stopped")
        return 130
    finally:
        if ok and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            say(f"logs kept in {workdir / 'logs'}")


if __name__ == "__main__":
    sys.exit(main())
