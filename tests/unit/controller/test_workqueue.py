"""The reconciler's work queue: coalescing, one pass per key at a time, backoff."""

from __future__ import annotations

import asyncio

from epd_operator.controller.workqueue import FULL, STATUS, WorkQueue


async def test_a_burst_of_events_for_one_key_becomes_one_pass():
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(10):
        queue.add("a", STATUS)
    queue.add("a", FULL)
    queue.add("b", STATUS)
    assert await queue.get() == ("a", FULL)  # the strongest level wins
    assert await queue.get() == ("b", STATUS)
    assert len(queue) == 0


async def test_a_key_added_while_being_handled_runs_again_afterwards_not_concurrently():
    queue: WorkQueue[str] = WorkQueue()
    queue.add("a", STATUS)
    key, _ = await queue.get()
    queue.add("a", FULL)
    assert queue._ready.empty()  # not handed to a second worker while the first pass runs
    queue.done(key)
    assert await queue.get() == ("a", FULL)


async def test_failures_back_off_exponentially_and_reset_on_success():
    queue: WorkQueue[str] = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [queue.retry("a", FULL) for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    assert await asyncio.wait_for(queue.get(), 1) == ("a", FULL)
    queue.succeeded("a")
    assert queue.retry("a", FULL) == 0.01
    queue.close()


async def test_the_reconcilers_backoff_starts_at_half_a_second_and_stops_growing_at_a_minute():
    queue: WorkQueue[str] = WorkQueue()
    assert [queue.retry("a", FULL) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 32, 60, 60]
    queue.close()
