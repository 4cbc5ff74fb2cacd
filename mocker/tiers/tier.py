"""The residency protocol every storage level below the device implements (vLLM's
`OffloadingManager` verbs), and the records its verbs take and give."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from mocker.kv.events import KVEvent
from mocker.kv.hashing import BlockHash

__all__ = ["BlockBatch", "BlockKey", "BlockMeta", "Locality", "Medium", "StorePlan", "Tier",
           "TierBlock"]  # fmt: skip

# What a tier is keyed by: the device block's hash (the prefix chain, LoRA and salt are in
# it), never a request.
BlockKey = BlockHash


class Medium(StrEnum):
    """vLLM's KV-event medium constants."""

    GPU = "GPU"
    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(StrEnum):
    """vLLM's optional KV-event `locality`: relative to the engine publishing the event."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


# What a BlockStored event names of a block besides its key and parent: its tokens and LoRA.
BlockMeta = tuple[tuple[int, ...], str | None]


@dataclass(slots=True, eq=False)
class TierBlock:
    """One block's KV as a BlockStored event names it: a row of a `BlockBatch` (for callers
    that build batches by hand; the store path itself never makes one per block)."""

    key: BlockKey
    parent: BlockKey | None
    token_ids: tuple[int, ...]
    lora_name: str | None = None


@dataclass(slots=True)
class BlockBatch:
    """Blocks to store in a tier, as columns: every block any tier stores passes through
    here, so a batch is built and read with C-level list operations, never an object per
    block. `parents` order a batch in the LRU (a chain is evicted leaf first) and chain the
    events; `meta` is kept only when the tiers publish events (all tiers do, or none)."""

    keys: list[BlockKey]
    parents: list[BlockKey | None]
    meta: list[BlockMeta] | None = None
    # No key twice (a chain, a tier's copies): a store then builds no dict to dedupe them.
    unique: bool = False

    @classmethod
    def of(cls, blocks: Sequence[TierBlock]) -> BlockBatch:
        return cls(
            [b.key for b in blocks],
            [b.parent for b in blocks],
            [(b.token_ids, b.lora_name) for b in blocks],
        )

    def __len__(self) -> int:
        return len(self.keys)


@dataclass(slots=True)
class StorePlan:
    """What `prepare_store` reserved: the keys to copy (slots claimed, not yet visible), the
    keys it evicted to make room, and how many it skipped for want of room (every resident
    block pinned: vLLM's `kv_offload_stores_skipped`). Keys the tier already holds are
    neither stored nor skipped."""

    keys: list[BlockKey] = field(default_factory=list)
    evicted: list[BlockKey] = field(default_factory=list)
    skipped: int = 0


class Tier(Protocol):
    """A storage level below the device. Knows nothing of time, links or requests.

    A block is *incoming* from `prepare_store` until `complete_store`, and *resident* after a
    successful one; only resident blocks are found by `lookup`, and only resident, unpinned
    ones are evicted. `prepare_load` pins blocks for a read until `complete_load`, which
    takes the same run of keys (the same sequence, unchanged): a pin is a read of a run.
    """

    name: str
    medium: Medium
    capacity: int

    def lookup(self, keys: Sequence[BlockKey], start: int, stop: int) -> int:
        """How many of keys[start:stop] are resident, contiguously from `start`."""
        ...

    def holds(self, key: BlockKey) -> bool:
        """Resident or incoming: storing this key again would copy it twice."""
        ...

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """Make resident keys the most recently used, the chain's root most of all."""
        ...

    def prepare_load(self, keys: Sequence[BlockKey]) -> None:
        """Pin resident keys for a read (and touch them)."""
        ...

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        """The read ended (or was dropped): unpin."""
        ...

    def prepare_store(self, blocks: BlockBatch) -> StorePlan:
        """Reserve slots for the blocks not held yet, evicting as needed (see StorePlan)."""
        ...

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """Copies ended: resident and visible; or failed: the reserved slots are freed."""
        ...

    def take_events(self) -> list[KVEvent]:
        """Drain the BlockStored / BlockRemoved events recorded since the last call."""
        ...

    @property
    def usage(self) -> float:
        """Fraction of the capacity resident or incoming."""
        ...
