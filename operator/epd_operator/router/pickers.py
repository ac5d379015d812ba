"""Endpoint pickers: which encoder / prefill / decode instance gets a piece of work.

All pickers take the currently available endpoints (anything with `.key` and `.load`)
and return one, or None when there is none. Hash-based pickers use consistent hashing
with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): walk the ring clockwise from
the key and take the first endpoint whose load after this assignment stays within
ceil(load_factor * (total_load + 1) / n). With load_factor >= 1 such an endpoint always
exists, so a hot key spills to its ring successor and no key lands on an overloaded one.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Collection, Iterator, Sequence
from typing import Protocol, TypeVar


class Loaded(Protocol):
    key: str

    @property
    def load(self) -> int: ...


E = TypeVar("E", bound=Loaded)


def stable_hash(text: str) -> int:
    # Python's hash() is salted per process; workers and router replicas must agree.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, keys: Sequence[str], vnodes: int = 64) -> None:
        points = sorted((stable_hash(f"{key}#{v}"), key) for key in keys for v in range(vnodes))
        self._hashes = [h for h, _ in points]
        self._keys = [k for _, k in points]
        self._distinct = len(set(keys))

    def walk(self, key_hash: int) -> Iterator[str]:
        """Distinct endpoint keys in ring order, starting at the first point >= key_hash."""
        n = len(self._keys)
        if not n:
            return
        start = bisect.bisect_left(self._hashes, key_hash)
        seen: set[str] = set()
        for i in range(n):
            k = self._keys[(start + i) % n]
            if k not in seen:
                seen.add(k)
                yield k
                if len(seen) == self._distinct:
                    return


def load_bound(total_load: int, n: int, load_factor: float) -> int:
    return math.ceil(load_factor * (total_load + 1) / n)


def _candidates(endpoints: Sequence[E], exclude: Collection[E]) -> Sequence[E]:
    return [e for e in endpoints if e not in exclude] if exclude else endpoints


class BoundedHashPicker:
    """cache-aware (key = media uuid) and prefix-aware (key = prompt prefix)."""

    def __init__(self, load_factor: float = 1.25, vnodes: int = 64) -> None:
        if load_factor < 1:
            raise ValueError("load_factor must be >= 1")
        self.load_factor = load_factor
        self.vnodes = vnodes
        # One picker serves several pools (prefill and decode) and exclusion sets: keep a ring
        # per endpoint set instead of rebuilding on every switch.
        self._rings: dict[tuple[str, ...], HashRing] = {}

    def _ring_for(self, keys: tuple[str, ...]) -> HashRing:
        ring = self._rings.get(keys)
        if ring is None:
            if len(self._rings) >= 32:  # endpoint sets churn with scaling: forget old ones
                self._rings.clear()
            ring = self._rings[keys] = HashRing(keys, self.vnodes)
        return ring

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[E] = ()) -> E | None:
        cands = _candidates(endpoints, exclude)
        if not cands:
            return None
        if len(cands) == 1:
            return cands[0]
        by_key = {e.key: e for e in cands}
        ring = self._ring_for(tuple(sorted(by_key)))
        bound = load_bound(sum(e.load for e in cands), len(cands), self.load_factor)
        for k in ring.walk(stable_hash(key or "")):
            e = by_key[k]
            if e.load + 1 <= bound:
                return e
        return min(cands, key=lambda e: e.load)  # unreachable for load_factor >= 1


class LeastLoadedPicker:
    def __init__(self) -> None:
        self._tiebreak = itertools.count()

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[E] = ()) -> E | None:
        cands = _candidates(endpoints, exclude)
        if not cands:
            return None
        low = min(e.load for e in cands)
        idle = [e for e in cands if e.load == low]
        # Rotate among equally loaded ones so a quiet cluster is not served by one instance.
        return idle[next(self._tiebreak) % len(idle)]


class RoundRobinPicker:
    def __init__(self) -> None:
        self._cursor = itertools.count()

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[E] = ()) -> E | None:
        cands = _candidates(endpoints, exclude)
        if not cands:
            return None
        return cands[next(self._cursor) % len(cands)]


ENCODER_POLICIES = ("cache-aware", "round-robin", "least-loaded")
PD_POLICIES = ("least-loaded", "prefix-aware", "round-robin")


def make_picker(policy: str, load_factor: float = 1.25):
    if policy in ("cache-aware", "prefix-aware"):
        return BoundedHashPicker(load_factor)
    if policy == "least-loaded":
        return LeastLoadedPicker()
    if policy == "round-robin":
        return RoundRobinPicker()
    raise ValueError(f"unknown policy {policy!r}")
