"""The device (G1) block pool: block ids, reference counts, the prefix-cache map and KV events."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from mocker.config import EvictionPolicyName
from mocker.kv.block import BlockId, KVBlock
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kv.eviction import EvictionPolicy, make_policy
from mocker.kv.hashing import BlockHash

__all__ = ["BlockPool"]


class BlockPool:
    """A fixed set of blocks. Knows nothing of requests or time.

    Every block is in exactly one of three states:

        in use        ref_cnt > 0 (may be cached, i.e. findable by hash)
        cached-free   ref_cnt == 0 and findable by hash until it is reused
        free          ref_cnt == 0 and holding nothing

    The eviction policy owns the order of the last two. A hash maps to at most
    one block: when a request computes a block whose hash is already cached
    (two requests prefilling the same prefix at once), the request adopts the
    cached block and its own copy is released, so the map, the events and
    every block table agree on a single block per hash.
    """

    __slots__ = (
        "_cached",
        "_events",
        "_policy",
        "block_size",
        "blocks",
        "enable_caching",
        "num_used",
        "record_events",
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        eviction_policy: EvictionPolicyName = EvictionPolicyName.LRU,
        record_events: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.record_events = record_events
        self.blocks = [KVBlock(BlockId(i)) for i in range(num_blocks)]
        self._policy: EvictionPolicy = make_policy(eviction_policy)
        # Unhashed blocks are pushed to the head, so push in reverse to hand out 0, 1, 2, …
        for block in reversed(self.blocks):
            self._policy.push(block)
        self._cached: dict[BlockHash, KVBlock] = {}
        self._events: list[KVEvent] = []
        self.num_used = 0

    # -- capacity -----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free or cached-free)."""
        return len(self._policy)

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: cached blocks nobody references count as free."""
        return self.num_used / len(self.blocks)

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    # -- prefix cache -------------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def cached_hashes(self) -> dict[BlockHash, BlockId]:
        """A copy of the hash → block map (for tests and consistency checks)."""
        return {h: b.block_id for h, b in self._cached.items()}

    def cache_full_blocks(
        self,
        blocks: list[KVBlock],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None = None,
    ) -> None:
        """Make blocks[start:end] findable under block_hashes[start:end].

        `blocks` is the request's block table; an entry may be replaced by an
        already-cached block with the same hash (see the class docstring).
        `token_ids` are the request's tokens, for the BlockStored event.
        """
        if not self.enable_caching or start >= end:
            return
        cached = self._cached
        policy = self._policy
        run_start = -1  # first index of the current run of newly stored blocks
        for i in range(start, end):
            block = blocks[i]
            block_hash = block_hashes[i]
            existing = cached.get(block_hash)
            if existing is None:
                block.block_hash = block_hash
                block.parent_hash = block_hashes[i - 1] if i > 0 else None
                cached[block_hash] = block
                parent = cached.get(block.parent_hash) if i > 0 else None  # type: ignore[arg-type]
                policy.on_cached(block, parent)
                if run_start < 0:
                    run_start = i
                continue
            if existing is not block:
                self.touch((existing,))
                blocks[i] = existing
                self.free_blocks((block,))
            if run_start >= 0:
                self._record_stored(run_start, i, block_hashes, token_ids, lora_name)
                run_start = -1
        if run_start >= 0:
            self._record_stored(run_start, end, block_hashes, token_ids, lora_name)

    def _record_stored(
        self,
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
    ) -> None:
        if not self.record_events:
            return
        bs = self.block_size
        self._events.append(
            BlockStored(
                block_hashes=tuple(block_hashes[start:end]),
                parent_block_hash=block_hashes[start - 1] if start > 0 else None,
                token_ids=tuple(token_ids[start * bs : end * bs]),
                block_size=bs,
                lora_name=lora_name,
            )
        )

    def _evict(self, block: KVBlock) -> None:
        """Drop a reused block's hash: it is no longer findable."""
        block_hash = block.block_hash
        assert block_hash is not None
        del self._cached[block_hash]
        parent_hash = block.parent_hash
        parent = self._cached.get(parent_hash) if parent_hash is not None else None
        self._policy.on_uncached(block, parent)
        block.block_hash = None
        block.parent_hash = None
        if self.record_events:
            self._events.append(BlockRemoved(block_hashes=(block_hash,)))

    # -- allocation ---------------------------------------------------------------------------

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take n blocks off the free side, evicting cached ones as the policy orders.

        Callers check `num_free` first; running short here is a bug.
        """
        if n > len(self._policy):
            raise ValueError(f"cannot allocate {n} blocks, only {len(self._policy)} free")
        out: list[KVBlock] = []
        pop = self._policy.pop
        for _ in range(n):
            block = pop()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        self.num_used += n
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Add a reference to each block (prefix hit); a cached-free block leaves the free side."""
        remove = self._policy.remove
        for block in blocks:
            if block.ref_cnt == 0:
                remove(block)
                self.num_used += 1
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """Drop one reference from each block; pass blocks in the order they should be reused."""
        push = self._policy.push
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.num_used -= 1
                push(block)
            elif block.ref_cnt < 0:
                raise ValueError(f"{block!r} freed more often than referenced")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash, as vLLM does only when no block is in use."""
        if self.num_used:
            return False
        for block in list(self._cached.values()):
            self._policy.remove(block)
            self._policy.on_uncached(block, None)
            block.block_hash = block.parent_hash = None
            self._policy.push(block)
        self._cached.clear()
        if self.record_events:
            self._events.append(AllBlocksCleared())
        return True

    # -- events -------------------------------------------------------------------------------

    def take_events(self) -> list[KVEvent]:
        """Drain the events recorded since the last call."""
        if not self._events:
            return []
        events, self._events = self._events, []
        return events
