"""A tier with a fixed number of block slots and LRU eviction: the CPU tier (and the model of
every tier below it that evicts by recency)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice
from operator import attrgetter

from mocker.kv.events import BlockRemoved, BlockStored, KVEvent, parents_first
from mocker.tiers.tier import BlockKey, Medium, StorePlan, TierBlock

__all__ = ["LruTier"]


class LruTier:
    """A `Tier` (mocker.tiers.tier) of `capacity` slots, evicting least recently used first.

    Incoming and resident blocks together never exceed the capacity. Pins live beside the
    LRU order (a count per pinned key), so the blocks themselves are plain data that every
    tier of a cascade can share.
    """

    __slots__ = ("_events", "_incoming", "_pins", "_resident", "block_size", "capacity",
                 "medium", "name", "record_events")  # fmt: skip

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
        self._pins: dict[BlockKey, int] = {}  # resident keys being read: never evicted
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
        return len(self._pins)

    def pins(self) -> dict[BlockKey, int]:
        """Pin count of each pinned resident block (for checks)."""
        return dict(self._pins)

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
        """The blocks not held yet are reserved in order, the least recently used unpinned
        blocks evicted to make room (never a block of this batch); when every resident
        block is pinned, the blocks past the room are skipped (no room will appear before a
        load ends)."""
        plan = StorePlan()
        resident, incoming = self._resident, self._incoming
        # Set and dict operations at C speed: this runs for every block stored in any tier.
        fresh = dict(zip(map(_KEY, blocks), blocks, strict=True))  # a key once, batch order
        held = resident.keys() & fresh.keys()
        for key in held:
            del fresh[key]
        for key in incoming.keys() & fresh.keys():
            del fresh[key]
        if not fresh:
            return plan
        need = len(fresh) - (self.capacity - len(resident) - len(incoming))
        if need > 0:
            victims = self._victims(need, held)
            self._evict(victims)
            plan.evicted = victims
            if len(victims) < need:
                plan.skipped = need - len(victims)
                keep = len(fresh) - plan.skipped
                fresh = dict(list(fresh.items())[:keep])
        incoming.update(fresh)
        plan.keys = list(fresh)
        return plan

    def _victims(self, n: int, spared: set[BlockKey]) -> list[BlockKey]:
        """Up to n least recently used keys that are neither pinned nor spared, in one scan
        from the LRU end. A pinned block the scan passes is in use (a read in flight): it
        moves to the most recently used end, so no later scan passes it again (a copy to a
        slow shared tier can keep thousands pinned)."""
        pins = self._pins
        resident = self._resident
        if not pins and not spared:
            return list(islice(resident, n))
        victims: list[BlockKey] = []
        # No more than the unpinned blocks can go: once they are found, stop (a tier whose
        # every block is pinned answers at once).
        n = min(n, len(resident) - len(pins))
        if n <= 0:
            return victims
        in_use: list[BlockKey] = []
        for key in resident:
            if key in pins:
                in_use.append(key)
                continue
            if key in spared:
                continue
            victims.append(key)
            if len(victims) == n:
                break
        for key in in_use:
            resident.move_to_end(key)
        return victims

    def _evict(self, keys: list[BlockKey]) -> None:
        resident = self._resident
        for key in keys:
            del resident[key]
        if self.record_events:
            medium = self.medium
            self._events.extend(BlockRemoved(block_hashes=(key,), medium=medium) for key in keys)

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """Within a batch a parent becomes more recent than its children, as vLLM's LRU
        touches a chain in reverse, so a chain is evicted leaf first."""
        landed = list(map(self._incoming.pop, keys))
        if not success or not landed:
            return
        ordered = _children_first(landed)
        self._resident.update(zip(map(_KEY, ordered), ordered, strict=True))
        if self.record_events:
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
        move, pins = self._resident.move_to_end, self._pins
        for key in reversed(keys):
            move(key)  # a KeyError for a key that is not resident
            pins[key] = pins.get(key, 0) + 1

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        self.unpin(keys)

    def pin(self, keys: Sequence[BlockKey]) -> None:
        """Keep resident keys from eviction while they are read (a cascade), without
        touching their recency (unless an eviction scan passes one: see `_victims`)."""
        resident, pins = self._resident, self._pins
        for key in keys:
            if key not in resident:
                raise KeyError(key)
            pins[key] = pins.get(key, 0) + 1

    def unpin(self, keys: Sequence[BlockKey]) -> None:
        pins = self._pins
        for key in keys:
            n = pins.get(key, 0)
            if n <= 0:
                raise ValueError(f"{self.name} block {key} unpinned more often than pinned")
            if n == 1:
                del pins[key]
            else:
                pins[key] = n - 1

    def copies(self, keys: Sequence[BlockKey]) -> list[TierBlock]:
        """These resident blocks, to store in another tier (the records are shared: pins
        and recency are each tier's own)."""
        return list(map(self._resident.__getitem__, keys))

    # -- events -------------------------------------------------------------------------------

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


_KEY = attrgetter("key")
_PARENT = attrgetter("parent")


def _children_first(blocks: list[TierBlock]) -> list[TierBlock]:
    """The blocks ordered so that every block comes after its descendants in the list."""
    keys, parents = list(map(_KEY, blocks)), list(map(_PARENT, blocks))
    if parents[:-1] == keys[1:]:
        return blocks  # one chain, leaf first (an evict batch)
    if parents[1:] == keys[:-1]:
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
