"""The hybrid KV coordinator: one manager per KV cache group behind the scheduler's KV door."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.group_managers import NEVER, Table, make_group_manager
from mocker.kv.hashing import BlockHash
from mocker.kv.spec import KVLayout, SpecKind
from mocker.request import Request

__all__ = ["GroupHits", "HybridKVCacheManager"]


@dataclass(slots=True)
class GroupHits:
    """A prefix hit valid in every group: each group's table for it. Its length is the hit
    in blocks, as a dense model's list of hit blocks (the scheduler multiplies it by the
    block size)."""

    tables: list[Table]
    num_blocks: int

    def __len__(self) -> int:
        return self.num_blocks


_NO_HIT = GroupHits([], 0)


class HybridKVCacheManager:
    """KVCacheManager's interface for a model with several KV cache groups (vLLM's
    HybridKVCacheCoordinator with its single-type managers): one pool, one block table per
    group per request (`request.group_blocks`; `request.blocks` is group 0's, of which only
    the length is read elsewhere), allocation in every group or none.

    Every group has the engine's block size (see mocker.kv.spec), so positions line up:
    every table of a request has the same length.
    """

    __slots__ = ("_attention", "_full", "_others", "_releasing", "block_size",
                 "enable_caching", "layout", "managers", "pool", "used")  # fmt: skip

    def __init__(self, pool: BlockPool, layout: KVLayout) -> None:
        self.pool = pool
        self.layout = layout
        self.block_size = pool.block_size
        self.enable_caching = pool.enable_caching
        self.managers = [make_group_manager(g, pool, pool.enable_caching) for g in layout.groups]
        # Hits: full attention first (its hit only shrinks after), then the others until
        # none shrinks the hit further (vLLM's fixed point).
        self._full = [m for m, g in zip(self.managers, layout.groups, strict=True)
                      if g.kind is SpecKind.FULL]  # fmt: skip
        self._others = [m for m in self.managers if m not in self._full]
        # Blocks each group holds referenced (for the timing model and per-group usage).
        self.used = [0] * len(self.managers)
        self._attention = [g.is_attention for g in layout.groups]
        # Groups that release blocks as a request advances (sliding windows, Mamba states).
        self._releasing = [i for i, m in enumerate(self.managers) if m.releases]

    # -- read-only views ------------------------------------------------------------------------

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_reusable(self) -> int:
        return self.pool.num_reusable

    @property
    def num_used(self) -> int:
        return self.pool.num_used

    @property
    def awaiting_displaced(self) -> bool:
        return self.pool.num_displaced > 0

    def group_usage(self) -> list[float]:
        """Each group's share of the pool in use."""
        n = self.pool.num_blocks
        return [u / n for u in self.used]

    def attention_blocks(self) -> int:
        """Blocks of attention groups in use: what a pass's attention reads (a sliding
        window's are capped by its release of old blocks; a Mamba group's state does not
        grow with context, so it is not counted)."""
        return sum(u for u, a in zip(self.used, self._attention, strict=True) if a)

    # -- prefix hits ----------------------------------------------------------------------------

    def find_hit_blocks(self, hashes: Sequence[BlockHash], max_blocks: int) -> int:
        """The longest prefix (in blocks, at most `max_blocks`) every group can serve."""
        return self._find_hits(hashes, max_blocks)[0]

    def _find_hits(self, hashes: Sequence[BlockHash], max_blocks: int) -> tuple[int, int]:
        """(the prefix every group can serve, the longest one group alone can: full
        attention's), in blocks."""
        hit = max_blocks
        for manager in self._full:
            hit = min(hit, manager.find_hit(hashes, hit))
        longest = hit if self._full else 0
        others = self._others
        changed = True
        while changed and hit:
            changed = False
            for manager in others:
                n = manager.find_hit(hashes, hit)
                if n < hit:
                    hit, changed = n, True
        return hit, longest

    def get_computed_blocks(self, request: Request, max_blocks: int | None = None) -> GroupHits:
        """Longest cached prefix valid in every group, capped at num_tokens − 1 tokens (and
        at `max_blocks`)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return _NO_HIT
        hashes = request.block_hashes
        cap = (request.num_tokens - 1) // self.block_size
        hit, longest = self._find_hits(hashes, cap if max_blocks is None else min(max_blocks, cap))
        if max_blocks is None:
            # vLLM's shared-prefix boundary: a prefix full attention has cached that a
            # sparse group (a Mamba state) lacks; a Mamba prefill stops there to save one.
            request.shared_prefix_boundary = longest * self.block_size if longest > hit else 0
        if not hit:
            return _NO_HIT
        if request.report_hits and max_blocks is None:
            for g in range(len(self.managers)):
                self.pool.announce_hit(hit, hashes, request.all_token_ids, request.lora_name,
                                       request.session_id, g)  # fmt: skip
        return GroupHits([m.hit_table(hashes, hit) for m in self.managers], hit)

    # -- allocation -----------------------------------------------------------------------------

    def _tables(self, request: Request) -> list[Table]:
        tables = request.group_blocks
        if tables is None:
            tables = [[] for _ in self.managers]
            request.group_blocks = tables
            request.blocks = cast(list[KVBlock], tables[0])
        return tables

    def _release_skipped(self, request: Request, tables: list[Table], num_computed: int) -> None:
        """Free the blocks no group needs any more (out of a window, superseded states);
        their hashes stay cached. Sets when to look again."""
        pool, used = self.pool, self.used
        recheck = NEVER
        for g in self._releasing:
            manager = self.managers[g]
            table = tables[g]
            skip = min(manager.num_skipped(num_computed), len(table))
            if skip:
                removed: list[KVBlock] = []
                # Back to the first already released: a window's blocks are contiguous. A
                # Mamba table has gaps (a pass over several blocks saves one state), so it
                # is walked to its start (it holds a state or two).
                sparse = manager.sparse
                for i in range(skip - 1, -1, -1):
                    block = table[i]
                    if block is None:
                        if sparse:
                            continue
                        break
                    removed.append(block)
                    table[i] = None
                if removed:
                    before = pool.num_used
                    pool.free_blocks(removed)
                    used[g] -= before - pool.num_used
            recheck = min(recheck, manager.next_release(num_computed))
        request.kv_recheck = recheck

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: GroupHits | Sequence[KVBlock] = (),
        *,
        loaded: bool = False,
    ) -> bool:
        """Room for `num_new_tokens` more tokens after the hit, in every group or none:
        returns False, changing no table, when the pool is short. `loaded`: the tokens are
        loaded from a tier, not computed, so a sliding window's positions already out of
        the window when the load ends get no block (as vLLM skips them).

        Every table of a request has the same length (positions line up), so the blocks a
        pass needs follow from one number: how many positions the tables grow by."""
        hits = computed_blocks if isinstance(computed_blocks, GroupHits) else _NO_HIT
        tables = self._tables(request)
        computed = request.num_computed_tokens
        if computed >= request.kv_recheck:
            self._release_skipped(request, tables, computed)
        num_hit = hits.num_blocks
        bs = self.block_size
        total = computed + num_hit * bs + num_new_tokens
        end = -(-total // bs)
        start = len(tables[0]) + num_hit  # the positions the tables hold after the hit
        grow = end - start
        if grow <= 0 and not num_hit:
            return True
        pool = self.pool
        managers = self.managers
        # Per group, the first position that needs a block, and how many blocks it takes.
        firsts = [start] * len(managers)
        if loaded:
            for g, m in enumerate(managers):
                if m.releases and not m.sparse:
                    firsts[g] = max(start, min(m.num_skipped(total), end))
        needs = [
            m.num_new_blocks(len(t) + num_hit, grow) if m.sparse else max(0, end - first)
            for m, t, first in zip(managers, tables, firsts, strict=True)
        ]
        need = sum(needs)
        if num_hit:
            # Hits sitting on the free side stop being free when they are taken.
            need += sum(1 for t in hits.tables for b in t if b is not None and b.ref_cnt == 0)
        if need > pool.num_reusable:
            return False
        used = self.used
        if num_hit:
            for g, hit_table in enumerate(hits.tables):
                before = pool.num_used
                pool.touch([b for b in hit_table if b is not None])
                used[g] += pool.num_used - before
                tables[g].extend(hit_table)
            request.num_cached_blocks = num_hit  # the hit is cached; the rest is not
        new = pool.get_new_blocks(sum(needs)) if grow > 0 else []
        at = 0
        for g, manager in enumerate(managers):
            n = needs[g]
            blocks = new[at : at + n]
            at += n
            for block in blocks:
                block.group = g
            used[g] += n
            if firsts[g] > start:  # loaded positions already out of the window: null
                tables[g].extend([None] * (firsts[g] - start))
            manager.extend(tables[g], max(end, start), blocks)
        if num_hit or computed == 0:
            self._release_skipped(request, tables, computed + num_hit * bs)
        return True

    def append_blocks(self, request: Request, num_blocks: int) -> None:
        raise NotImplementedError("decode runs are stepped pass by pass for a hybrid model")

    # -- caching and freeing --------------------------------------------------------------------

    def cache_blocks(self, request: Request, num_tokens: int | None = None) -> None:
        """Register the blocks complete in each group after its first `num_tokens` tokens
        (default: its computed ones; a Mamba group's state only at the boundary a pass
        ends on: the others are null)."""
        if num_tokens is None:
            num_tokens = request.num_computed_tokens
        num_full = num_tokens // self.block_size
        if num_full <= request.num_cached_blocks:
            return
        if self.enable_caching:
            tables = self._tables(request)
            pool = self.pool
            start = request.num_cached_blocks
            for g, table in enumerate(tables):
                before = pool.num_used
                pool.cache_group_blocks(table, start, num_full, request.block_hashes,
                                        request.all_token_ids, request.lora_name, g,
                                        request.session_id)  # fmt: skip
                self.used[g] -= before - pool.num_used  # an adopted duplicate freed its own
        request.num_cached_blocks = num_full

    def free_tables(self, tables: list[Table]) -> None:
        """Release the blocks of a request's tables, each tail first (the request may be
        gone: a write-through policy frees a finished one's once its copies end)."""
        pool, used = self.pool, self.used
        for g, table in enumerate(tables):
            held = [b for b in reversed(table) if b is not None]
            if held:
                before = pool.num_used
                pool.free_blocks(held)
                used[g] -= before - pool.num_used

    def release_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference from each block, in this order (a copy's pin ends)."""
        pool, used = self.pool, self.used
        for block in blocks:
            before = pool.num_used
            pool.free_blocks((block,))
            if pool.num_used != before:
                used[block.group] -= 1

    def free(self, request: Request) -> None:
        """Release every group's blocks, each table tail first."""
        tables = request.group_blocks
        if tables is not None:
            self.free_tables(tables)
            request.group_blocks = None
        request.blocks = []
        request.num_cached_blocks = 0
        request.kv_recheck = NEVER

    def finish_load(self, request: Request) -> None:
        """Chunks loaded from a tier landed in the request's reserved blocks, in every group
        (each Mamba group's one state, at the load's end): computed, and cached."""
        request.num_computed_tokens = len(self._tables(request)[0]) * self.block_size
        self.cache_blocks(request)

    def finish_pull(self, request: Request) -> None:
        raise NotImplementedError("P/D pulls are not modelled for hybrid models yet")
