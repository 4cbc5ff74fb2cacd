"""A tier with a fixed number of block slots and LRU eviction: the CPU tier (and the model of
every tier below it that evicts by recency)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise

from mocker.kv.events import BlockRemoved, BlockStored, KVEvent, parents_first
from mocker.tiers.tier import BlockKey, Medium, StorePlan, TierBlock

__all__ = ["LruTier"]


class LruTier:
    """A `Tier` (mocker.tiers.tier) of `capacity` slots, evicting least recently used first.

    Incoming and resident blocks together never exceed the capacity.
    """

    __slots__ = ("_events", "_incoming", "_resident", "block_size", "capacity", "medium", "name",
                 "record_events")  # fmt: skip

    def __init__(
        self,
        capacity: int,
        block_size: int,
        *,
        name: str = "cpu",
        medium: Medium = Medium.CPU,
        record_events: bool = False,
    ) -> None:
        self.name = name
        self.medium = medium
        self.capacity = capacity
        self.block_size = block_size
        self.record_events = record_events
        self._resident: OrderedDict[BlockKey, TierBlock] = OrderedDict()  # LRU first
        self._incoming: dict[BlockKey, TierBlock] = {}
        self._events: list[KVEvent] = []

    # -- state --------------------------------------------------------------------------------

    @property
    def num_resident(self) -> int:
        return len(self._resident)

    @property
    def num_incoming(self) -> int:
        return len(self._incoming)

    @property
    def num_used(self) -> int:
        return len(self._resident) + len(self._incoming)

    @property
    def usage(self) -> float:
        return self.num_used / self.capacity if self.capacity else 0.0

    def __contains__(self, key: BlockKey) -> bool:
        """Resident: visible to lookups."""
        return key in self._resident

    def holds(self, key: BlockKey) -> bool:
        return key in self._resident or key in self._incoming

    def resident_keys(self) -> set[BlockKey]:
        return set(self._resident)

    def num_pinned(self) -> int:
        return sum(1 for b in self._resident.values() if b.pins)

    def pins(self) -> dict[BlockKey, int]:
        """Pin count of each pinned resident block (for checks)."""
        return {k: b.pins for k, b in self._resident.items() if b.pins}

    def lookup(self, keys: Sequence[BlockKey], start: int, stop: int) -> int:
        resident = self._resident
        n = 0
        for i in range(start, stop):
            if keys[i] not in resident:
                break
            n += 1
        return n

    # -- stores -------------------------------------------------------------------------------

    def prepare_store(self, blocks: Sequence[TierBlock]) -> StorePlan:
        """Blocks are reserved in order; the first that finds every resident block pinned
        stops the plan, and it and the rest are skipped (no room will appear before a
        load ends)."""
        plan = StorePlan()
        resident, incoming = self._resident, self._incoming
        for i, block in enumerate(blocks):
            key = block.key
            if key in resident or key in incoming:
                continue
            if len(resident) + len(incoming) >= self.capacity:
                victim = next((b for b in resident.values() if not b.pins), None)
                if victim is None:
                    plan.skipped = sum(1 for b in blocks[i:] if not self.holds(b.key))
                    break
                self._remove(victim.key)
                plan.evicted.append(victim.key)
            incoming[key] = block
            plan.keys.append(key)
        return plan

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """Within a batch a parent becomes more recent than its children, as vLLM's LRU
        touches a chain in reverse, so a chain is evicted leaf first."""
        landed = [self._incoming.pop(k) for k in keys]
        if not success:
            return
        resident = self._resident
        for block in _children_first(landed):
            resident[block.key] = block
        if self.record_events and landed:
            self._record_stored(landed)

    def _record_stored(self, blocks: list[TierBlock]) -> None:
        """One BlockStored per run of blocks that chain parent to child."""
        run: list[TierBlock] = []
        for block in blocks:
            if run and block.parent != run[-1].key:
                self._emit_run(run)
                run = []
            run.append(block)
        self._emit_run(run)

    def _emit_run(self, run: list[TierBlock]) -> None:
        tokens: list[int] = []
        for block in run:
            tokens.extend(block.token_ids)
        self._events.append(
            BlockStored(
                block_hashes=tuple(b.key for b in run),
                parent_block_hash=run[0].parent,
                token_ids=tuple(tokens),
                block_size=self.block_size,
                lora_name=run[0].lora_name,
                medium=self.medium,
            )
        )

    # -- loads --------------------------------------------------------------------------------

    def touch(self, keys: Sequence[BlockKey]) -> None:
        resident = self._resident
        for key in reversed(keys):  # the chain's root ends most recently used
            if key in resident:
                resident.move_to_end(key)

    def prepare_load(self, keys: Sequence[BlockKey]) -> None:
        """A read starts (keys in chain order): pinned, and most recently used."""
        resident = self._resident
        for key in reversed(keys):
            resident[key].pins += 1
            resident.move_to_end(key)

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        self.unpin(keys)

    def pin(self, keys: Sequence[BlockKey]) -> None:
        """Keep resident keys from eviction while they are read (a cascade), without
        touching their recency."""
        resident = self._resident
        for key in keys:
            resident[key].pins += 1

    def unpin(self, keys: Sequence[BlockKey]) -> None:
        resident = self._resident
        for key in keys:
            block = resident[key]
            if block.pins <= 0:
                raise ValueError(f"{self.name} block {key} unpinned more often than pinned")
            block.pins -= 1

    def copies(self, keys: Sequence[BlockKey]) -> list[TierBlock]:
        """Unpinned copies of these resident blocks, to store in another tier."""
        resident = self._resident
        return [TierBlock(k, (b := resident[k]).parent, b.token_ids, b.lora_name) for k in keys]

    # -- eviction and events ------------------------------------------------------------------

    def _remove(self, key: BlockKey) -> None:
        del self._resident[key]
        if self.record_events:
            self._events.append(BlockRemoved(block_hashes=(key,), medium=self.medium))

    def announce(self) -> None:
        """Record a BlockStored for every resident block, parents first (after a consumer
        was told AllBlocksCleared while this tier kept its blocks)."""
        if self.record_events and self._resident:
            for block in parents_first(
                self._resident.values(), lambda b: b.key, lambda b: b.parent
            ):
                self._emit_run([block])

    def take_events(self) -> list[KVEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events


def _children_first(blocks: list[TierBlock]) -> list[TierBlock]:
    """The blocks ordered so that every block comes after its descendants in the list."""
    pairs = list(pairwise(blocks))
    if all(a.parent == b.key for a, b in pairs):
        return blocks  # one chain, leaf first (an evict batch)
    if all(b.parent == a.key for a, b in pairs):
        return blocks[::-1]  # one chain, root first (a write-through batch)
    in_batch = {b.key for b in blocks}
    children: dict[BlockKey, list[TierBlock]] = {}
    roots: list[TierBlock] = []
    for block in blocks:
        parent = block.parent
        if parent is not None and parent in in_batch and parent != block.key:
            children.setdefault(parent, []).append(block)
        else:
            roots.append(block)
    out: list[TierBlock] = []
    stack: list[tuple[TierBlock, bool]] = [(r, False) for r in reversed(roots)]
    while stack:  # iterative post-order: chains can be thousands of blocks long
        block, expanded = stack.pop()
        if expanded:
            out.append(block)
            continue
        stack.append((block, True))
        stack.extend((c, False) for c in children.get(block.key, ()))
    return out
