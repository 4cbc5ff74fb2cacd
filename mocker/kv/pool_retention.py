"""Write-back retention: cached blocks a holder must copy out before reuse, displaced to it."""

from __future__ import annotations

from collections.abc import Iterable

from mocker.kv.block import KVBlock
from mocker.kv.hashing import BlockHash
from mocker.kv.pool_state import PoolState

__all__ = ["RetainingPool"]


class RetainingPool(PoolState):
    """The pool's retained and displaced blocks (see BlockPool's states)."""

    __slots__ = ()

    def retain(self, blocks: Iterable[KVBlock]) -> None:
        """Cached blocks whose holder must copy them before their slots are reused (blocks
        already retained, or no longer cached, are left as they are)."""
        for block in blocks:
            if block.retained or block.block_hash is None:
                continue
            block.retained = True
            if block.ref_cnt == 0:
                self.num_retained_free += 1

    def set_retained(self, block_hash: BlockHash, retained: bool) -> None:
        """Retain (or release) the cached block with this hash, if any: its holder lost (or
        gained) a copy elsewhere."""
        block = self._cached.get(block_hash)
        if block is None or block.retained == retained:
            return
        block.retained = retained
        if block.ref_cnt == 0:
            self.num_retained_free += 1 if retained else -1

    def _displace(self, block: KVBlock) -> None:
        """Evict a retained free block: it leaves the prefix cache now (its copy in flight
        is findable nowhere), but keeps its slot, hash and tokens until `return_displaced`."""
        block_hash = block.block_hash
        assert block_hash is not None and block.ref_cnt == 0
        cached = self._maps[block.group]
        del cached[block_hash]
        parent_hash = block.parent_hash
        parent = cached.get(parent_hash) if parent_hash is not None else None
        self._policy.on_uncached(block, parent)
        block.retained = False
        self.num_displaced += 1
        self._displaced.append(block)
        if self.record_events:
            self._log.removed(block_hash, block.group)

    def displace_retained(self, n: int) -> int:
        """Displace up to `n` retained free blocks, in eviction order; returns how many.
        Called when too few blocks are reusable: they are reusable once returned."""
        if n <= 0 or not self.num_retained_free:
            return 0
        chosen = self._first_retained(n)
        for block in chosen:
            self._policy.remove(block)
            self.num_retained_free -= 1
            self._displace(block)
        return len(chosen)

    def _first_retained(self, n: int) -> list[KVBlock]:
        """The first n retained free blocks in eviction order; if the policy's own candidates
        run short (lineage skips parents), then in plain LRU order."""
        chosen: list[KVBlock] = []
        for block in self._policy.candidates():
            if block.retained:
                chosen.append(block)
                if len(chosen) == n:
                    return chosen
        taken = set(map(id, chosen))
        for block in self._policy:
            if block.retained and id(block) not in taken:
                chosen.append(block)
                if len(chosen) == n:
                    break
        return chosen

    def take_displaced(self) -> list[KVBlock]:
        """Blocks displaced since the last call, for their holder to copy and return."""
        if not self._displaced:
            return []
        out, self._displaced = self._displaced, []
        return out

    def return_displaced(self, blocks: Iterable[KVBlock]) -> None:
        """The holder is done with displaced blocks: the slots are free and hold nothing."""
        push = self._policy.push
        for block in blocks:
            block.block_hash = block.parent_hash = None
            block.token_src = None
            self.num_displaced -= 1
            push(block)
