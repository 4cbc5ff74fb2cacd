"""A clock for the live loop that wakes late on purpose: a server that cannot keep up."""

from __future__ import annotations

import asyncio

from mocker.clock import WallClock


class LateClock(WallClock):
    """Time that moves only through the loop's sleeps, each of which wakes `late` seconds
    after its deadline (a deadline already past wakes at once). The loop still yields once
    per sleep, so consumers run between passes, as on the wall clock (whose place it takes:
    a subclass, as the live engine's clock is typed)."""

    __slots__ = ("late", "t")

    def __init__(self, late: float) -> None:
        self.late = late
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(0)
        if deadline > self.t:
            self.t = deadline + self.late
