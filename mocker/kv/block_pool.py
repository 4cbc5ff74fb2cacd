"""The device (G1) block pool: block ids, reference counts, the prefix-cache map and KV events."""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import cast

from mocker.kv.block import KVBlock
from mocker.kv.events import parents_first
from mocker.kv.hashing import BlockHash
from mocker.kv.pool_cache import CachingPool

__all__ = ["BlockPool"]

_HASH = attrgetter("block_hash")
_PARENT = attrgetter("parent_hash")


class BlockPool(CachingPool):
    """A fixed set of blocks. Knows nothing of requests or time.

    Every block is in exactly one of four states:

        in use        ref_cnt > 0 (may be cached, i.e. findable by hash)
        cached-free   ref_cnt == 0 and findable by hash until it is reused
        free          ref_cnt == 0 and holding nothing
        displaced     evicted, but its slot stays occupied until its holder returns
                      it (write-back only)

    The eviction policy owns the order of the two free states. A cached block can be
    *retained* by a holder that must copy it out before its slot is reused (a write-back
    store policy; the pool does not know what the copy is): a retained free block is
    not reusable, so `num_reusable` excludes it, and evicting it *displaces* it: it leaves
    the prefix cache but keeps its slot, hash and tokens until the holder, which drains
    those with `take_displaced`, gives it back with `return_displaced`.
    A hash maps to at most
    one block: when a request computes a block whose hash is already cached
    (two requests prefilling the same prefix at once), the request adopts the
    cached block and its own copy is released, so the map, the events and
    every block table agree on a single block per hash.

    KV cache groups (hybrid models) share the pool, as vLLM's groups share one: a block
    serves one group at a time, and each group has its own hash map, so a block's key is
    (group, hash). Events then carry the group, its spec's kind and window.

    Its parts, each building on the last: the state (mocker.kv.pool_state), write-back
    retention (pool_retention), references and eviction (pool_alloc), the prefix cache
    (pool_cache); here, what a lower tier reads of blocks, and the reset.
    """

    __slots__ = ()

    # -- what a lower tier reads of blocks ----------------------------------------------------

    def block_hashes(self, blocks: Iterable[KVBlock]) -> list[BlockHash | None]:
        """Each block's hash (None: not cached); the tiers name copies by them."""
        return list(map(_HASH, blocks))

    def parent_hashes(self, blocks: Iterable[KVBlock]) -> list[BlockHash | None]:
        return list(map(_PARENT, blocks))

    def store_hashes(self, blocks: Iterable[KVBlock]) -> list[BlockHash]:
        """`block_hashes` of blocks that must be cached (a store's: RuntimeError if one is
        not)."""
        keys = self.block_hashes(blocks)
        if None in keys:
            raise RuntimeError("a block to store holds no hash (it is not cached)")
        return cast("list[BlockHash]", keys)

    def token_meta(
        self, blocks: Iterable[KVBlock], block_size: int
    ) -> list[tuple[tuple[int, ...], str | None]]:
        """Each block's first `block_size` tokens (none unless the pool keeps them) and LoRA,
        for a lower tier's events. (A hybrid model's tier units are `block_size` tokens.)"""
        return [(b.token_ids(block_size), b.lora_name) for b in blocks]

    # -- reset --------------------------------------------------------------------------------

    def reset_prefix_cache(self) -> int:
        """Forget every cached block nobody references; returns how many were forgotten.

        (vLLM refuses while any block is in use; here a reset under load clears what it
        can.) Referenced cached blocks stay findable, and so do the cached ancestors they
        hang from (a write-through copy pins a block without its parent), so AllBlocksCleared
        is followed by their BlockStored again, parents first: a consumer applying the
        stream still ends with exactly this cache, chain by chain (group by group)."""
        kept_by_group = [self._reset_map(cached) for cached in self._maps]
        cleared = sum(n for _, n in kept_by_group)
        if self.record_events:
            self._log.cleared([kept for kept, _ in kept_by_group])
        return cleared

    def _reset_map(self, cached: dict[BlockHash, KVBlock]) -> tuple[list[KVBlock], int]:
        """Clear one group's map but for what is referenced; the survivors, parents first,
        and how many were cleared."""
        policy = self._policy
        keep: set[BlockHash] = set()
        for block in cached.values():
            if not block.ref_cnt:
                continue
            h: BlockHash | None = block.block_hash
            while h is not None and h not in keep and (kept_block := cached.get(h)) is not None:
                keep.add(h)
                h = kept_block.parent_hash
        cleared = 0
        for block_hash, block in list(cached.items()):
            if block_hash in keep:
                continue
            policy.remove(block)
            policy.on_uncached(block, None)
            del cached[block_hash]
            block.block_hash = block.parent_hash = None
            block.token_src = None
            if block.retained:
                block.retained = False
                self.num_retained_free -= 1
            policy.push(block)  # now holding nothing: reused first
            cleared += 1
        kept = parents_first(
            cached.values(),
            lambda b: b.cached_hash,
            lambda b: b.parent_hash,
        )
        for block in kept:  # recount cache lineage among the survivors
            block.num_cached_children = 0
        for block in kept:
            parent_hash = block.parent_hash
            policy.on_cached(block, None if parent_hash is None else cached.get(parent_hash))
        return kept, cleared
