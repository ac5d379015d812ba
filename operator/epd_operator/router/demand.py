"""The encoder tier's demand as the autoscalers read it (`epd_router_encoder_demand`).

What counts is encoding.py's: the media items this router wants encoded and has not finished. What the
gauge shows is the most of them at any moment of the last `window` seconds, not the count at the moment
of the scrape. A request's items are with an encoder for only part of the request (the consumer's
prefill and decode are the rest), so under a steady load the count swings between none and every
client's items several times a second, and a scrape samples one phase of that swing at random: the
autoscaler's first decision after a step then asks for a fraction of what the step needs, and the next
ones for different fractions. The peak over a window at least as long as the scrape interval sees every
burst: a step reads in full at the first scrape after it, and the reading falls `window` seconds after
the load does, which the autoscaler's scale-down stabilization (five minutes by default) dwarfs. The
unit stays items, so the load target, KEDA's activation threshold and the sum over routers read alike.
With `--workers N` each worker shows its own peak and the gauge sums them (never below the peak of the
sum). A window of 0 shows the count itself.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

REFRESH_SECONDS = 1  # how often a running EncoderDemand lets old peaks go


class _Settable(Protocol):
    def set(self, value: float) -> None: ...


class EncoderDemand:
    def __init__(self, gauge: _Settable, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.gauge = gauge
        self.window = window
        self.clock = clock
        self.now = 0  # items wanted and not finished, this moment
        self.shown = 0  # what the gauge says
        # (whole second, the most items at once in it), oldest first; seconds with no rise are left out
        self._peaks: deque[tuple[int, int]] = deque()
        gauge.set(0)

    def inc(self, n: int) -> None:
        self.now += n
        if not self.window:
            self._show(self.now)
            return
        second = math.floor(self.clock())
        if self._peaks and self._peaks[-1][0] == second:
            self._peaks[-1] = (second, max(self.now, self._peaks[-1][1]))
        else:
            self._peaks.append((second, self.now))
        self._show(max(self.now, self.shown))  # a rise shows at once; a fall waits for refresh

    def dec(self, n: int) -> None:
        self.now -= n
        if not self.window:
            self._show(self.now)
        # else the peak stands until it leaves the window (refresh)

    def refresh(self) -> None:
        """Forget the peaks older than the window; show the most items at once within it."""
        horizon = math.floor(self.clock()) - self.window
        while self._peaks and self._peaks[0][0] < horizon:
            self._peaks.popleft()
        self._show(max([self.now, *(peak for _, peak in self._peaks)]))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            self.refresh()

    def _show(self, value: int) -> None:
        if value != self.shown:
            self.shown = value
            self.gauge.set(value)
