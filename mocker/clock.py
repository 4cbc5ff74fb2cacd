"""The engine's only time sources: the wall clock (live) and a virtual clock (tests, replay)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "VirtualClock", "WallClock"]


class Clock(Protocol):
    """Seconds on a monotonic axis; drivers read it, the engine core never does."""

    def now(self) -> float: ...


class WallClock:
    """Monotonic wall time, for the live driver."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        # One absolute target per pass: the caller computes deadlines from the
        # previous deadline, so sleep overshoot does not accumulate into drift.
        # Always yield once, even when the deadline has passed: at high speedups passes end
        # before Python finishes a step, and the loop must still let consumers and new
        # requests in between passes. asyncio may also wake a timer up to its clock
        # resolution early, hence the loop.
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        while (delay := deadline - time.monotonic()) > 0:
            await asyncio.sleep(delay)


class VirtualClock:
    """Time that moves only when a driver advances it."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {t}")
        self._now = t
