"""The shared-storage encoder-cache janitor (`epdctl janitor`), a sidecar beside each encoder.

vLLM's `ECExampleConnector` (the `SharedStorage` EC connector) writes one embedding per multimodal
item to `<path>/<mm_hash>/encoder_cache.safetensors` and never deletes anything; a consumer that
merely *checks* for an item creates `<path>/<mm_hash>/` even on a miss. Left alone the volume fills up.

Semantics
---------
- An **entry** is a `<mm_hash>` directory directly under `--path` (names starting with `.` and
  `lost+found` are not entries). Its **age** is measured from its newest mtime: the directory's own
  and that of everything inside it. Its **size** is the sum of its files' sizes.
- `--ttl-seconds` is a **guaranteed minimum lifetime**: no entry younger than the TTL is ever deleted.
  The router reuses what an encoder reported about an item only within a TTL safely below this one,
  so it never points a consumer at a file the janitor may already have removed.
- Without `--max-size`, every entry older than the TTL is deleted.
- With `--max-size`, entries are kept while the store is within the bound; when it is over, entries
  older than the TTL are deleted oldest first until it fits. If it still does not fit (what remains
  is younger than the TTL) the sweep logs a warning and counts it in
  `epd_cache_janitor_over_limit_sweeps_total`; nothing young is touched.
- Empty or partial entries (no `encoder_cache.safetensors`: a consumer's cache miss, a crashed
  write, a janitor interrupted mid-delete) older than the TTL are deleted in both modes.
- Deleting an entry takes two steps: its files go when it is chosen; its directory, now empty (and
  young again, since removing a file touches it), goes as an empty entry once a TTL has passed.
  The size bound counts file bytes, so the first step is what frees space.

Concurrency
-----------
Several encoder pods share one ReadWriteMany volume and each runs a janitor, while vLLM keeps
writing. vLLM 0.32 writes the file in place with `safetensors.torch.save_file` (create+truncate at
the final name, no temporary file, no lock), and every write advances the file's mtime, so a file
being written is always younger than the TTL. To close the gap between checking a file and removing
it, a file is first *renamed* to `<name>.janitor-deleting.<token>` in its directory, then its mtime
is checked again on the renamed inode: a writer that opened it before the rename has truncated it
by then (that sets the mtime), so the file is put back instead of deleted. vLLM runs
`os.makedirs(<path>/<mm_hash>, exist_ok=True)` and then creates the file; removing the directory
between the two would fail that write (ENOENT in the encoder). Hence the two steps above: a
directory is only removed after it has stood empty for a TTL, and with `rmdir`, which fails
harmlessly if a writer created a file meanwhile. What remains is a window of microseconds, at
the moment an entry that has been empty for a whole TTL is re-encoded. Anything that vanishes
under a janitor (another janitor got there first) is skipped. Leftover renamed files from an
interrupted janitor keep their old mtime and are collected by a later sweep. Clocks of the nodes
writing and sweeping must agree to well within the TTL (mtimes are set by the writer's side).
Several janitors may each delete some of the oldest entries in the same round; with `--max-size`
that can free a little more than strictly needed, never anything younger than the TTL.

Each sweep logs one line (entries, bytes, what it deleted). `--metrics-port` serves Prometheus
metrics. SIGTERM or SIGINT ends the loop after the current sweep; the exit status is 0.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import secrets
import select
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .api.quantity import quantity_bytes

log = logging.getLogger("epd_operator.janitor")

CACHE_FILE = "encoder_cache.safetensors"  # vLLM 0.32 ECExampleConnector._generate_filename_debug
TRASH_MARK = ".janitor-deleting."
NOT_ENTRIES = {"lost+found"}  # a filesystem's own directory at the root of an ext4 volume
_GONE = (errno.ENOENT, errno.ESTALE)  # ESTALE: NFS, when another client removed it first


@dataclass(frozen=True)
class Entry:
    path: Path
    newest_mtime: float
    size: int
    complete: bool  # holds the embedding file (a miss or a crashed write leaves none)
    empty: bool  # holds nothing at all (a consumer's miss, or its files deleted a sweep ago)

    def age(self, now: float) -> float:
        return now - self.newest_mtime


@dataclass(frozen=True)
class Policy:
    ttl_seconds: float
    max_bytes: int | None = None

    def expired(self, entry: Entry, now: float) -> bool:
        return entry.age(now) > self.ttl_seconds


@dataclass(frozen=True)
class Plan:
    victims: list[Entry]
    over_limit: bool  # the size bound cannot be met without touching entries younger than the TTL


@dataclass(frozen=True)
class SweepResult:
    entries: int  # entries holding data after the sweep (not counting empty directories)
    bytes: int
    deleted_entries: int
    deleted_bytes: int
    over_limit: bool
    kept_fresh: int  # chosen for deletion but written to meanwhile, so kept

    def summary(self) -> str:
        line = (f"sweep: deleted {self.deleted_entries} entries ({_human(self.deleted_bytes)}); "
                f"{self.entries} entries ({_human(self.bytes)}) remain")
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


# ----------------------------------------------------------------------------- scanning


def _gone(exc: OSError) -> bool:
    return exc.errno in _GONE


def _measure(directory: str) -> tuple[float, int, set[str]]:
    """Newest mtime, total size and the names directly in `directory` (which may vanish mid-walk)."""
    newest = os.lstat(directory).st_mtime
    size, names = 0, set[str]()
    try:
        children = list(os.scandir(directory))
    except OSError as exc:
        if _gone(exc):
            return newest, size, names
        raise
    for child in children:
        try:
            if child.is_dir(follow_symlinks=False):
                sub_newest, sub_size, _ = _measure(child.path)
                newest, size = max(newest, sub_newest), size + sub_size
                names.add(child.name)
                continue
            st = child.stat(follow_symlinks=False)
        except OSError as exc:
            if _gone(exc):
                continue
            raise
        newest, size = max(newest, st.st_mtime), size + st.st_size
        names.add(child.name)
    return newest, size, names


def scan(root: Path) -> list[Entry]:
    """Every cache entry under `root`, measured now."""
    entries = []
    for item in os.scandir(root):
        if item.name.startswith(".") or item.name in NOT_ENTRIES:
            continue
        try:
            if not item.is_dir(follow_symlinks=False):
                continue
            newest, size, names = _measure(item.path)
        except OSError as exc:
            if _gone(exc):
                continue
            raise
        entries.append(Entry(Path(item.path), newest, size, complete=CACHE_FILE in names, empty=not names))
    return entries


# ----------------------------------------------------------------------------- deciding


def plan(entries: Iterable[Entry], policy: Policy, now: float) -> Plan:
    """Which entries to delete. Pure: the guarantees are properties of this function."""
    entries = list(entries)
    expired = [e for e in entries if policy.expired(e, now)]
    if policy.max_bytes is None:
        return Plan(expired, over_limit=False)
    victims = [e for e in expired if not e.complete]
    remaining = sum(e.size for e in entries) - sum(e.size for e in victims)
    for entry in sorted((e for e in expired if e.complete), key=lambda e: e.newest_mtime):
        if remaining <= policy.max_bytes:
            break
        victims.append(entry)
        remaining -= entry.size
    return Plan(victims, over_limit=remaining > policy.max_bytes)


# ----------------------------------------------------------------------------- deleting


class _WrittenMeanwhile(Exception):
    """A file of the entry became younger than the cutoff: the entry is live again."""


def _original_name(name: str) -> str:
    return name.split(TRASH_MARK, 1)[0]


def _put_back(trash: str, original: str) -> None:
    try:
        os.link(trash, original)
    except FileExistsError:
        return  # a newer file took the name; ours stays as trash and ages out later
    except OSError as exc:
        if _gone(exc):
            return  # another janitor moved it on and will judge it itself
        # Filesystems without hard links: rename back unless something new took the name.
        if not os.path.lexists(original):
            os.rename(trash, original)
        return
    os.unlink(trash)


def _remove_file(path: str, cutoff: float) -> int:
    """Delete one file unless it was written after `cutoff`; the bytes freed (0 if already gone)."""
    try:
        if os.lstat(path).st_mtime > cutoff:
            raise _WrittenMeanwhile(path)
        directory, name = os.path.split(path)
        original = os.path.join(directory, _original_name(name))
        trash = f"{original}{TRASH_MARK}{secrets.token_hex(6)}"
        os.rename(path, trash)
        st = os.lstat(trash)
        if st.st_mtime > cutoff:  # a writer truncated it between our check and the rename
            _put_back(trash, original)
            raise _WrittenMeanwhile(path)
        os.unlink(trash)
        return st.st_size
    except OSError as exc:
        if _gone(exc):
            return 0
        raise


def _remove_empty_dir(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # POSIX allows either for a non-empty directory
            raise _WrittenMeanwhile(directory) from None  # a writer arrived after we listed it
        if not _gone(exc):
            raise


def _remove_contents(directory: str, cutoff: float) -> tuple[int, bool]:
    """Delete what `directory` holds, keeping the directory: (bytes freed, whether all of it went)."""
    freed, everything = 0, True
    try:
        children = list(os.scandir(directory))
    except OSError as exc:
        if _gone(exc):
            return 0, True
        raise
    for child in children:
        try:
            if child.is_dir(follow_symlinks=False):  # vLLM makes none; whatever made it, it is old
                sub_freed, sub_everything = _remove_contents(child.path, cutoff)
                freed += sub_freed
                if not sub_everything:
                    raise _WrittenMeanwhile(child.path)
                _remove_empty_dir(child.path)
            else:
                freed += _remove_file(child.path, cutoff)
        except _WrittenMeanwhile:
            everything = False
    return freed, everything


def delete_entry(entry: Entry, cutoff: float) -> tuple[bool, int]:
    """Delete an expired entry unless something in it was written after `cutoff`: (deleted, bytes freed).

    An entry with files loses its files and keeps its directory; removing them makes the directory
    young, so a later sweep removes it once it has been empty for a TTL. Only a directory that was
    empty when scanned is removed. This leaves the directory in place for a vLLM writer that has just
    run `os.makedirs(..., exist_ok=True)` for it and is about to create the file."""
    path = str(entry.path)
    if entry.empty:
        try:
            _remove_empty_dir(path)
        except _WrittenMeanwhile:
            return False, 0
        return True, 0
    freed, everything = _remove_contents(path, cutoff)
    return everything, freed


def sweep(root: Path, policy: Policy, now: float | None = None,
          stopping: Callable[[], bool] = lambda: False) -> SweepResult:
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
        self.entries = Gauge(f"{prefix}_entries", "Cache entries holding data after the last sweep",
                             registry=self.registry)
        self.bytes = Gauge(f"{prefix}_bytes", "Bytes held by the cache after the last sweep", registry=self.registry)
        self.sweeps = Counter(f"{prefix}_sweeps", "Sweeps run", registry=self.registry)
        self.errors = Counter(f"{prefix}_sweep_errors", "Sweeps that failed", registry=self.registry)
        self.deleted_entries = Counter(f"{prefix}_deleted_entries", "Entries deleted", registry=self.registry)
        self.deleted_bytes = Counter(f"{prefix}_deleted_bytes", "Bytes deleted", registry=self.registry)
        self.over_limit = Counter(f"{prefix}_over_limit_sweeps",
                                  "Sweeps that ended above --max-size because the rest is younger than the TTL",
                                  registry=self.registry)

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


def run_once(root: Path, policy: Policy, metrics: Metrics, now: float | None = None,
             stopping: Callable[[], bool] = lambda: False) -> SweepResult | None:
    try:
        result = sweep(root, policy, now, stopping)
    except OSError as exc:  # a flaky volume must not kill the sidecar; the next sweep retries
        metrics.errors.inc()
        log.error("sweep failed: %s", exc)
        return None
    metrics.record(result)
    log.info(result.summary())
    if result.over_limit:
        log.warning("cache holds %s, above --max-size %s, and everything left is younger than the TTL "
                    "(%ss): raise maxSize or lower ttlSeconds", _human(result.bytes),
                    _human(policy.max_bytes or 0), policy.ttl_seconds)
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
                    "--max-size) the oldest entries older than the TTL while the cache is over the size.")
    parser.add_argument("--path", required=True, type=Path, help="the connector's shared_storage_path")
    parser.add_argument("--ttl-seconds", required=True, type=_positive_int,
                        help="minimum lifetime of an entry: none younger is ever deleted")
    parser.add_argument("--max-size", type=_size, help="size bound as a Kubernetes quantity (e.g. 50Gi)")
    parser.add_argument("--interval", type=_positive_int,
                        help="seconds between sweeps (default: half the TTL, at most 60)")
    parser.add_argument("--once", action="store_true", help="sweep once and exit")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s janitor: %(message)s",
                        stream=sys.stderr)
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
        log.info("watching %s: ttl %ss, max size %s, every %ss", args.path, policy.ttl_seconds,
                 _human(policy.max_bytes) if policy.max_bytes is not None else "unbounded", interval)
    while True:
        result = run_once(args.path, policy, metrics, stopping=stop.requested)
        if args.once:
            sys.exit(0 if result is not None else 1)
        if stop.sleep(interval):
            log.info("stopping")
            return

if __name__ == "__main__":
    main()
