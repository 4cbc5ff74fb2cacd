"""One manager per KV cache group kind: prefix hits, blocks to allocate, blocks to release."""

from __future__ import annotations

from collections.abc import Sequence

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.hashing import BlockHash
from mocker.kv.spec import KVCacheGroup, SpecKind

__all__ = ["GroupManager", "Table", "make_group_manager"]

# A request's block table in one group, position-indexed: entry i holds tokens
# [i·bs, (i+1)·bs) (or, for Mamba, the state after (i+1)·bs tokens); None is vLLM's null
# block: a position whose block was released (out of the window, a skipped state).
Table = list[KVBlock | None]

# No position at which a group releases anything (full attention).
NEVER = 1 << 62


class GroupManager:
    """Full attention: every position holds a block; a hit is the longest cached prefix."""

    __slots__ = ("_cached", "block_size", "caching", "group", "pool")

    releases = False  # whether blocks are released before the request ends
    sparse = False  # whether a table has null positions between held blocks

    def __init__(self, group: KVCacheGroup, pool: BlockPool, caching: bool) -> None:
        self.group = group.index
        self.pool = pool
        self.block_size = pool.block_size
        self.caching = caching
        self._cached = pool.group_map(group.index)

    def find_hit(self, hashes: Sequence[BlockHash], max_blocks: int) -> int:
        """The longest hit of at most `max_blocks` blocks this group can serve, in blocks."""
        cached = self._cached
        n = 0
        for block_hash in hashes[:max_blocks]:
            if block_hash not in cached:
                break
            n += 1
        return n

    def hit_table(self, hashes: Sequence[BlockHash], num_blocks: int) -> Table:
        """The table a hit of `num_blocks` blocks starts with (the coordinator found that
        every group serves it)."""
        get = self._cached.get
        return [get(h) for h in hashes[:num_blocks]]

    def num_skipped(self, num_computed: int) -> int:
        """Leading positions whose blocks the request no longer needs."""
        return 0

    def next_release(self, num_computed: int) -> int:
        """The computed-token count at which `num_skipped` next grows."""
        return NEVER

    def num_new_blocks(self, table_len: int, grow: int) -> int:
        """Blocks to allocate when a table of `table_len` positions grows by `grow`."""
        return max(grow, 0)

    def extend(self, table: Table, end: int, blocks: list[KVBlock]) -> None:
        """Grow the table to `end` positions with the blocks allocated for it."""
        table.extend(blocks)

    def cacheable(self, num_computed: int) -> int:
        """Positions [0, n) whose blocks are complete and may be cached."""
        return num_computed // self.block_size


class SlidingWindowManager(GroupManager):
    """Sliding window: a hit needs only the window's blocks before the hit point, and blocks
    that fall out of the window as a request advances are released (keeping their hash:
    they stay cached until evicted, as vLLM's)."""

    __slots__ = ("_need", "window")

    releases = True

    def __init__(self, group: KVCacheGroup, pool: BlockPool, caching: bool) -> None:
        super().__init__(group, pool, caching)
        assert group.sliding_window is not None
        self.window = group.sliding_window
        # Contiguous cached blocks a hit needs: the window's w − 1 tokens before it.
        self._need = -(-(self.window - 1) // self.block_size)

    def find_hit(self, hashes: Sequence[BlockHash], max_blocks: int) -> int:
        """Right to left: the last position ending a run of `_need` cached blocks; with no
        such run, the cached blocks contiguous from the start (vLLM's rule)."""
        need = self._need
        if need == 0:
            return max_blocks
        cached = self._cached
        run = 0
        for i in range(min(max_blocks, len(hashes)) - 1, -1, -1):
            if hashes[i] in cached:
                run += 1
                if run == need:
                    return i + need
            else:
                run = 0
        return run

    def hit_table(self, hashes: Sequence[BlockHash], num_blocks: int) -> Table:
        first = max(0, num_blocks - self._need)
        get = self._cached.get
        table: Table = [None] * first
        table.extend(get(h) for h in hashes[first:num_blocks])
        return table

    def num_skipped(self, num_computed: int) -> int:
        return max(0, num_computed - self.window + 1) // self.block_size

    def next_release(self, num_computed: int) -> int:
        return (self.num_skipped(num_computed) + 1) * self.block_size + self.window - 1


class MambaManager(GroupManager):
    """Mamba / linear attention, vLLM's mamba_cache_mode "align": one running state per
    request, saved at block boundaries a pass ends on. A hit needs a saved state exactly at
    the hit point; a request holds the state it runs on and, for one pass after it moves
    on, the one it was copied from. Without prefix caching ("none"): one state, never saved."""

    __slots__ = ()

    releases = True
    sparse = True

    def find_hit(self, hashes: Sequence[BlockHash], max_blocks: int) -> int:
        """Right to left: the first saved state found wins."""
        cached = self._cached
        for i in range(min(max_blocks, len(hashes)) - 1, -1, -1):
            if hashes[i] in cached:
                return i + 1
        return 0

    def hit_table(self, hashes: Sequence[BlockHash], num_blocks: int) -> Table:
        if not num_blocks:
            return []
        table: Table = [None] * (num_blocks - 1)
        table.append(self._cached.get(hashes[num_blocks - 1]))
        return table

    def num_skipped(self, num_computed: int) -> int:
        if not self.caching:
            return 0  # the one state is kept until the request ends
        return max(0, num_computed - 1) // self.block_size

    def next_release(self, num_computed: int) -> int:
        if not self.caching:
            return NEVER
        return (self.num_skipped(num_computed) + 1) * self.block_size + 1

    def num_new_blocks(self, table_len: int, grow: int) -> int:
        """One state per pass at most: a block for the position the pass ends in, if the
        table does not reach it yet (without caching, the first one only)."""
        if grow <= 0 or (not self.caching and table_len):
            return 0
        return 1

    def extend(self, table: Table, end: int, blocks: list[KVBlock]) -> None:
        """The positions before the state's are null (their states are never saved);
        without caching the one state stays at position 0."""
        if not self.caching:
            table.extend(blocks)
            table.extend([None] * (end - len(table)))
            return
        if blocks:
            table.extend([None] * (end - 1 - len(table)))
            table.extend(blocks)


def make_group_manager(group: KVCacheGroup, pool: BlockPool, caching: bool) -> GroupManager:
    if group.kind is SpecKind.SLIDING:
        return SlidingWindowManager(group, pool, caching)
    if group.kind is SpecKind.MAMBA:
        return MambaManager(group, pool, caching)
    return GroupManager(group, pool, caching)
