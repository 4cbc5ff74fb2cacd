"""The live driver's transfer timer: it sleeps until the next deadline, wakes on a re-arm,
and stops when cancelled, whatever it was doing then."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from mocker.clock import WallClock
from mocker.engine.core import EngineCore
from mocker.engine.kv_stack import build_shared_tiers
from mocker.engine.transfer_timer import TransferTimer
from mocker.kv.events import AllBlocksCleared
from mocker.request import EngineRequest, SamplingParams
from mocker.storage_spec import StorageKind, StorageTierSpec
from tests.support.engines import small_config


class _Core:
    """What the timer reads of an engine: a transfer whose deadline is far off."""

    has_transfer_parts = True
    has_tier_news = False
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


BS = 16


def _two_ranks(**overrides: object) -> tuple[EngineCore, EngineCore, float]:
    """Two ranks sharing one obj tier; rank 1 has computed a 2-block prompt (its store to the
    CPU tier, then the cascade to obj, still to come). Returns them and that pass's end."""
    obj = StorageTierSpec(StorageKind.OBJ, 1024, read_gbps=8.0, write_gbps=1.0, latency_ms=1.0)
    config = small_config(block_size=BS, num_cpu_blocks=64, offload_policy="write-through",
                          storage_tiers=(obj,), **overrides)  # fmt: skip
    shared = build_shared_tiers(config)
    rank0, rank1 = (EngineCore(config, shared_tiers=shared, engine_id=k) for k in range(2))
    rank1.add_request(EngineRequest("a", list(range(32)), SamplingParams(max_tokens=1), 0.0))
    return rank0, rank1, rank1.step(0.0).end


async def _wakes_its_loop(core: EngineCore) -> bool:
    """Whether a transfer timer started on `core` asks its loop to poll at once."""
    due: list[None] = []
    timer = TransferTimer(core, WallClock(), lambda: due.append(None))
    timer.start()
    for _ in range(3):
        await asyncio.sleep(0)
    (task,) = timer.cancel()
    await asyncio.wait({task}, timeout=5)
    return due == [None]


async def test_a_copy_another_rank_ended_wakes_its_own_loop() -> None:
    # Rank 1's prompt is stored to its CPU tier and cascaded to obj; rank 0's poll reaches
    # the cascade's end first, so the record waits in rank 1's connector, and rank 1 has no
    # deadline left. Its timer still wakes its loop to take it (the metrics count the bytes
    # then, not at rank 1's next request, if one ever comes).
    rank0, rank1, now = _two_ranks()
    connector = rank1.connector
    assert connector is not None
    while connector.stores_in_flight:  # rank 1 applies its own store to the CPU tier...
        deadline = rank1.next_transfer_deadline()
        assert deadline is not None
        now = max(now, deadline)
        rank1.advance_transfers(now)
    assert connector.has_pending and not rank1.has_tier_news  # ...which cascades
    rank0.advance_transfers(now + 1.0)  # the cascade ends in rank 0's poll
    assert rank1.next_transfer_deadline() is None and rank1.has_tier_news
    assert await _wakes_its_loop(rank1)
    records = rank1.advance_transfers(now).transfers
    block_bytes = rank1.config.block_bytes
    assert [(r.src, r.dst, r.nbytes) for r in records] == [("cpu", "obj", 2 * block_bytes)]


async def test_a_shared_tier_change_another_rank_applied_wakes_the_loop() -> None:
    # With KV events on, a cascade to the shared obj tier is news to every rank (a REMOTE
    # BlockStored for those that did not store it). Rank 1 ends its own cascade in its poll;
    # rank 0, idle, has nothing in flight and no deadline, and its events wait: its timer
    # wakes its loop to publish them.
    rank0, rank1, now = _two_ranks(enable_kv_cache_events=True)
    while (deadline := rank1.next_transfer_deadline()) is not None:
        now = max(now, deadline)
        rank1.advance_transfers(now)  # its store, then its cascade, in its own polls
    assert rank0.next_transfer_deadline() is None and rank0.has_tier_news
    assert await _wakes_its_loop(rank0)
    events = rank0.advance_transfers(now).kv_events
    assert len(events) == 1 and not isinstance(events[0], AllBlocksCleared)
    assert (events[0].medium, events[0].locality) == ("STORAGE", "REMOTE")
    assert not rank0.has_tier_news
