"""One device KV block: id, reference count, hash, and the free-list links it carries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NewType

from mocker.kv.hashing import BlockHash

__all__ = ["BlockId", "KVBlock", "block_ids"]

BlockId = NewType("BlockId", int)


@dataclass(slots=True, eq=False)
class KVBlock:
    """A slot of the device pool. Identity equality: two blocks are never 'equal'."""

    block_id: BlockId
    ref_cnt: int = 0
    # Set while the block is findable by prefix lookup (it stays set on the free list).
    block_hash: BlockHash | None = None
    parent_hash: BlockHash | None = None
    # The KV cache group it serves while held or cached (hybrid models; 0 otherwise): its
    # hash is a key in that group's map.
    group: int = 0
    # Cached blocks whose parent is this block; only the lineage policy reads it.
    num_cached_children: int = 0
    # Its holder must copy it out before the slot is reused (write-back): eviction displaces
    # it to the holder instead of reusing it (see BlockPool).
    retained: bool = False
    # Kept when the pool keeps tokens: what a copy of this block records elsewhere (a lower
    # tier, a re-announced BlockStored): its tokens (the request's token list, append-only,
    # and where this block starts in it) and LoRA.
    token_src: Sequence[int] | None = None
    token_start: int = 0
    lora_name: str | None = None

    @property
    def cached_hash(self) -> BlockHash:
        """The hash of a block known to be cached (or being offloaded); a bug otherwise."""
        block_hash = self.block_hash
        if block_hash is None:
            raise RuntimeError(f"{self!r} holds no hash")
        return block_hash

    def token_ids(self, block_size: int) -> tuple[int, ...]:
        src = self.token_src
        start = self.token_start
        return () if src is None else tuple(src[start : start + block_size])

    # Intrusive free-list links, touched only by FreeBlockQueue.
    prev_free: KVBlock | None = None
    next_free: KVBlock | None = None

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


def block_ids(blocks: Iterable[KVBlock | int]) -> list[int]:
    """A block table's ids, from either device pool (the compiled one's blocks are their
    ids: mocker.kv.compiled_pool)."""
    return [b if isinstance(b, int) else b.block_id for b in blocks]
