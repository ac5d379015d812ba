"""Encoder-cache directories as vLLM's shared-storage connector leaves them, for the janitor's tests.

Time is controlled with os.utime: an entry is stamped `age` seconds before NOW, in whole seconds, so mtime
rounding cannot move an entry across the TTL.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hypothesis import strategies as st

from epd_operator.janitor import CACHE_FILE

NOW = float(int(time.time()))  # near real time: the janitor's own deletions stamp directories with it

TTL = 600


def put(root: Path, mm_hash: str, age: float, size: int = 100, *, file: bool = True) -> Path:
    """A cache entry as vLLM leaves it, last written `age` seconds before NOW."""
    entry = root / mm_hash
    entry.mkdir()
    if file:
        data = entry / CACHE_FILE
        data.write_bytes(b"x" * size)
        os.utime(data, (NOW - age, NOW - age))
    os.utime(entry, (NOW - age, NOW - age))
    return entry


def names(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()}


def holding(root: Path) -> set[str]:
    """Entries that still hold something (a deleted entry's directory stays, empty, for a TTL)."""
    return {p.name for p in root.iterdir() if p.is_dir() and any(p.iterdir())}


ages = st.floats(min_value=0, max_value=TTL * 4, allow_nan=False)

# (age, size, has its data file) per entry
entries = st.lists(st.tuples(ages, st.integers(0, 1000), st.booleans()), max_size=30)
