"""Live transfer workers: one task per link direction sleeps until that link's next deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from mocker.clock import WallClock
from mocker.engine.core import EngineCore
from mocker.tiers.transfers import Direction

__all__ = ["TransferWorkers"]


class TransferWorkers:
    """Wake the engine loop when a tier transfer is due. A worker only sleeps and calls
    `due()` (which posts to the loop's inbox); the loop applies the transfers and, whenever
    the set of transfers changed, `rearm()`s the workers to look at the deadlines again."""

    def __init__(self, core: EngineCore, clock: WallClock, due: Callable[[], None]) -> None:
        self._core = core
        self._clock = clock
        self._due = due
        self._rearm = {d: asyncio.Event() for d in Direction}
        self._version = -1
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._work(d), name=f"transfer-{d.name.lower()}") for d in Direction
        ]

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the tasks; returns them, for the caller to await."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        return tasks

    def rearm(self) -> None:
        """Called by the loop after it changed engine state: wake the workers if a transfer
        started or ended since they last looked."""
        connector = self._core.connector
        if connector is not None and connector.version != self._version:
            self._version = connector.version
            for event in self._rearm.values():
                event.set()

    async def _work(self, direction: Direction) -> None:
        rearm = self._rearm[direction]
        core, clock = self._core, self._clock
        while True:
            rearm.clear()
            deadline = core.next_transfer_deadline(direction)
            if deadline is None:
                await rearm.wait()
                continue
            delay = deadline - clock.now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(rearm.wait(), delay)
                continue  # re-armed, or time is up: look again (timers may fire early)
            self._due()
            # The loop applies it at a time >= deadline, which changes the transfer set and
            # re-arms this worker.
            await rearm.wait()
