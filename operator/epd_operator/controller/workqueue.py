"""A coalescing, keyed work queue (the semantics of client-go's workqueue).

Watch events arrive in bursts — a rollout changes a Deployment's status many times — but each
EPDDeployment needs one pass over the latest state, not one per event. So: a key waits in the
queue at most once; a key is handled by one worker at a time; a key added while it is being
handled is queued again when that pass finishes. Work comes in two levels, and a pending full
reconcile absorbs a status refresh.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

STATUS = 1  # refresh .status from the children
FULL = 2  # validate, render, apply what drifted, prune, then refresh .status


K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keyed by `K` (the operator: an EPDDeployment's (namespace, name))."""

    def __init__(self, *, base_delay: float = 0.5, max_delay: float = 60.0) -> None:
        self._ready: asyncio.Queue[K] = asyncio.Queue()
        self._pending: dict[K, int] = {}  # key -> level, for keys waiting in _ready or behind an active pass
        self._active: set[K] = set()
        self._failures: collections.Counter[K] = collections.Counter()
        self._timers: set[asyncio.TimerHandle] = set()
        self._base_delay, self._max_delay = base_delay, max_delay

    def add(self, key: K, level: int) -> None:
        waiting = key in self._pending
        self._pending[key] = max(self._pending.get(key, 0), level)
        if not waiting and key not in self._active:
            self._ready.put_nowait(key)

    def add_after(self, key: K, level: int, delay: float) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(handle)
            self.add(key, level)

        handle = loop.call_later(delay, fire)
        self._timers.add(handle)

    async def get(self) -> tuple[K, int]:
        key = await self._ready.get()
        self._active.add(key)
        return key, self._pending.pop(key)

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._pending:
            self._ready.put_nowait(key)

    def retry(self, key: K, level: int) -> float:
        """Queue a failed key again after an exponential backoff; returns the delay."""
        self._failures[key] += 1
        delay = min(self._base_delay * 2 ** (self._failures[key] - 1), self._max_delay)
        self.add_after(key, level, delay)
        return delay

    def succeeded(self, key: K) -> None:
        self._failures.pop(key, None)

    def close(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._pending)
