"""The host (G2) tier: block hashes resident in host memory, LRU order, pins and incoming slots."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from mocker.kv.events import BlockRemoved, BlockStored, KVEvent, parents_first
from mocker.kv.hashing import BlockHash

__all__ = ["HostBlock", "HostTier"]

MEDIUM = "CPU"


@dataclass(slots=True, eq=False)
class HostBlock:
    """One block's KV in host memory (or on its way there), keyed by its device hash."""

    block_hash: BlockHash
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    lora_name: str | None = None
    pins: int = 0  # loads reading it; a pinned block is never evicted


class HostTier:
    """Capacity and LRU of the host tier. Knows nothing of time, links or requests.

    A block is *incoming* from the moment a store reserves its slot until the copy
    ends, and *resident* after that; only resident blocks are visible to lookups,
    and only resident, unpinned blocks are evicted (least recently used first).
    Incoming and resident blocks together never exceed the capacity.
    """

    __slots__ = ("_events", "_incoming", "_resident", "block_size", "capacity", "record_events")

    def __init__(self, capacity: int, block_size: int, *, record_events: bool = False) -> None:
        self.capacity = capacity
        self.block_size = block_size
        self.record_events = record_events
        self._resident: OrderedDict[BlockHash, HostBlock] = OrderedDict()  # LRU first
        self._incoming: dict[BlockHash, HostBlock] = {}
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

    def __contains__(self, block_hash: BlockHash) -> bool:
        """Resident: visible to lookups."""
        return block_hash in self._resident

    def holds(self, block_hash: BlockHash) -> bool:
        """Resident or incoming: a store of this hash would copy it twice."""
        return block_hash in self._resident or block_hash in self._incoming

    def resident_hashes(self) -> set[BlockHash]:
        return set(self._resident)

    def num_pinned(self) -> int:
        return sum(1 for b in self._resident.values() if b.pins)

    def pins(self) -> dict[BlockHash, int]:
        """Pin count of each pinned resident block (for checks)."""
        return {h: b.pins for h, b in self._resident.items() if b.pins}

    def match(self, hashes: Sequence[BlockHash], start: int, stop: int) -> int:
        """How many of hashes[start:stop] are resident, contiguously from `start`."""
        resident = self._resident
        n = 0
        for i in range(start, stop):
            if hashes[i] not in resident:
                break
            n += 1
        return n

    # -- stores -------------------------------------------------------------------------------

    def reserve(self, block: HostBlock) -> list[BlockHash] | None:
        """Claim a slot for an incoming block, evicting LRU resident blocks if full.

        Returns the hashes evicted to make room, or None (nothing changed) when every
        resident block is pinned.
        """
        evicted: list[BlockHash] = []
        if self.num_used >= self.capacity:
            victim = next((b for b in self._resident.values() if not b.pins), None)
            if victim is None:
                return None
            self._remove(victim.block_hash)
            evicted.append(victim.block_hash)
        self._incoming[block.block_hash] = block
        return evicted

    def commit(self, hashes: Iterable[BlockHash]) -> None:
        """Copies finished: the blocks become resident (most recently used) and visible.

        Within the batch a parent becomes more recent than its children, as vLLM's host
        LRU touches a chain in reverse, so a chain is evicted leaf first."""
        landed = [self._incoming.pop(h) for h in hashes]
        resident = self._resident
        for block in _children_first(landed):
            resident[block.block_hash] = block
        if self.record_events and landed:
            self._record_stored(landed)

    def _record_stored(self, blocks: list[HostBlock]) -> None:
        """One BlockStored per run of blocks that chain parent to child."""
        run: list[HostBlock] = []
        for block in blocks:
            if run and block.parent_hash != run[-1].block_hash:
                self._emit_run(run)
                run = []
            run.append(block)
        self._emit_run(run)

    def _emit_run(self, run: list[HostBlock]) -> None:
        tokens: list[int] = []
        for block in run:
            tokens.extend(block.token_ids)
        self._events.append(
            BlockStored(
                block_hashes=tuple(b.block_hash for b in run),
                parent_block_hash=run[0].parent_hash,
                token_ids=tuple(tokens),
                block_size=self.block_size,
                lora_name=run[0].lora_name,
                medium=MEDIUM,
            )
        )

    # -- loads --------------------------------------------------------------------------------

    def pin(self, hashes: Sequence[BlockHash]) -> None:
        """A load starts reading these blocks (in chain order): they stay resident until
        unpinned."""
        resident = self._resident
        for block_hash in reversed(hashes):  # a hit makes them the most recently used,
            resident[block_hash].pins += 1  # the chain's root most of all
            resident.move_to_end(block_hash)

    def unpin(self, hashes: Iterable[BlockHash]) -> None:
        resident = self._resident
        for block_hash in hashes:
            block = resident[block_hash]
            if block.pins <= 0:
                raise ValueError(f"host block {block_hash} unpinned more often than pinned")
            block.pins -= 1

    # -- eviction -----------------------------------------------------------------------------

    def _remove(self, block_hash: BlockHash) -> None:
        del self._resident[block_hash]
        if self.record_events:
            self._events.append(BlockRemoved(block_hashes=(block_hash,), medium=MEDIUM))

    def announce(self) -> None:
        """Record a BlockStored for every resident block, parents first (after a consumer
        was told AllBlocksCleared while this tier kept its blocks)."""
        if self.record_events and self._resident:
            for block in parents_first(
                self._resident.values(), lambda b: b.block_hash, lambda b: b.parent_hash
            ):
                self._emit_run([block])

    def take_events(self) -> list[KVEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events


def _children_first(blocks: list[HostBlock]) -> list[HostBlock]:
    """The blocks ordered so that every block comes after its descendants in the list."""
    pairs = list(pairwise(blocks))
    if all(a.parent_hash == b.block_hash for a, b in pairs):
        return blocks  # one chain, leaf first (an evict batch)
    if all(b.parent_hash == a.block_hash for a, b in pairs):
        return blocks[::-1]  # one chain, root first (a write-through batch)
    in_batch = {b.block_hash for b in blocks}
    children: dict[BlockHash, list[HostBlock]] = {}
    roots: list[HostBlock] = []
    for block in blocks:
        parent = block.parent_hash
        if parent is not None and parent in in_batch and parent != block.block_hash:
            children.setdefault(parent, []).append(block)
        else:
            roots.append(block)
    out: list[HostBlock] = []
    stack: list[tuple[HostBlock, bool]] = [(r, False) for r in reversed(roots)]
    while stack:  # iterative post-order: chains can be thousands of blocks long
        block, expanded = stack.pop()
        if expanded:
            out.append(block)
            continue
        stack.append((block, True))
        stack.extend((c, False) for c in children.get(block.block_hash, ()))
    return out
