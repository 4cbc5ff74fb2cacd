"""KV cache events recorded by the block pool and drained once per engine step."""

from __future__ import annotations

from dataclasses import dataclass

from mocker.kv.hashing import BlockHash

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEvent"]


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks that became findable in a tier, in chain order."""

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Cached blocks that stopped being findable in a tier (evicted or cleared)."""

    block_hashes: tuple[BlockHash, ...]
    medium: str = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """Every cached block of the engine was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
