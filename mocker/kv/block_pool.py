"""The device (G1) block pool: block ids, reference counts, the prefix-cache map and KV events."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from itertools import takewhile
from operator import attrgetter, is_not
from typing import cast

from mocker.config import EvictionPolicyName
from mocker.kv.block import BlockId, KVBlock
from mocker.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    parents_first,
    stored_event,
)
from mocker.kv.eviction import EvictionPolicy, make_policy
from mocker.kv.hashing import BlockHash
from mocker.kv.spec import KVCacheGroup

__all__ = ["BlockPool"]

_NOT_NONE = partial(is_not, None)  # C-level "is not None" for takewhile

_REF_CNT = attrgetter("ref_cnt")
_HASH = attrgetter("block_hash")
_PARENT = attrgetter("parent_hash")


class BlockPool:
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
    """

    __slots__ = (
        "_cached",
        "_displaced",
        "_events",
        "_group_meta",
        "_maps",
        "_policy",
        "block_size",
        "blocks",
        "enable_caching",
        "keep_tokens",
        "num_displaced",
        "num_retained_free",
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
        keep_tokens: bool = False,
        groups: Sequence[KVCacheGroup] = (),
    ) -> None:
        """`keep_tokens`: cached blocks remember their tokens (a lower tier copies them);
        `groups`: the KV cache groups of a hybrid model (none or one: a dense one)."""
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.record_events = record_events
        # A copy in a lower tier records its block's tokens; so does a BlockStored
        # re-announced after a reset.
        self.keep_tokens = keep_tokens or record_events
        # (`BlockId(i)` is a Python call per block: one cast for all of them.)
        self.blocks = list(map(KVBlock, cast("Iterable[BlockId]", range(num_blocks))))
        # Handed out 0, 1, 2, … first.
        self._policy: EvictionPolicy = make_policy(eviction_policy, self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        # One hash map per group; group 0's is `_cached` (a dense model has no other).
        self._maps: list[dict[BlockHash, KVBlock]] = [self._cached]
        self._maps.extend({} for _ in groups[1:])
        # Per group, what its events say of it (None: a dense model's events say nothing).
        self._group_meta: list[tuple[str, int | None]] | None = None
        if len(groups) > 1 or (groups and groups[0].kind != "full_attention"):
            self._group_meta = [(g.kind.value, g.sliding_window) for g in groups]
        self._events: list[KVEvent] = []
        self.num_used = 0
        self.num_retained_free = 0  # free cached blocks their holder must copy before reuse
        self.num_displaced = 0  # evicted retained blocks not yet returned by their holder
        self._displaced: list[KVBlock] = []

    # -- capacity -----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Free and cached-free blocks (vLLM's free count)."""
        return len(self._policy)

    @property
    def num_reusable(self) -> int:
        """Blocks `get_new_blocks` can hand out now: free ones minus retained ones."""
        return len(self._policy) - self.num_retained_free

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: cached blocks nobody references count as free; a
        displaced slot is still occupied."""
        return (self.num_used + self.num_displaced) / len(self.blocks)

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    # -- prefix cache -------------------------------------------------------------------------

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
        cached = self._maps[group]
        keep = self.keep_tokens
        lineage = self._policy.tracks_lineage
        bs = self.block_size
        stored: list[BlockHash] = []
        run_start = start
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
                    self._policy.on_cached(block, parent)
                stored.append(block_hash)
                continue
            if existing is not block:
                self.touch((existing,))
                table[i] = existing
                self.free_blocks((block,))
            if stored:
                self._record_group_stored(run_start, i, stored, block_hashes, token_ids,
                                          lora_name, group, session_id)  # fmt: skip
                stored = []
            run_start = i + 1
        if stored:
            self._record_group_stored(run_start, end, stored, block_hashes, token_ids,
                                      lora_name, group, session_id)  # fmt: skip

    def _record_group_stored(
        self,
        start: int,
        end: int,
        stored: list[BlockHash],
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        group: int,
        session_id: str | None,
    ) -> None:
        if not self.record_events:
            return
        bs = self.block_size
        kind, window = self._group_meta[group] if self._group_meta else ("full_attention", None)
        self._events.append(
            BlockStored(
                block_hashes=tuple(stored),
                parent_block_hash=block_hashes[start - 1] if start > 0 else None,
                token_ids=tuple(token_ids[start * bs : end * bs]),
                block_size=bs,
                lora_name=lora_name,
                group_idx=group,
                kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window,
                session_id=session_id,
            )
        )

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
        already-cached block with the same hash (see the class docstring).
        `token_ids` are the request's tokens, for the BlockStored event.
        """
        if not self.enable_caching or start >= end:
            return
        cached = self._cached
        policy = self._policy
        keep = self.keep_tokens
        lineage = policy.tracks_lineage
        if not lineage and self._cache_new_run(blocks, start, end, block_hashes):
            if keep:
                bs = self.block_size
                for i in range(start, end):
                    block = blocks[i]
                    block.token_src = token_ids
                    block.token_start = i * bs
                    block.lora_name = lora_name
            self._record_stored(start, end, block_hashes, token_ids, lora_name, session_id)
            return
        bs = self.block_size
        run_start = -1  # first index of the current run of newly stored blocks
        for i in range(start, end):
            block = blocks[i]
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
                if run_start < 0:
                    run_start = i
                continue
            if existing is not block:
                self.touch((existing,))
                blocks[i] = existing
                self.free_blocks((block,))
            if run_start >= 0:
                self._record_stored(run_start, i, block_hashes, token_ids, lora_name, session_id)
                run_start = -1
        if run_start >= 0:
            self._record_stored(run_start, end, block_hashes, token_ids, lora_name, session_id)

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

    def _record_stored(
        self,
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
    ) -> None:
        if not self.record_events:
            return
        self._events.append(
            stored_event(
                start, end, block_hashes, token_ids, self.block_size, lora_name, session_id
            )
        )

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
        event = stored_event(0, n, block_hashes, token_ids, self.block_size, lora_name,
                             session_id)  # fmt: skip
        if group is not None and self._group_meta is not None:
            kind, window = self._group_meta[group]
            event = replace(event, group_idx=group, kv_cache_spec_kind=kind,
                            kv_cache_spec_sliding_window=window)  # fmt: skip
        self._events.append(event)

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
            self._events.append(self._removed(block_hash, block.group))

    def _removed(self, block_hash: BlockHash, group: int) -> BlockRemoved:
        if self._group_meta is None:
            return BlockRemoved(block_hashes=(block_hash,))
        return BlockRemoved(block_hashes=(block_hash,), group_idx=group)

    # -- retained blocks (write-back) ---------------------------------------------------------

    def retain(self, blocks: Iterable[KVBlock]) -> None:
        """Cached blocks whose holder must copy them before their slots are reused (blocks
        already retained, or no longer cached, are left as they are)."""
        for block in blocks:
            if block.retained or block.block_hash is None:
                continue
            block.retained = True
            if block.ref_cnt == 0:
                self.num_retained_free += 1

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
            self._events.append(self._removed(block_hash, block.group))

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

    def set_retained(self, block_hash: BlockHash, retained: bool) -> None:
        """Retain (or release) the cached block with this hash, if any: its holder lost (or
        gained) a copy elsewhere."""
        block = self._cached.get(block_hash)
        if block is None or block.retained == retained:
            return
        block.retained = retained
        if block.ref_cnt == 0:
            self.num_retained_free += 1 if retained else -1

    # -- allocation ---------------------------------------------------------------------------

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

    def free_blocks_reversed(self, blocks: list[KVBlock]) -> None:
        """`free_blocks(reversed(blocks))`: a request's blocks, tail first (the compiled pool
        walks the list backwards instead of building the reversed one)."""
        self.free_blocks(reversed(blocks))

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
            self._events.append(AllBlocksCleared())
            bs = self.block_size
            meta = self._group_meta
            for group, (kept, _) in enumerate(kept_by_group):
                kind, window = meta[group] if meta else (None, None)
                self._events.extend(
                    BlockStored(
                        block_hashes=(b.cached_hash,),
                        parent_block_hash=b.parent_hash,
                        token_ids=b.token_ids(bs),
                        block_size=bs,
                        lora_name=b.lora_name,
                        group_idx=group if meta else None,
                        kv_cache_spec_kind=kind,
                        kv_cache_spec_sliding_window=window,
                    )
                    for b in kept
                )
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

    # -- events -------------------------------------------------------------------------------

    def take_events(self) -> list[KVEvent]:
        """Drain the events recorded since the last call."""
        if not self._events:
            return []
        events, self._events = self._events, []
        return events
