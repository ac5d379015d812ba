"""Endpoint pickers: which encoder / prefill / decode instance gets a piece of work.

All pickers take the currently available endpoints (anything with `.key` and `.load`)
and return one, or None when there is none. Hash-based pickers use consistent hashing
with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): walk the ring clockwise from
the key and take the first endpoint whose load after this assignment stays within
ceil(load_factor * (total_load + 1) / n). With load_factor >= 1 such an endpoint always
exists, so a hot key spills to its ring successor and no key lands on an overloaded one.

A key seen before goes back to the endpoint it was given (its home: the one holding its cached
encoder output or prompt prefix) while that endpoint's in-flight load is within the bound. A new
key is placed with a bound on in-flight load *plus recent work*: the new keys this picker placed
there, decayed over the last `work_window` placements. In-flight counts alone balance only what
overlaps in time; with encoder reuse most items are short and distinct, and plain hashing then
leaves one encoder with a hash share of the distinct items well above the mean.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence
from typing import Protocol, TypeVar

from .contract import EncoderPolicy, PdPolicy

# Below the 1.25x-of-mean balance we promise: the bound is rounded up to whole items, and a
# repeated key returning home while its first request is still encoding adds work the bound did
# not see, so the factor keeps that slack in hand.
DEFAULT_LOAD_FACTOR = 1.15


class Loaded(Protocol):
    key: str

    @property
    def load(self) -> int: ...


E = TypeVar("E", bound=Loaded)


class Picker(Protocol):
    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[E] = ()) -> E | None: ...


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


def load_bound(total_load: float, n: int, load_factor: float) -> int:
    return math.ceil(load_factor * (total_load + 1) / n)


def _candidates(endpoints: Sequence[E], exclude: Collection[E]) -> Sequence[E]:
    return [e for e in endpoints if e not in exclude] if exclude else endpoints


class BoundedHashPicker:
    """cache-aware (key = media uuid) and prefix-aware (key = prompt prefix)."""

    def __init__(
        self,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        vnodes: int = 64,
        work_window: int = 1000,
        remembered_keys: int = 65536,
    ) -> None:
        if load_factor < 1:
            raise ValueError("load_factor must be >= 1")
        if work_window < 1:
            raise ValueError("work_window must be >= 1")
        self.load_factor = load_factor
        self.vnodes = vnodes
        # Decay by picks, not by time: deterministic, and idle periods do not erase the history
        # that keeps the next burst balanced. Stored lazily as (value, pick count at last update).
        self._decay = 1.0 - 1.0 / work_window
        self._picks = 0
        self._work: dict[str, tuple[float, int]] = {}
        self._homes: OrderedDict[int, str] = OrderedDict()  # key hash -> endpoint key, least recent first
        self._remembered = remembered_keys
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

    def recent_work(self, key: str) -> float:
        value, at = self._work.get(key, (0.0, self._picks))
        return value * self._decay ** (self._picks - at)

    def _record(self, key: str) -> None:
        self._work[key] = (self.recent_work(key) + 1.0, self._picks)
        self._picks += 1
        if len(self._work) > 4 * 1024:  # endpoints come and go with scaling: drop the faded ones
            self._work = {k: v for k, v in self._work.items() if self.recent_work(k) >= 1e-3}

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[E] = ()) -> E | None:
        cands = _candidates(endpoints, exclude)
        if not cands:
            return None
        key_hash = stable_hash(key or "")
        by_key = {e.key: e for e in cands}
        home = by_key.get(self._homes.get(key_hash, ""))
        if home is not None and (
            len(cands) == 1 or home.load + 1 <= load_bound(sum(e.load for e in cands), len(cands), self.load_factor)
        ):
            self._homes.move_to_end(key_hash)
            return home
        chosen = cands[0] if len(cands) == 1 else self._place(cands, by_key, key_hash)
        self._record(chosen.key)
        self._homes[key_hash] = chosen.key
        self._homes.move_to_end(key_hash)
        if len(self._homes) > self._remembered:
            self._homes.popitem(last=False)
        return chosen

    def _place(self, cands: Sequence[E], by_key: dict[str, E], key_hash: int) -> E:
        ring = self._ring_for(tuple(sorted(by_key)))
        loads = {k: e.load + self.recent_work(k) for k, e in by_key.items()}
        bound = load_bound(sum(loads.values()), len(cands), self.load_factor)
        for k in ring.walk(key_hash):
            if loads[k] + 1 <= bound:
                return by_key[k]
        return min(cands, key=lambda e: loads[e.key])  # unreachable for load_factor >= 1


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


def make_picker(policy: EncoderPolicy | PdPolicy, load_factor: float = DEFAULT_LOAD_FACTOR) -> Picker:
    if policy in ("cache-aware", "prefix-aware"):
        return BoundedHashPicker(load_factor)
    if policy == "least-loaded":
        return LeastLoadedPicker()
    if policy == "round-robin":
        return RoundRobinPicker()
    raise ValueError(f"unknown policy {policy!r}")
