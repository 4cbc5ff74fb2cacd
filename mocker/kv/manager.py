"""Per-request KV bookkeeping: prefix lookup, slot allocation, caching and freeing of blocks."""

from __future__ import annotations

from collections.abc import Sequence

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.request import Request

__all__ = ["KVCacheManager"]


class KVCacheManager:
    """The scheduler's only door to the block pool: it speaks in requests and tokens."""

    __slots__ = ("block_size", "enable_caching", "pool")

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_caching = pool.enable_caching

    @property
    def usage(self) -> float:
        return self.pool.usage

    def get_computed_blocks(self, request: Request) -> list[KVBlock]:
        """Longest cached prefix of a request, in blocks.

        Capped at num_tokens - 1 tokens: the last token is always computed, so
        the pass that admits the request produces its logits.
        """
        if not self.enable_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        lookup = self.pool.lookup
        hits: list[KVBlock] = []
        for i in range(min(max_blocks, len(hashes))):
            block = lookup(hashes[i])
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: Sequence[KVBlock] = (),
    ) -> bool:
        """Give the request room for `num_new_tokens` more tokens, after its prefix hits.

        Returns False, changing nothing, if the pool cannot supply the blocks now.
        """
        bs = self.block_size
        held = request.blocks
        num_computed = request.num_computed_tokens + len(computed_blocks) * bs
        num_needed = -(-(num_computed + num_new_tokens) // bs) - len(held) - len(computed_blocks)
        if computed_blocks:
            # Hits sitting on the free side stop being free when we take them.
            revived = sum(1 for b in computed_blocks if b.ref_cnt == 0)
            if num_needed + revived > self.pool.num_free:
                return False
            self.pool.touch(computed_blocks)
            held.extend(computed_blocks)
            request.num_cached_blocks = len(held)
        if num_needed > 0:
            if num_needed > self.pool.num_free:
                return False
            held.extend(self.pool.get_new_blocks(num_needed))
        return True

    def cache_blocks(self, request: Request) -> None:
        """Register the request's fully computed blocks in the prefix cache."""
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= request.num_cached_blocks:
            return
        if self.enable_caching:
            self.pool.cache_full_blocks(
                request.blocks,
                request.num_cached_blocks,
                num_full,
                request.block_hashes,
                request.all_token_ids,
                request.lora_name,
            )
        request.num_cached_blocks = num_full

    def free(self, request: Request) -> None:
        """Release every block; the tail goes first so a shared prefix outlives it."""
        if request.blocks:
            self.pool.free_blocks(reversed(request.blocks))
            request.blocks = []
        request.num_cached_blocks = 0
