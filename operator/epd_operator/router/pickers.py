"""Endpoint pickers: which encoder / prefill / decode instance gets a piece of work.

All pickers take the currently available endpoints (anything with `.key` and `.load`)
and return one, or None when there is none. Hash-based pickers use consistent hashing
with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018): walk the ring clockwise from
the key and take the first endpoint whose load after this assignment stays within
ceil(load_factor * (total_load + 1) / n). With whole loads and load_factor >= 1 such an
endpoint always exists, so a hot key spills to its ring successor and no key lands on an
overloaded one. Recent work (below) is fractional: where no endpoint fits, the least loaded takes
the key, over the bound by less than one item.

A key seen before goes back to the endpoint it was given (its home: the one holding its cached
encoder output or prompt prefix) while that endpoint's in-flight load is within the bound. A new
key is placed under two bounds, each the bound above over its own quantity:

- in flight: load + 1 <= ceil(load_factor * (total in flight + 1) / n), what the endpoint is busy
  with now (a few items);
- recent work: work + 1 <= ceil(load_factor * (total recent work + 1) / n), the new keys this
  picker placed there, decayed over the last `work_window` placements (hundreds of items).

The key walks the ring to the first endpoint within both. Where none is, it goes to the endpoint
with the least recent work among those within the in-flight bound. Kept apart, neither quantity
drowns the other: added into one load, recent work (hundreds) would hide what is in flight (a
few), so an encoder with 50 items queued would still take its hash share of new images.

What this promises, with whole in-flight loads and load_factor >= 1:

1. Some endpoint is always within the in-flight bound. With total in flight t = q*n + r (0 <= r < n),
   the least loaded has at most q, and ceil((t + 1) / n) = q + 1, so its load + 1 <= the bound.
   No new key ever lands on an endpoint past the in-flight bound, and neither does a key going home.
2. After a scale-up, a newcomer with nothing in flight takes every new key while every old endpoint
   is past the in-flight bound: by 1 it is within it, and either the ring walk finds it (the only
   one within both bounds) or the fallback does (the only one within the in-flight bound). The old
   ones stay past it until the bound, which grows by load_factor / n with each key the newcomer
   takes, reaches their (only falling) loads: with two encoders, one at 50 in flight and the
   newcomer at 0, the newcomer takes the next 36 new keys before the old one takes any.
3. A steady pool, where every endpoint is within the in-flight bound (the work in flight is spread
   no worse than the bound allows), places by recent work alone: the chosen endpoint is within the
   recent-work bound, or all are within one item of it and the least loaded takes the key. Recent
   work is fractional (decayed), so that is the bound we promise: no endpoint's recent work
   exceeds load_factor times the mean by more than one item; with the default factor the busiest
   stays within 1.25x the mean once the mean is ten items or more (1.15 m + 1 <= 1.25 m).

Recent work compares endpoints that took part in the same placements, so an endpoint without that
history is brought level before a placement. One the picker has not seen (a scale-up, a pod
restarted under a new address) joins at the mean recent work of the candidates that took part in
the latest placement among them. One that missed placements those took part in (ejected, then
healthy again; left out of a retry) rejoins at the standing it had when last placed among peers
(its recent work over the mean of the others', at most load_factor) times that mean. Levelling
never lowers an endpoint's recent work, and from then on the levelled work is recent work like the
rest: the bound holds on it and it decays. So right after a scale-up the ring shares new keys
between old and new endpoints, within the bound, instead of sending them all to the one without
history until its recent work catches up. A key placed before goes home like any other.
"""

from __future__ import annotations

import bisect
import functools
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
VNODES = 64  # ring points per endpoint: spreads keys evenly over a few endpoints
REMEMBERED_KEYS = 65536  # keys whose home a bounded-hash picker remembers (oldest forgotten first)


class Loaded(Protocol):
    key: str

    @property
    def load(self) -> int: ...


E = TypeVar("E", bound=Loaded)


class Picker(Protocol):
    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[object] = ()) -> E | None: ...


def stable_hash(text: str) -> int:
    # Python's hash() is salted per process; workers and router replicas must agree.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    def __init__(self, keys: Sequence[str], vnodes: int = VNODES) -> None:
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


def _candidates(endpoints: Sequence[E], exclude: Collection[object]) -> Sequence[E]:
    return [e for e in endpoints if e not in exclude] if exclude else endpoints


class _Work:
    """One endpoint's recent work, stored lazily: `value` as of placement number `at`."""

    __slots__ = ("at", "seen", "standing", "value")

    def __init__(self, value: float, at: int, standing: float) -> None:
        self.value = value
        self.at = at
        self.seen = at  # the last placement it was a candidate of (settled when the candidates change)
        self.standing = standing  # its recent work over the mean of the other candidates' then


@functools.lru_cache(maxsize=32)  # endpoint sets churn with scaling; pools and exclusion sets are few
def ring_of(keys: tuple[str, ...], vnodes: int) -> HashRing:
    """The ring of an endpoint set: a pure function of it, shared by every picker."""
    return HashRing(keys, vnodes)


