"""What the encoder demand gauge shows (router/demand.py): the most items wanted at once over the last
`window` seconds, so that a scrape at any phase of a bursty load reads the burst."""

from __future__ import annotations

import asyncio

from epd_operator.router.demand import EncoderDemand


class Gauge:
    def __init__(self) -> None:
        self.writes: list[float] = []

    def set(self, value: float) -> None:
        self.writes.append(value)

    @property
    def value(self) -> float:
        return self.writes[-1]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def demand(window: int) -> tuple[EncoderDemand, Gauge, Clock]:
    gauge, clock = Gauge(), Clock()
    return EncoderDemand(gauge, window, clock), gauge, clock


def test_it_is_exported_at_zero_before_any_item():
    _, gauge, _ = demand(30)
    assert gauge.writes == [0]


def test_a_burst_shows_at_once_and_stands_for_the_window_after_it_ends():
    d, gauge, clock = demand(30)
    d.inc(2)
    d.inc(6)
    assert gauge.value == 8  # the rise shows before any refresh: the next scrape reads it
    d.dec(8)
    assert d.now == 0
    clock.t += 30
    d.refresh()
    assert gauge.value == 8  # 30 s later: still within the window
    clock.t += 1
    d.refresh()
    assert gauge.value == 0
    assert gauge.writes == [0, 2, 8, 0]


def test_a_swinging_count_reads_its_peak_whatever_the_scrape_samples():
    """Items with an encoder for part of each request: the count swings 0-8; the gauge stays at 8."""
    d, gauge, clock = demand(10)
    for _ in range(20):
        d.inc(8)
        clock.t += 0.3
        d.dec(8)
        clock.t += 0.7
        d.refresh()
        assert gauge.value == 8
    clock.t += 11
    d.refresh()
    assert gauge.value == 0


def test_the_peak_falls_to_the_highest_one_left_in_the_window():
    d, gauge, clock = demand(10)
    d.inc(6)
    d.dec(6)
    clock.t += 5
    d.inc(3)
    d.dec(3)
    clock.t += 6
    d.refresh()
    assert gauge.value == 3  # the 6 left the window, the 3 did not
    clock.t += 5
    d.refresh()
    assert gauge.value == 0


def test_items_still_wanted_show_after_their_rise_left_the_window():
    d, gauge, clock = demand(10)
    d.inc(4)  # e.g. raw items whose consumer has not answered for a minute
    clock.t += 60
    d.refresh()
    assert gauge.value == 4
    d.dec(4)
    d.refresh()
    assert gauge.value == 0


def test_a_lower_rise_in_the_same_second_keeps_that_seconds_peak():
    d, gauge, clock = demand(5)
    d.inc(5)
    d.dec(4)
    d.inc(1)  # 2 now, in the second whose peak was 5
    d.dec(2)
    clock.t += 5
    d.refresh()
    assert gauge.value == 5
    clock.t += 1
    d.refresh()
    assert gauge.value == 0


def test_window_zero_shows_the_count_itself():
    d, gauge, _ = demand(0)
    d.inc(3)
    d.dec(2)
    assert gauge.writes == [0, 3, 1]
    d.refresh()
    assert gauge.value == 1


def test_run_refreshes_every_second():
    d, gauge, clock = demand(1)

    async def main() -> None:
        d.inc(2)
        d.dec(2)
        clock.t += 5
        task = asyncio.create_task(d.run())
        for _ in range(300):
            if gauge.value == 0:
                break
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(main())
    assert gauge.value == 0


def test_one_second_keeps_one_peak_however_many_items_arrive_in_it():
    """The window holds a peak per second, not per item: a busy second costs one entry."""
    d, gauge, clock = demand(15)
    for _ in range(100):
        d.inc(1)
        d.dec(1)
    assert (len(d._peaks), gauge.value) == (1, 1)
    clock.t += 1
    d.inc(1)
    assert len(d._peaks) == 2
