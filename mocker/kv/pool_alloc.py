"""The device pool's references: blocks taken off the free side (evicting), touched and freed."""

from __future__ import annotations

from collections.abc import Iterable

from mocker.kv.block import KVBlock
from mocker.kv.pool_retention import RetainingPool

__all__ = ["AllocatingPool"]


class AllocatingPool(RetainingPool):
    """Reference counts and the free side: allocation evicts, the last free pushes."""

    __slots__ = ()

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take n blocks off the free side, evicting cached ones as the policy orders.

        A retained block whose turn comes is evicted all the same, in LRU order, but not
        handed out: it is displaced to its holder and the next block is taken. Callers check
        `num_reusable` first; running short here is a bug.
        """
        if n > self.num_reusable:
            raise ValueError(f"cannot allocate {n} blocks, only {self.num_reusable} reusable")
        if not self.num_retained_free and not self._policy.tracks_lineage:
            # Nothing to skip and no eviction that changes what pop() picks next (lineage
            # counts drop as parents lose children): take them in one go.
            out = self._policy.pop_many(n)
            if self.record_events:
                for block in out:
                    if block.block_hash is not None:
                        self._evict(block)
                    block.ref_cnt = 1
            elif len(self._maps) == 1 and not self.keep_tokens:
                # `_evict` written out (no events, no lineage): every allocated block passes.
                # One map, and no block holds tokens: the common replay.
                cached = self._cached
                for block in out:
                    block_hash = block.block_hash
                    if block_hash is not None:
                        del cached[block_hash]
                        block.block_hash = block.parent_hash = None
                    block.ref_cnt = 1
            else:
                maps = self._maps
                for block in out:
                    block_hash = block.block_hash
                    if block_hash is not None:
                        del maps[block.group][block_hash]
                        block.block_hash = block.parent_hash = None
                        block.token_src = None
                    block.ref_cnt = 1
            self.num_used += n
            return out
        out = []
        pop = self._policy.pop
        while len(out) < n:
            block = pop()
            if block.retained:
                self.num_retained_free -= 1
                self._displace(block)
                continue
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        self.num_used += n
        return out

    def _evict(self, block: KVBlock) -> None:
        """Drop a reused block's hash: it is no longer findable."""
        block_hash = block.block_hash
        assert block_hash is not None
        cached = self._maps[block.group]
        del cached[block_hash]
        if self._policy.tracks_lineage:
            parent_hash = block.parent_hash
            parent = cached.get(parent_hash) if parent_hash is not None else None
            self._policy.on_uncached(block, parent)
        block.block_hash = None
        block.parent_hash = None
        block.token_src = None
        if self.record_events:
            self._log.removed(block_hash, block.group)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add a reference to each block (prefix hit); a cached-free block leaves the free side."""
        remove = self._policy.remove
        for block in blocks:
            if block.ref_cnt == 0:
                remove(block)
                self.num_used += 1
                if block.retained:
                    self.num_retained_free -= 1
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; pass blocks in the order they should be reused."""
        freed: list[KVBlock] = []
        for block in ordered_blocks:
            left = block.ref_cnt = block.ref_cnt - 1
            if not left:
                if block.retained:
                    self.num_retained_free += 1
                freed.append(block)
            elif left < 0:
                self.num_used -= len(freed)  # the ones before it are freed all the same
                self._policy.push_many(freed)
                raise ValueError(f"{block!r} freed more often than referenced")
        self.num_used -= len(freed)
        self._policy.push_many(freed)

    def free_blocks_reversed(self, blocks: list[KVBlock]) -> None:
        """`free_blocks(reversed(blocks))`: a request's blocks, tail first (the compiled pool
        walks the list backwards instead of building the reversed one)."""
        self.free_blocks(reversed(blocks))
