"""The sidecar `epdctl janitor` runs: sweeps on an interval, their Prometheus metrics, a clean stop
on SIGTERM/SIGINT, and the command line."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api.quantity import quantity_bytes
from .deletion import delete_entry
from .entries import Policy, plan, scan

log = logging.getLogger("epd_operator.janitor")


@dataclass(frozen=True)
class SweepResult:
    entries: int  # entries holding data after the sweep (not counting empty directories)
    bytes: int
    deleted_entries: int
    deleted_bytes: int
    over_limit: bool
    kept_fresh: int  # chosen for deletion but written to meanwhile, so kept

    def summary(self) -> str:
        line = (
            f"sweep: deleted {self.deleted_entries} entries ({_human(self.deleted_bytes)}); "
            f"{self.entries} entries ({_human(self.bytes)}) remain"
        )
        if self.kept_fresh:
            line += f"; kept {self.kept_fresh} written to during the sweep"
        return line


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def sweep(
    root: Path, policy: Policy, now: float | None = None, stopping: Callable[[], bool] = lambda: False
) -> SweepResult:
    """One pass: scan, plan, delete. `now` is read before scanning, so anything written during the
    sweep is younger than the cutoff and survives. `stopping()` cuts a long sweep short on SIGTERM."""
    now = time.time() if now is None else now
    cutoff = now - policy.ttl_seconds
    entries = scan(root)
    decided = plan(entries, policy, now)
    deleted = freed = kept = emptied = 0
    for entry in decided.victims:
        if stopping():
            break
        gone, bytes_freed = delete_entry(entry, cutoff)
        deleted += gone
        emptied += gone and not entry.empty
        kept += not gone
        freed += bytes_freed
    total = sum(e.size for e in entries)
    over = decided.over_limit
    if policy.max_bytes is not None and total - freed > policy.max_bytes:
        over = True
    holding = sum(not e.empty for e in entries) - emptied
    return SweepResult(holding, total - freed, deleted, freed, over, kept)


# ----------------------------------------------------------------------------- metrics


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        prefix = "epd_cache_janitor"
        self.entries = Gauge(
            f"{prefix}_entries", "Cache entries holding data after the last sweep", registry=self.registry
        )
        self.bytes = Gauge(f"{prefix}_bytes", "Bytes held by the cache after the last sweep", registry=self.registry)
        self.sweeps = Counter(f"{prefix}_sweeps", "Sweeps run", registry=self.registry)
        self.errors = Counter(f"{prefix}_sweep_errors", "Sweeps that failed", registry=self.registry)
        self.deleted_entries = Counter(f"{prefix}_deleted_entries", "Entries deleted", registry=self.registry)
        self.deleted_bytes = Counter(f"{prefix}_deleted_bytes", "Bytes deleted", registry=self.registry)
        self.over_limit = Counter(
            f"{prefix}_over_limit_sweeps",
            "Sweeps that ended above --max-size because the rest is younger than the TTL",
            registry=self.registry,
        )

    def record(self, result: SweepResult) -> None:
        self.sweeps.inc()
        self.entries.set(result.entries)
        self.bytes.set(result.bytes)
        self.deleted_entries.inc(result.deleted_entries)
        self.deleted_bytes.inc(result.deleted_bytes)
        if result.over_limit:
            self.over_limit.inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on `port` from a daemon thread; the server, for `shutdown()`."""
        from prometheus_client import start_http_server

        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return server


# ----------------------------------------------------------------------------- the loop


def run_once(
    root: Path, policy: Policy, metrics: Metrics, now: float | None = None, stopping: Callable[[], bool] = lambda: False
) -> SweepResult | None:
    try:
        result = sweep(root, policy, now, stopping)
    except OSError as exc:  # a flaky volume must not kill the sidecar; the next sweep retries
        metrics.errors.inc()
        log.error("sweep failed: %s", exc)
        return None
    metrics.record(result)
    log.info(result.summary())
    if result.over_limit:
        log.warning(
            "cache holds %s, above --max-size %s, and everything left is younger than the TTL "
            "(%ss): raise maxSize or lower ttlSeconds",
            _human(result.bytes),
            _human(policy.max_bytes or 0),
            policy.ttl_seconds,
        )
    return result


class StopRequest:
    """SIGTERM/SIGINT, noted by a handler that takes no locks (an Event.set() from a signal handler
    can deadlock against the main thread's wait) and wakes the sleeping loop through a pipe."""

    def __init__(self) -> None:
        self._asked = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, *_: object) -> None:
        self._asked = True
        with contextlib.suppress(BlockingIOError):  # the pipe is full: already awake
            os.write(self._wake_w, b"x")

    def requested(self) -> bool:
        return self._asked

    def sleep(self, seconds: float) -> bool:
        """Wait up to `seconds`; True when a stop was requested."""
        if not self._asked:
            select.select([self._wake_r], [], [], seconds)
        return self._asked


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _size(text: str) -> int:
    try:
        value = quantity_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="epdctl janitor",
        description="Bound a SharedStorage encoder cache: delete entries older than the TTL, or (with "
        "--max-size) the oldest entries older than the TTL while the cache is over the size.",
    )
    parser.add_argument("--path", required=True, type=Path, help="the connector's shared_storage_path")
    parser.add_argument(
        "--ttl-seconds",
        required=True,
        type=_positive_int,
        help="minimum lifetime of an entry: none younger is ever deleted",
    )
    parser.add_argument("--max-size", type=_size, help="size bound as a Kubernetes quantity (e.g. 50Gi)")
    parser.add_argument(
        "--interval", type=_positive_int, help="seconds between sweeps (default: half the TTL, at most 60)"
    )
    parser.add_argument("--once", action="store_true", help="sweep once and exit")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s janitor: %(message)s", stream=sys.stderr)
    if not args.path.is_dir():
        log.error("--path %s is not a directory (is the shared volume mounted?)", args.path)
        sys.exit(1)
    policy = Policy(args.ttl_seconds, args.max_size)
    interval = args.interval or max(1, min(60, args.ttl_seconds // 2))
    metrics = Metrics()
    if args.metrics_port is not None:
        metrics.serve(args.metrics_port)
    stop = StopRequest()
    if not args.once:
        stop.install()
        log.info(
            "watching %s: ttl %ss, max size %s, every %ss",
            args.path,
            policy.ttl_seconds,
            _human(policy.max_bytes) if policy.max_bytes is not None else "unbounded",
            interval,
        )
    while True:
        result = run_once(args.path, policy, metrics, stopping=stop.requested)
        if args.once:
            sys.exit(0 if result is not None else 1)
        if stop.sleep(interval):
            log.info("stopping")
            return
