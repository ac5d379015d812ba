"""What the janitor sees and decides: cache entries measured on the volume, and which of them a
policy (TTL as a minimum lifetime, an optional size bound) deletes."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

CACHE_FILE = "encoder_cache.safetensors"  # vLLM 0.32 ECExampleConnector._generate_filename_debug
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


def gone(exc: OSError) -> bool:
    """Whether `exc` says the path vanished (another janitor, or a consumer, got there first)."""
    return exc.errno in _GONE


def _measure(directory: str) -> tuple[float, int, set[str]]:
    """Newest mtime, total size and the names directly in `directory` (which may vanish mid-walk)."""
    newest = os.lstat(directory).st_mtime
    size, names = 0, set[str]()
    try:
        children = list(os.scandir(directory))
    except OSError as exc:
        if gone(exc):
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
            if gone(exc):
                continue
            raise
        newest, size = max(newest, st.st_mtime), size + st.st_size
        names.add(child.name)
    return newest, size, names


def scan(root: Path) -> list[Entry]:
    """Every cache entry under `root`, measured now."""
    entries = []
    with os.scandir(root) as items:  # closed also when an error ends the scan
        for item in items:
            if item.name.startswith(".") or item.name in NOT_ENTRIES:
                continue
            try:
                if not item.is_dir(follow_symlinks=False):
                    continue
                newest, size, names = _measure(item.path)
            except OSError as exc:
                if gone(exc):
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
