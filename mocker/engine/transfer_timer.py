"""The live driver's transfer timer: one task sleeps until the KV stack's next deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from mocker.clock import WallClock
from mocker.engine.core import EngineCore

__all__ = ["TransferTimer"]


class TransferTimer:
    """Wake the engine loop when a tier transfer, a load timeout or a posted store is due.
    The task only sleeps and calls `due()` (which posts to the loop's inbox); the loop
    applies what is due and, whenever the set of transfers changed, `rearm()`s the timer
    to look at the next deadline again."""

    def __init__(self, core: EngineCore, clock: WallClock, due: Callable[[], None]) -> None:
        self._core = core
        self._clock = clock
        self._due = due
        self._rearm = asyncio.Event()
        self._version = -1
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="transfer-timer")

    def cancel(self) -> list[asyncio.Task[None]]:
        """Cancel the task; returns it (if any), for the caller to await."""
        task, self._task = self._task, None
        if task is None:
            return []
        task.cancel()
        return [task]

    def rearm(self, *, force: bool = False) -> None:
        """Called by the loop after it changed engine state: wake the timer if a transfer
        started, ended or was posted since it last looked (or `force`: the loop applied a
        deadline the timer reported, which on a channel shared with other engines may have
        moved without any change of this engine's own)."""
        core = self._core
        if core.has_transfer_parts:
            version = core.transfer_version
            if force or version != self._version:
                self._version = version
                self._rearm.set()

    async def _run(self) -> None:
        rearm = self._rearm
        core, clock = self._core, self._clock
        while True:
            rearm.clear()
            deadline = core.next_transfer_deadline()
            if core.has_tier_news:
                # Another rank's poll reached the end of a copy on a shared channel first
                # (every rank wakes at that channel's deadlines): the copy's record, if it is
                # this engine's, and the shared tier's events for this engine wait here for
                # this loop to take them (to /metrics, to the KV event stream) now.
                deadline = clock.now()
            if deadline is None:
                await rearm.wait()
                continue
            delay = deadline - clock.now()
            if delay > 0:
                # (Not wait_for: on 3.11 it loses a cancel that arrives as the wait ends,
                # and a stopped timer would then wait on forever.)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await rearm.wait()
                continue  # re-armed, or time is up: look again (timers may fire early)
            self._due()
            # The loop applies it at a time >= deadline, which changes the transfer set and
            # re-arms the timer.
            await rearm.wait()
