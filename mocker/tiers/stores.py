"""Stores: device blocks copied to the CPU tier (slots planned, copies posted or started),
and every landed block cascaded on to the secondary tiers (vLLM 0.34's write-through)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from functools import partial
from itertools import compress
from typing import TypeAlias

from mocker.kv.block import KVBlock
from mocker.kv.hashing import BlockHash
from mocker.tiers.context import TierContext
from mocker.tiers.policy import RequestRuns
from mocker.tiers.storage import StorageTier
from mocker.tiers.tier import BlockBatch, BlockKey
from mocker.tiers.transfers import DEVICE, TransferKind

__all__ = ["Stores"]

# A store posted for a pass's end: (time, order, blocks, keys, owners, parent keys).
Posted: TypeAlias = tuple[
    float,
    int,
    list[KVBlock],
    list[BlockHash],
    "RequestRuns | None",
    "list[BlockHash | None] | None",
]


class Stores:
    """The connector's device → CPU copies (posted and in flight) and the cascades on."""

    def __init__(self, connector: TierContext) -> None:
        self._c = connector
        self.posted: list[Posted] = []  # a heap, by time and order
        self._order = 0
        # Copies in flight, by the id of their block list: device → CPU (the device blocks)
        # and CPU → secondary tiers (the CPU keys they pin).
        self.storing: dict[int, list[KVBlock]] = {}
        self.cascading: dict[int, list[BlockKey]] = {}
        # Per secondary tier: cascades in flight to it, and the CPU blocks they read.
        self.cascades: dict[str, list[int]] = {t.name: [0, 0] for t in connector.storage}
        self.stored_blocks = 0  # cumulative, for checks
        self.skipped = 0  # blocks the CPU tier had no room for (all pinned)

    def batches(self) -> list[int]:
        """Blocks in each device-to-CPU copy in flight (for checks)."""
        return [len(blocks) for blocks in self.storing.values()]

    def blocks(self) -> list[KVBlock]:
        """Device blocks whose copy to the CPU tier is in flight or posted (for checks)."""
        started = [b for blocks in self.storing.values() for b in blocks]
        return started + [b for posted in self.posted for b in posted[2]]

    def plan(
        self, blocks: Sequence[KVBlock]
    ) -> tuple[list[KVBlock], list[BlockHash], list[BlockHash | None]]:
        """Reserve CPU slots for copies of these cached blocks: the blocks to copy (not held
        there yet, and room found), their keys and their parents' keys, in their order (so
        that neither the copy's start nor its cascade looks them up again). The policy hears
        of the keys the CPU tier evicted to make room."""
        c = self._c
        cpu, pool = c.cpu, c.pool
        # (The hashes of cached device blocks name their copies: the pool reads them, from
        # `KVBlock`s, a hybrid model's chunks, or the compiled pool's ids.)
        keys = pool.store_hashes(blocks)
        parents = pool.parent_hashes(blocks)
        meta = pool.token_meta(blocks, c.block_size) if cpu.record_events else None
        # (The tokens are needed only for the Stored events when the copy lands, here and in
        # the tiers the block cascades to, which publish only if the CPU tier does.)
        if cpu.reserve_all_new(keys, parents, meta):  # (device hashes are distinct)
            return (blocks if isinstance(blocks, list) else list(blocks)), keys, parents
        if cpu.holds_all(keys):  # (a prompt's last block recomputed after its load, most)
            return [], [], []
        plan = cpu.prepare_store(BlockBatch(keys, parents, meta, unique=True))
        self.skipped += plan.skipped
        if plan.evicted:
            c.policy.cpu_evicted(plan.evicted)
        if len(plan.keys) == len(blocks):  # (then the batch's keys, in its order)
            return (blocks if isinstance(blocks, list) else list(blocks)), plan.keys, parents
        chosen = set(plan.keys)  # (a batch's keys are distinct: the plan keeps their order)
        kept = list(map(chosen.__contains__, keys))
        return list(compress(blocks, kept)), plan.keys, list(compress(parents, kept))

    def start(
        self,
        at: float,
        blocks: list[KVBlock],
        hashes: list[BlockHash] | None = None,
        owners: RequestRuns | None = None,
        parents: list[BlockHash | None] | None = None,
    ) -> None:
        """Copy the blocks (CPU slots reserved by `plan`) from `at`: now if the connector has
        been driven that far, else posted until a poll reaches it. `owners`: the policy's tag
        of the blocks (runs of them), handed back to it when a copy ends; `parents`: their
        parents' keys, if the caller has them (their cascades name them). The lists are the
        connector's from now on (copies in flight keep them)."""
        if not blocks:
            return
        c = self._c
        if hashes is None:
            hashes = c.pool.store_hashes(blocks)
        c.version += 1
        if at > c.time:
            heapq.heappush(self.posted, (at, self._order, blocks, hashes, owners, parents))
            self._order += 1
            return
        size = c.batch_size
        if len(blocks) <= size:  # one copy (most passes)
            self._start(at, blocks, hashes, owners, parents)
            return
        pieces = _cut_runs(owners, size) if owners is not None else None
        for i, lo in enumerate(range(0, len(blocks), size)):
            self._start(at, blocks[lo : lo + size], hashes[lo : lo + size],
                        None if pieces is None else pieces[i],
                        None if parents is None else parents[lo : lo + size])  # fmt: skip

    def start_posted(self) -> None:
        """The earliest posted store starts (a poll has reached its time)."""
        at, _, blocks, hashes, owners, parents = heapq.heappop(self.posted)
        self.start(at, blocks, hashes, owners, parents)

    def _start(
        self, at: float, blocks: list[KVBlock], hashes: list[BlockHash], owners: RequestRuns | None,
        parents: list[BlockHash | None] | None,
    ) -> None:  # fmt: skip
        c = self._c
        # (A transfer's callback is a partial of a method: made in C, no closure factory.)
        done = partial(self._ended, blocks, hashes, parents, at, owners)
        c.d2h.start(at, len(blocks) * c.block_bytes, done)
        self.storing[id(blocks)] = blocks

    def _ended(
        self, blocks: list[KVBlock], hashes: list[BlockHash],
        parents: list[BlockHash | None] | None, start: float, owners: RequestRuns | None,
        end: float,
    ) -> None:  # fmt: skip
        c = self._c
        c.version += 1
        del self.storing[id(blocks)]
        c.cpu.complete_store(hashes)
        c.policy.stored(blocks, owners)
        n = len(blocks)
        self.stored_blocks += n
        c.record(TransferKind.STORE, DEVICE, c.cpu.name, n, start, end)
        if c.lmcache is not None and owners:
            for _, blocks_of in owners:
                c.lmcache.store_ended(blocks_of * c.block_size, end - start)
        if c.storage:
            self._cascade(hashes, end, parents)

    def _cascade(
        self, keys: list[BlockKey], now: float, parents: list[BlockKey | None] | None = None
    ) -> None:
        """Write-through from the CPU tier to every secondary tier, in parallel; the CPU
        copies (just landed: `parents`, their parent keys, if known) are pinned until each
        copy ends."""
        c = self._c
        cpu = c.cpu
        for tier in c.storage:
            if tier.tier.record_events:
                run = tier.prepare_store(cpu.copies(keys), c.engine_id).keys
            else:
                # Without events whose copy it is matters to no one: the tier's residency
                # reserves the batch (all new and room for all, most batches) in one call.
                if parents is None:
                    parents = cpu.parents(keys)
                run = list(keys)  # (each cascade's own list: its pin and copy are named by it)
                if not tier.tier.reserve_all_new(run, parents, None):
                    batch = BlockBatch(run, parents, None, unique=True)
                    run = tier.prepare_store(batch, c.engine_id).keys
            if not run:
                continue
            cpu.pin_landed(run)
            self.cascading[id(run)] = run
            active = self.cascades[tier.name]
            active[0] += 1
            active[1] += len(run)
            done = partial(self._cascade_ended, tier, run, now)
            tier.write.start(now, len(run) * c.block_bytes, done)

    def _cascade_ended(
        self, tier: StorageTier, keys: list[BlockKey], start: float, end: float
    ) -> None:
        c = self._c
        del self.cascading[id(keys)]
        active = self.cascades[tier.name]
        active[0] -= 1
        active[1] -= len(keys)
        ok = not (tier.spec.failure_rate and tier.fails())  # (no draw without a rate)
        tier.complete_store(keys, ok)
        c.cpu.unpin(keys)
        if ok:
            c.record(TransferKind.STORE, c.cpu.name, tier.name, len(keys), start, end)
        else:
            c.counters[tier.name].cascade_failures += 1
        c.version += 1


def _cut_runs(runs: RequestRuns, size: int) -> list[RequestRuns]:
    """Runs of owners cut into pieces of `size` blocks (the last may be shorter)."""
    pieces: list[RequestRuns] = []
    piece: RequestRuns = []
    room = size
    for owner, n in runs:
        while n >= room:
            piece.append((owner, room))
            pieces.append(piece)
            piece, n, room = [], n - room, size
        if n:
            piece.append((owner, n))
            room -= n
    if piece:
        pieces.append(piece)
    return pieces
