"""Per-request KV bookkeeping: prefix lookup, slot allocation, caching and freeing of blocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.request import Request

if TYPE_CHECKING:
    from mocker.tiers.offload import OffloadManager

__all__ = ["KVCacheManager"]


class KVCacheManager:
    """The scheduler's only door to the block pool: it speaks in requests and tokens."""

    __slots__ = ("block_size", "enable_caching", "offload", "pool")

    def __init__(self, pool: BlockPool, offload: OffloadManager | None = None) -> None:
        self.pool = pool
        self.offload = offload
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
        return self.pool.lookup_prefix(request.block_hashes[:max_blocks])

    def host_hit_blocks(self, request: Request, num_device_blocks: int) -> int:
        """Blocks to load from the host tier after a device hit of `num_device_blocks`: the
        contiguous continuation found there, if loading it pays off (else 0: recompute)."""
        offload = self.offload
        if offload is None or request.skip_host_load:
            return 0
        max_blocks = (request.num_tokens - 1) // self.block_size  # as the device lookup
        n = offload.host_match(request, num_device_blocks, max_blocks)
        return n if n and offload.load_pays_off(n) else 0

    @property
    def transfers_pending(self) -> bool:
        return self.offload is not None and self.offload.has_pending

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
        pool = self.pool
        if computed_blocks:
            # Hits sitting on the free side stop being free when we take them (a dirty hit
            # was not reusable anyway, so it does not count against the reusable ones).
            revived = pool.num_reviving(computed_blocks)
            if num_needed + revived > pool.num_reusable:
                self._make_room(num_needed + revived)
                return False
            pool.touch(computed_blocks)
            held.extend(computed_blocks)
            request.num_cached_blocks = len(held)
        if num_needed > 0:
            if num_needed > pool.num_reusable:
                self._make_room(num_needed)
                return False
            held.extend(pool.get_new_blocks(num_needed))
        return True

    @property
    def num_reusable(self) -> int:
        """Blocks that can be handed out now."""
        return self.pool.num_reusable

    @property
    def num_used(self) -> int:
        return self.pool.num_used

    def append_blocks(self, request: Request, num_blocks: int) -> None:
        """Give a decoding request `num_blocks` more blocks (the caller checked the room)."""
        request.blocks.extend(self.pool.get_new_blocks(num_blocks))

    def _make_room(self, num_blocks: int) -> None:
        """Short of reusable blocks with offload on eviction: start copying enough dirty
        ones (counting the copies already in flight) that they will be reusable soon."""
        pool = self.pool
        if pool.num_dirty_free:
            pool.evict_dirty(num_blocks - pool.num_reusable - pool.num_in_flight)

    @property
    def awaiting_offload(self) -> bool:
        """Blocks are being copied to host and will be reusable when the copies end: a
        request short of blocks waits for them rather than preempting another."""
        return self.pool.num_in_flight > 0

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

    def finish_load(self, request: Request) -> None:
        """Host KV landed in the request's reserved blocks: they are computed, and cached."""
        request.num_computed_tokens = len(request.blocks) * self.block_size
        self.cache_blocks(request)

    def free_finished(self, request: Request) -> None:
        """Release a finished request's blocks: now, or (write-through) when the copies of
        its blocks to host have ended."""
        if self.offload is not None and self.offload.hold_if_storing(request):
            request.num_cached_blocks = 0
            return
        self.free(request)

    def free(self, request: Request) -> None:
        """Release every block; the tail goes first so a shared prefix outlives it."""
        if request.blocks:
            self.pool.free_blocks(reversed(request.blocks))
            request.blocks = []
        request.num_cached_blocks = 0
