"""The device pool's prefix cache: blocks found by hash, and full blocks registered under theirs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from itertools import takewhile
from operator import attrgetter, is_not
from typing import cast

from mocker.kv.block import BlockId, KVBlock
from mocker.kv.hashing import BlockHash
from mocker.kv.pool_alloc import AllocatingPool

__all__ = ["CachingPool"]

_NOT_NONE = partial(is_not, None)  # C-level "is not None" for takewhile

_REF_CNT = attrgetter("ref_cnt")


class CachingPool(AllocatingPool):
    """Each group's hash → block map: lookups, and registration of computed blocks."""

    __slots__ = ()

    # -- lookups ------------------------------------------------------------------------------

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> list[KVBlock]:
        """The cached blocks of the longest prefix of `block_hashes` found in the cache."""
        # C-level (map, takewhile, a partial of a C function) and stopping at the first miss:
        # a long prompt waiting for room is looked up again every pass, its prefix can be
        # hundreds of blocks, and most prompts miss far before their end.
        get: Callable[[BlockHash], KVBlock | None] = self._cached.get
        hits = list(takewhile(_NOT_NONE, map(get, block_hashes)))
        return cast("list[KVBlock]", hits)  # (the Nones stopped the takewhile)

    def num_cached_prefix(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading hashes are cached, stopping at the first miss (a router asks
        this of every engine for every request: no list of blocks is built)."""
        cached = self._cached
        n = 0
        for block_hash in block_hashes:
            if block_hash not in cached:
                break
            n += 1
        return n

    def num_reviving(self, blocks: Sequence[KVBlock]) -> int:
        """How many of these cached blocks are free and reusable: taking them as prefix hits
        takes them off the free side."""
        if not self.num_retained_free:  # nothing retained: count the free ones at C speed
            return list(map(_REF_CNT, blocks)).count(0)
        return sum(1 for b in blocks if b.ref_cnt == 0 and not b.retained)

    def cached_hashes(self, group: int = 0) -> dict[BlockHash, BlockId]:
        """A copy of a group's hash → block map (for tests and consistency checks)."""
        return {h: b.block_id for h, b in self._maps[group].items()}

    def group_map(self, group: int) -> dict[BlockHash, KVBlock]:
        """A group's hash → block map, read-only to the caller (its managers look up hits)."""
        return self._maps[group]

    # -- registration -------------------------------------------------------------------------

    def cache_full_blocks(
        self,
        blocks: list[KVBlock],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None = None,
        session_id: str | None = None,
    ) -> None:
        """Make blocks[start:end] findable under block_hashes[start:end].

        `blocks` is the request's block table; an entry may be replaced by an
        already-cached block with the same hash (see BlockPool's docstring).
        `token_ids` are the request's tokens, for the BlockStored event.
        """
        if not self.enable_caching or start >= end:
            return
        if not self._policy.tracks_lineage and self._cache_new_run(
            blocks, start, end, block_hashes
        ):
            if self.keep_tokens:
                bs = self.block_size
                for i in range(start, end):
                    block = blocks[i]
                    block.token_src = token_ids
                    block.token_start = i * bs
                    block.lora_name = lora_name
            if self.record_events:
                self._log.stored(start, end, block_hashes, token_ids, lora_name, session_id)
            return
        # (The table holds no None: typed as a group's only for the shared registration.)
        table = cast("list[KVBlock | None]", blocks)
        self._register(table, start, end, block_hashes, token_ids, lora_name, None, session_id)

    def cache_group_blocks(
        self,
        table: list[KVBlock | None],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        group: int,
        session_id: str | None = None,
    ) -> None:
        """`cache_full_blocks` for a group's block table, whose positions may hold no block
        (None: vLLM's null block, out of a window or a skipped Mamba state): those are not
        cached. As vLLM's, one event covers the range: the hashes of the blocks stored, the
        tokens of every position (an adopted duplicate ends a run, as for a dense model)."""
        if not self.enable_caching or start >= end:
            return
        self._register(table, start, end, block_hashes, token_ids, lora_name, group, session_id)

    def _register(
        self,
        table: list[KVBlock | None],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        group: int | None,
        session_id: str | None,
    ) -> None:
        """Register table[start:end] block by block (group None: a dense model's table, whose
        events name no group). A position's hash cached already adopts the cached block (the
        table's own is freed) and ends the run of new blocks; each run is one BlockStored."""
        cached = self._maps[0 if group is None else group]
        policy = self._policy
        keep = self.keep_tokens
        lineage = policy.tracks_lineage
        bs = self.block_size
        # Where the current run's event starts: its tokens cover every position from there,
        # holding a block or not (a dense table's run starts at its first new block).
        run_start = start
        stored = False  # whether the current run registered a block
        for i in range(start, end):
            block = table[i]
            if block is None:
                continue
            block_hash = block_hashes[i]
            existing = cached.get(block_hash)
            if existing is None:
                block.block_hash = block_hash
                block.parent_hash = block_hashes[i - 1] if i > 0 else None
                cached[block_hash] = block
                if keep:
                    block.token_src = token_ids
                    block.token_start = i * bs
                    block.lora_name = lora_name
                if lineage:
                    parent = cached.get(block_hashes[i - 1]) if i > 0 else None
                    policy.on_cached(block, parent)
                stored = True
                continue
            if existing is not block:
                self.touch((existing,))
                table[i] = existing
                self.free_blocks((block,))
            if stored:
                if self.record_events:
                    self._log.stored_run(table, run_start, i, block_hashes, token_ids,
                                         lora_name, group, session_id)  # fmt: skip
                stored = False
            run_start = i + 1
        if stored and self.record_events:
            self._log.stored_run(table, run_start, end, block_hashes, token_ids, lora_name,
                                 group, session_id)  # fmt: skip

    def _cache_new_run(
        self, blocks: list[KVBlock], start: int, end: int, block_hashes: Sequence[BlockHash]
    ) -> bool:
        """`cache_full_blocks`' common case, at C level where it can be: no hash of
        blocks[start:end] is cached yet (nor twice among them), so every block is registered
        as itself, all in one run (no lineage to count: its policy needs each block's parent
        as it is cached). False (nothing changed): the per-block path must run."""
        cached = self._cached
        hashes = block_hashes[start:end]
        table = blocks[start:end]
        # (A short table or hash list: the per-block path raises where it runs out.)
        if len(table) != end - start or len(hashes) != end - start:
            return False
        before = len(cached)
        # One probe per hash (a lookup then an insert took two, in a map of up to the
        # pool's size): `setdefault` inserts a new hash and leaves a cached one as it is.
        got = list(map(cached.setdefault, hashes, table))
        if len(cached) - before != len(hashes):  # a hash cached already, or twice: undo
            for block_hash, block, mapped in zip(hashes, table, got, strict=True):
                if mapped is block and block.block_hash != block_hash:  # (inserted now)
                    del cached[block_hash]
            return False
        parents = block_hashes[start - 1 : end - 1] if start else [None, *hashes[:-1]]
        for block, block_hash, parent in zip(table, hashes, parents, strict=True):
            block.block_hash = block_hash
            block.parent_hash = parent
        return True

    def announce_hit(
        self,
        n: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
        group: int | None = None,
    ) -> None:
        """A BlockStored for a request's first `n` blocks, found cached (vLLM 0.34's
        kv_cache_report_mode "full": a gateway learns what each request reused)."""
        if not self.record_events or n <= 0:
            return
        self._log.hit(n, block_hashes, token_ids, lora_name, session_id, group)
