"""KV cache events recorded by the block pool and drained once per engine step."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from mocker.kv.hashing import BlockHash

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "parents_first",
    "stored_event",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks that became findable in a tier, in chain order."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    medium: str = "GPU"
    # vLLM's optional trailing field: "LOCAL" / "REMOTE" relative to the publishing engine
    # (set for storage tiers only; None is not sent).
    locality: str | None = None
    # KV cache groups (hybrid models; None is not sent): the group, its spec's kind
    # ("full_attention", "sliding_window", "mamba") and a sliding group's window.
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    # vLLM 0.34's: the offload tier that made the event (None for mocker's tiers, as for
    # vLLM's but kvcr), and the session of the request that stored the blocks.
    ownership: str | None = None
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks that stopped being findable in a tier (evicted or cleared)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str = "GPU"
    locality: str | None = None  # as BlockStored's
    group_idx: int | None = None  # as BlockStored's
    ownership: str | None = None  # as BlockStored's


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block of the engine was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def stored_event(
    start: int,
    end: int,
    block_hashes: Sequence[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None,
    session_id: str | None = None,
) -> BlockStored:
    """The BlockStored of a dense model's blocks [start, end) of one request, newly cached."""
    return BlockStored(
        block_hashes=tuple(block_hashes[start:end]),
        parent_block_hash=block_hashes[start - 1] if start > 0 else None,
        token_ids=tuple(token_ids[start * block_size : end * block_size]),
        block_size=block_size,
        lora_name=lora_name,
        session_id=session_id,
    )


def parents_first(
    items: Iterable[T],
    block_hash: Callable[[T], BlockHash],
    parent_hash: Callable[[T], BlockHash | None],
) -> list[T]:
    """The items ordered so that a parent comes before its children (depth within the set),
    as a consumer that keys a block by its parent needs them announced."""
    by_hash = {block_hash(item): item for item in items}
    depth: dict[BlockHash, int] = {}
    for start in by_hash:
        path: list[BlockHash] = []
        h: BlockHash | None = start
        while h is not None and h in by_hash and h not in depth:
            path.append(h)
            h = parent_hash(by_hash[h])
        d = depth[h] + 1 if h is not None and h in depth else 0
        for h in reversed(path):  # walked leaf to root: assign root first
            depth[h] = d
            d += 1
    return sorted(by_hash.values(), key=lambda item: depth[block_hash(item)])
