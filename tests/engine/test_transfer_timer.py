"""The live driver's transfer timer: it sleeps until the next deadline, wakes on a re-arm,
and stops when cancelled, whatever it was doing then."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from mocker.clock import WallClock
from mocker.engine.transfer_timer import TransferTimer


class _Core:
    """What the timer reads of an engine: a transfer whose deadline is far off."""

    has_transfer_parts = True
    transfer_version = 0

    def next_transfer_deadline(self) -> float:
        return WallClock().now() + 60.0


async def test_a_cancel_that_arrives_as_a_rearm_wakes_the_timer_stops_it() -> None:
    due: list[None] = []
    timer = TransferTimer(cast(Any, _Core()), WallClock(), lambda: due.append(None))
    timer.start()
    await asyncio.sleep(0)  # it waits for the far deadline, or a re-arm
    await asyncio.sleep(0)
    timer.rearm(force=True)  # its wait ends...
    (task,) = timer.cancel()  # ...and it is cancelled, in the same turn of the loop
    # (asyncio.wait_for on 3.11 returned the re-arm and lost the cancel: the timer waited on.)
    done, _ = await asyncio.wait({task}, timeout=5)
    assert done == {task} and task.cancelled()
    assert due == []