class BoundedHashPicker:
    """cache-aware (key = media uuid) and prefix-aware (key = prompt prefix)."""

    # The last placement's number and its candidates' total recent work after it: set with `_last_keys`
    # by the first placement, read only while `_last_keys` names candidates.
    _last_at: int
    _last_total: float

    def __init__(
        self,
        load_factor: float = DEFAULT_LOAD_FACTOR,
        vnodes: int = VNODES,
        work_window: int = 1000,
        remembered_keys: int = REMEMBERED_KEYS,
    ) -> None:
        if load_factor < 1:
            raise ValueError("load_factor must be >= 1")
        if work_window < 1:
            raise ValueError("work_window must be >= 1")
        self.load_factor = load_factor
        self.vnodes = vnodes
        # Decay by placements, not by time: deterministic, and idle periods do not erase the history
        # that keeps the next burst balanced.
        self._decay = 1.0 - 1.0 / work_window
        self._picks = 0  # placements so far
        self._work: dict[str, _Work] = {}
        # The last placement's candidates (none before the first).
        self._last_keys: tuple[str, ...] = ()
        self._homes: OrderedDict[int, str] = OrderedDict()  # key hash -> endpoint key, least recent first
        self._remembered = remembered_keys

    def recent_work(self, key: str) -> float:
        entry = self._work.get(key)
        return 0.0 if entry is None else entry.value * self._decay ** (self._picks - entry.at)

    def _level(self, keys: tuple[str, ...]) -> dict[str, float]:
        """Recent work of each candidate, with joining and returning endpoints brought level (module doc)."""
        picks, decay, table = self._picks, self._decay, self._work
        if keys == self._last_keys:  # every candidate took part in the last placement: nothing to level
            return {k: (w := table[k]).value * decay ** (picks - w.at) for k in keys}
        entries = {k: table.get(k) for k in keys}
        self._settle()
        latest = max((e.seen for e in entries.values() if e is not None), default=None)
        steady = [e.value * decay ** (picks - e.at) for e in entries.values() if e is not None and e.seen == latest]
        mean = sum(steady) / len(steady) if steady else 0.0
        work: dict[str, float] = {}
        for k, e in entries.items():
            if e is None:
                work[k] = mean
                table[k] = _Work(mean, picks, 1.0)
            else:
                work[k] = e.value * decay ** (picks - e.at)
                if e.seen != latest and (level := min(e.standing, self.load_factor) * mean) > work[k]:
                    work[k] = e.value = level
                    e.at = picks
        return work

    def _settle(self) -> None:
        """Mark the last placement's candidates as seen in it, with their standing among each other then."""
        keys = self._last_keys
        n = len(keys)
        for k in keys:  # every one has an entry: placed among them, kept by _record's trimming
            entry = self._work[k]
            entry.seen = self._last_at
            if n > 1:  # alone, an endpoint keeps the standing it had among peers
                value = entry.value * self._decay ** (self._last_at - entry.at)
                others = (self._last_total - value) / (n - 1)
                entry.standing = value / others if others > 0 else 1.0

    def _record(self, chosen: str, keys: tuple[str, ...], work: dict[str, float]) -> None:
        # Only the chosen one's work changes. The candidates' `seen` and `standing` are settled when a
        # placement among other candidates comes: with a steady pool, that is not on every placement.
        entry = self._work[chosen]
        entry.value, entry.at = work[chosen] + 1.0, self._picks
        self._last_keys, self._last_at, self._last_total = keys, self._picks, sum(work.values()) + 1.0
        self._picks += 1
        if len(self._work) > 4 * 1024:  # endpoints come and go with scaling: drop the faded ones
            last = set(keys)
            self._work = {k: v for k, v in self._work.items() if k in last or self.recent_work(k) >= 1e-3}

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[object] = ()) -> E | None:
        cands = _candidates(endpoints, exclude)
        if not cands:
            return None
        key_hash = stable_hash(key or "")
        by_key = {e.key: e for e in cands}
        home_key = self._homes.get(key_hash)
        home = by_key.get(home_key) if home_key else None
        if home is not None and (
            len(cands) == 1 or home.load + 1 <= load_bound(sum(e.load for e in cands), len(cands), self.load_factor)
        ):
            self._homes.move_to_end(key_hash)
            return home
        keys = tuple(sorted(by_key))  # the same sums in every router replica, whatever the endpoints' order
        work = self._level(keys)
        chosen = by_key[keys[0]] if len(keys) == 1 else self._place(by_key, keys, work, key_hash)
        self._record(chosen.key, keys, work)
        self._homes[key_hash] = chosen.key
        self._homes.move_to_end(key_hash)
        if len(self._homes) > self._remembered:
            self._homes.popitem(last=False)
        return chosen

    def _place(self, by_key: dict[str, E], keys: tuple[str, ...], work: dict[str, float], key_hash: int) -> E:
        n = len(keys)
        busy = load_bound(sum(by_key[k].load for k in keys), n, self.load_factor)
        free = [k for k in keys if by_key[k].load + 1 <= busy]  # never empty (module doc, 1)
        bound = load_bound(sum(work.values()), n, self.load_factor)
        for k in ring_of(keys, self.vnodes).walk(key_hash):
            if by_key[k].load + 1 <= busy and work[k] + 1 <= bound:
                return by_key[k]
        return by_key[min(free, key=work.__getitem__)]


class LeastLoadedPicker:
    def __init__(self) -> None:
        self._tiebreak = itertools.count()

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[object] = ()) -> E | None:
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

    def pick(self, endpoints: Sequence[E], key: str | None = None, exclude: Collection[object] = ()) -> E | None:
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
