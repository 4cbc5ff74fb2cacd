"""Hybrid KV coordinator: hits valid in every group, all-or-none allocation, releases, freeing."""

import random
from collections.abc import Sequence
from typing import Any

import pytest

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.kv.block_pool import BlockPool
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kv.group_managers import NEVER, Table
from mocker.kv.hashing import BlockHash
from mocker.request import Request
from tests.support.engines import core_request, make_core, req
from tests.support.hybrid import (
    HASHES,
    cache_free_blocks,
    check_groups,
    group_tables,
    hybrid_shape,
)
from tests.support.pools import python_pool

BS = 4


def _coordinator(
    *types: str, num_blocks: int = 32, window: int = 8, caching: bool = True
) -> tuple[BlockPool, HybridKVCacheManager]:
    """A coordinator on a pool of 4-token blocks (its managers use the pool's block size)."""
    layout = EngineConfig(model=hybrid_shape(types, window=window)).layout
    pool = BlockPool(num_blocks, BS, groups=layout.groups, enable_caching=caching)
    return pool, HybridKVCacheManager(pool, layout)


def _with_hashes(name: str, hashes: Sequence[BlockHash], num_tokens: int) -> Request:
    """A request of `num_tokens` tokens whose blocks hash to `hashes`."""
    r = core_request(name, range(num_tokens), 8)
    r.block_hashes = list(hashes)
    return r


def _pass(kv: HybridKVCacheManager, r: Request, n: int) -> None:
    """Allocate a pass of n tokens, compute them, cache what became full."""
    assert kv.allocate_slots(r, n)
    r.num_computed_tokens += n
    kv.cache_blocks(r)


def _held(table: Table) -> int:
    return sum(1 for b in table if b is not None)


# -- hits ---------------------------------------------------------------------------------------


def test_hit_is_capped_by_the_mamba_states() -> None:
    pool, kv = _coordinator("mamba", "full_attention")  # group 0 Mamba, group 1 full
    full = cache_free_blocks(pool, 1, range(10))
    states = cache_free_blocks(pool, 0, [2, 6])  # states after 3 and 7 blocks
    # 41 tokens: at most (41 − 1) // 4 = 10 blocks; full serves 10, Mamba 7.
    hits = kv.get_computed_blocks(_with_hashes("a", HASHES, 41))
    assert len(hits) == 7
    assert hits.tables[0] == [None] * 6 + [states[6]]
    assert hits.tables[1] == [full[i] for i in range(7)]
    # 28 tokens: at most 27 // 4 = 6 blocks; Mamba then serves 3.
    assert len(kv.get_computed_blocks(_with_hashes("b", HASHES[:7], 28))) == 3
    # 12 tokens: at most 11 // 4 = 2 blocks, no state at position 0 or 1: no hit.
    assert len(kv.get_computed_blocks(_with_hashes("c", HASHES[:3], 12))) == 0


def test_hit_is_a_fixed_point_of_every_group() -> None:
    pool, kv = _coordinator("sliding_attention", "mamba", "full_attention")
    cache_free_blocks(pool, 0, [0, 1, 2, 5, 6])  # sliding, window 8: needs 2 blocks before a hit
    cache_free_blocks(pool, 1, [1, 4])  # Mamba states after 2 and 5 blocks
    cache_free_blocks(pool, 2, range(10))
    # full 10 → sliding 7 (run 5, 6) → Mamba 5 (state at 4) → sliding 3 (run 1, 2)
    # → Mamba 2 (state at 1) → sliding 2 (run 0, 1) → Mamba 2: stable.
    assert kv.find_hit_blocks(HASHES, 10) == 2
    hits = kv.get_computed_blocks(_with_hashes("a", HASHES, 41))
    assert len(hits) == 2
    assert [len(t) for t in hits.tables] == [2, 2, 2]


def test_no_hit_without_prefix_caching() -> None:
    pool, kv = _coordinator("sliding_attention", "full_attention", caching=False)
    r = _with_hashes("a", HASHES, 41)
    _pass(kv, r, 41)
    assert pool.cached_hashes(0) == {} and pool.cached_hashes(1) == {}
    assert len(kv.get_computed_blocks(_with_hashes("b", HASHES, 41))) == 0


# -- allocation ---------------------------------------------------------------------------------


def test_allocation_is_all_or_none() -> None:
    # A window of 64: nothing is released by 16 tokens.
    pool, kv = _coordinator("sliding_attention", "full_attention", num_blocks=9, window=64)
    r = _with_hashes("a", HASHES[:5], 20)
    # 20 tokens: 5 blocks in each group = 10 > 9.
    assert not kv.allocate_slots(r, 20)
    assert all(t == [] for t in r.group_blocks or [])
    assert r.blocks == [] and pool.num_used == 0 and kv.used == [0, 0]
    assert kv.allocate_slots(r, 16)  # 4 + 4 = 8 fit
    assert kv.used == [4, 4] and pool.num_used == 8
    r.num_computed_tokens = 16
    # 4 more tokens need one block in each group: 10 > 9, neither group gets one.
    assert not kv.allocate_slots(r, 4)
    assert [len(t) for t in group_tables(r)] == [4, 4] and pool.num_used == 8
    check_groups(pool, kv, [r])


def test_hits_on_free_blocks_count_against_free_space() -> None:
    pool, kv = _coordinator("sliding_attention", "full_attention", num_blocks=6)
    a = _with_hashes("a", HASHES[:3], 12)
    _pass(kv, a, 12)
    kv.free(a)  # 6 cached-free blocks
    b = _with_hashes("b", HASHES[:4], 16)
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 3  # (16 − 1) // 4
    # Revived: sliding 2 (window 8 needs 2 blocks) + full 3; new: 1 + 1. 7 > 6.
    assert not kv.allocate_slots(b, 4, hits)
    assert pool.num_used == 0 and kv.used == [0, 0]
    assert all(blk.ref_cnt == 0 for blk in pool.blocks)
    assert len(pool.cached_hashes(0)) == 3 and len(pool.cached_hashes(1)) == 3


def test_shared_hits_and_free_of_every_group() -> None:
    pool, kv = _coordinator("sliding_attention", "mamba", "full_attention")
    a = _with_hashes("a", HASHES, 41)
    _pass(kv, a, 32)  # ends on a boundary: the Mamba state after 8 blocks is cached
    assert set(pool.cached_hashes(1)) == {HASHES[7]}
    b = _with_hashes("b", HASHES, 41)
    hits = kv.get_computed_blocks(b)  # a still holds everything it hits
    assert len(hits) == 8
    assert kv.allocate_slots(b, 41 - 32, hits)
    b.num_computed_tokens = 41
    check_groups(pool, kv, [a, b])
    full_a, full_b = group_tables(a)[2], group_tables(b)[2]
    assert all(x is y for x, y in zip(full_a, full_b[:8], strict=True))
    assert full_a[0] is not None and full_a[0].ref_cnt == 2
    kv.free(a)
    kv.free(b)
    assert pool.num_used == 0 and kv.used == [0, 0, 0]
    assert a.group_blocks is None and b.blocks == [] and b.kv_recheck == NEVER
    assert len(pool.cached_hashes(2)) == 8  # freed, still cached


def test_blocks_computed_after_a_hit_are_cached() -> None:
    pool, kv = _coordinator("sliding_attention", "full_attention")
    a = _with_hashes("a", HASHES[:3], 12)
    _pass(kv, a, 12)
    kv.free(a)
    tail = [BlockHash(200), BlockHash(201)]
    b = _with_hashes("b", [*HASHES[:3], *tail], 20)
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 3
    assert kv.allocate_slots(b, 8, hits)
    assert b.num_cached_blocks == 3  # the hit, as the dense manager records it
    b.num_computed_tokens = 20
    kv.cache_blocks(b)
    for g in (0, 1):
        assert set(tail) <= set(pool.cached_hashes(g))


def test_new_blocks_never_evict_another_groups_hit() -> None:
    # Group 0 full, group 1 sliding with window 4 (1 block needed before a hit).
    pool, kv = _coordinator("full_attention", "sliding_attention", num_blocks=6, window=4)
    a = _with_hashes("a", HASHES[:3], 12)
    _pass(kv, a, 12)
    kv.free(a)  # free order: full's 2, 1, 0, then sliding's 2, 1, 0
    sliding_hit = pool.group_map(1)[HASHES[2]]
    b = _with_hashes("b", HASHES[:4], 16)
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 3 and hits.tables[1] == [None, None, sliding_hit]
    # Revived 3 + 1, new 1 + 1 = 6: fits.
    assert kv.allocate_slots(b, 4, hits)
    assert group_tables(b)[1][2] is sliding_hit
    assert sliding_hit.group == 1 and sliding_hit.ref_cnt == 1
    assert HASHES[2] in pool.cached_hashes(1)
    check_groups(pool, kv, [b])


# -- releases -----------------------------------------------------------------------------------


def test_sliding_window_blocks_are_released_and_stay_cached() -> None:
    pool, kv = _coordinator("sliding_attention", "full_attention")  # window 8
    r = _with_hashes("a", HASHES, 40)
    _pass(kv, r, 12)
    assert [_held(t) for t in group_tables(r)] == [3, 3]
    assert r.kv_recheck == 11  # (0 + 1) × 4 + 7
    first = group_tables(r)[0][0]
    assert first is not None
    # At 12 computed tokens, block 0 ([0, 4)) is wholly before 12 − 8 + 1 = 5.
    _pass(kv, r, 4)
    sliding, full = group_tables(r)
    assert sliding[0] is None and _held(sliding) == 3 and _held(full) == 4
    assert first.ref_cnt == 0 and HASHES[0] in pool.cached_hashes(0)
    assert kv.used == [3, 4] and pool.num_used == 7
    assert r.kv_recheck == 15  # (1 + 1) × 4 + 7
    # At 16: (16 − 7) // 4 = 2 blocks skipped.
    _pass(kv, r, 4)
    assert group_tables(r)[0][:2] == [None, None] and kv.used == [3, 5]
    assert r.kv_recheck == 19
    assert set(pool.cached_hashes(0)) == set(HASHES[:5])  # 20 tokens: 5 full blocks
    check_groups(pool, kv, [r])
    kv.free(r)
    assert pool.num_used == 0 and kv.used == [0, 0]


def test_mamba_holds_one_state_plus_the_previous_for_one_pass() -> None:
    pool, kv = _coordinator("mamba", "full_attention")
    r = _with_hashes("a", HASHES, 40)
    _pass(kv, r, 8)  # state at position 1, cached: the pass ended on a boundary
    mamba = group_tables(r)[0]
    assert len(mamba) == 2 and mamba[0] is None and mamba[1] is not None
    assert kv.used == [1, 2] and set(pool.cached_hashes(0)) == {HASHES[1]}
    # Set when the pass was allocated, from 0 computed tokens: (0 + 1) × 4 + 1.
    assert r.kv_recheck == 5
    _pass(kv, r, 2)  # to 10 tokens: a new state at position 2, the old one still held
    assert _held(group_tables(r)[0]) == 2 and kv.used == [2, 3]
    assert r.kv_recheck == 9  # from 8: (1 + 1) × 4 + 1
    assert set(pool.cached_hashes(0)) == {HASHES[1]}  # 10 is no boundary
    _pass(kv, r, 2)  # to 12: the previous state is released, the running one cached
    mamba = group_tables(r)[0]
    assert mamba[:2] == [None, None] and mamba[2] is not None and kv.used == [1, 3]
    assert set(pool.cached_hashes(0)) == {HASHES[1], HASHES[2]}
    check_groups(pool, kv, [r])
    _pass(kv, r, 8)  # to 20: one new state, at position 4; the ones between are null
    mamba = group_tables(r)[0]
    assert mamba[:4] == [None, None, mamba[2], None] and mamba[4] is not None
    assert len(mamba) == 5 and kv.used == [2, 5]
    kv.free(r)
    assert pool.num_used == 0 and kv.used == [0, 0]


def test_mamba_without_caching_holds_one_state() -> None:
    pool, kv = _coordinator("mamba", "full_attention", caching=False)
    r = _with_hashes("a", HASHES, 40)
    for _ in range(5):
        _pass(kv, r, 8)
        assert kv.used[0] == 1 and group_tables(r)[0][0] is not None
    assert group_tables(r)[0][1:] == [None] * 9  # the one state stays at position 0
    assert r.kv_recheck == NEVER
    assert pool.cached_hashes(0) == {} and pool.cached_hashes(1) == {}
    kv.free(r)
    assert pool.num_used == 0 and kv.used == [0, 0]


# -- through the engine -------------------------------------------------------------------------


def _core(types: tuple[str, ...], window: int = 8, **kw: Any) -> EngineCore:
    """A small engine (make_core's 4-token blocks: BS) of the hybrid model of these types."""
    return make_core(model=hybrid_shape(types, window=window), **kw)


def test_engine_decodes_release_sliding_blocks_on_recheck() -> None:
    core = _core(("sliding_attention", "full_attention"))  # window 8, block 4
    core.add_request(req("a", range(8), 20, ignore_eos=True))
    r = core.requests["a"]
    kv = core.kv
    assert isinstance(kv, HybridKVCacheManager)
    now = core.step(0.0).end
    assert r.num_computed_tokens == 8 and kv.used == [2, 2]
    while r.num_computed_tokens < 24:  # it ends at 27 (8 + 20 − 1)
        now = core.step(now).end
        # The pass started at c = computed − 1 released (c − 7) // 4 leading blocks.
        c = r.num_computed_tokens - 1
        skipped = max(0, c - 7) // 4
        sliding = group_tables(r)[0]
        assert sliding[:skipped] == [None] * skipped and sliding[skipped] is not None
        assert kv.used[0] == _held(sliding) == len(sliding) - skipped
        assert kv.used[1] == len(group_tables(r)[1])
    # Released, still cached.
    assert set(core.pool.cached_hashes(0)) >= set(r.block_hashes[:4])


def test_engine_mamba_state_follows_the_boundaries() -> None:
    core = _core(("mamba", "full_attention"), block_size=16, max_num_batched_tokens=48)
    assert core.config.block_size == 16  # 16 × ceil(64 / (16 × 16)) = 16
    core.add_request(req("a", range(40), 12, ignore_eos=True))
    r = core.requests["a"]
    kv = core.kv
    assert isinstance(kv, HybridKVCacheManager)

    def mamba_cached() -> set[int]:
        return {r.block_hashes.index(h) for h in core.pool.cached_hashes(0)}

    now = core.step(0.0).end  # [0, 32): the last boundary before 40
    assert r.num_computed_tokens == 32 and kv.used == [1, 2] and mamba_cached() == {1}
    now = core.step(now).end  # [32, 40): a new state, the previous still held
    assert r.num_computed_tokens == 40 and kv.used == [2, 3] and mamba_cached() == {1}
    now = core.step(now).end  # decode from 40 ≥ 33: the old state goes
    assert r.num_computed_tokens == 41 and kv.used == [1, 3]
    while r.num_computed_tokens < 48:
        now = core.step(now).end
    assert kv.used == [1, 3] and mamba_cached() == {1, 2}  # a pass ended on 48
    now = core.step(now).end  # to 49: a new state
    assert kv.used == [2, 4]
    now = core.step(now).end  # from 49: the state of 48 released, still cached
    assert kv.used == [1, 4] and mamba_cached() == {1, 2}
    while core.has_unfinished_requests():
        now = core.step(now).end
    assert core.pool.num_used == 0 and kv.used == [0, 0]


def test_engine_mamba_without_prefix_caching() -> None:
    core = _core(("mamba", "full_attention"), block_size=16, max_num_batched_tokens=48,
                 enable_prefix_caching=False)  # fmt: skip
    core.add_request(req("a", range(40), 12, ignore_eos=True))
    r = core.requests["a"]
    kv = core.kv
    assert isinstance(kv, HybridKVCacheManager)
    now = core.step(0.0).end
    assert r.num_computed_tokens == 40  # no split at a boundary
    while core.has_unfinished_requests():
        assert kv.used[0] == 1
        now = core.step(now).end
    assert core.pool.cached_hashes(0) == {} and core.pool.cached_hashes(1) == {}
    assert core.pool.num_used == 0 and kv.used == [0, 0]


def test_engine_hit_needs_a_mamba_state() -> None:
    core = _core(("mamba", "full_attention"), block_size=16, max_num_batched_tokens=256)
    a = list(range(1000, 1070))
    core.add_request(req("a", a, 1, ignore_eos=True))
    now = core.step(0.0).end  # [0, 64): the last boundary before 70, its state cached
    now = core.step(now).end  # [64, 70): no boundary
    assert not core.has_unfinished_requests()
    # Full attention caches blocks 0..3 (64 tokens), Mamba only the state after block 3.
    core.add_request(req("b", [*a[:50], *range(2000, 2030)], 1, ignore_eos=True))
    b = core.requests["b"]
    now = core.step(now).end
    assert b.num_cached_tokens == 0  # 48 tokens' blocks shared, but no state there
    # vLLM 0.34: its pass stops where the shared prefix ends, 48, to save a state there
    # (then at the last boundary, (80 − 1) // 16 × 16 = 64).
    assert b.num_computed_tokens == 48
    now = core.step(now).end
    assert b.num_computed_tokens == 64
    core.add_request(req("c", [*a[:64], *range(3000, 3016)], 1, ignore_eos=True))
    c = core.requests["c"]
    core.step(now)
    assert c.num_cached_tokens == 64  # the state after 64 tokens


# -- property: counters, conservation and the events' index ----------------------------------


def _random_workload(caching: bool, seed: int, steps: int = 250) -> tuple[int, int]:
    """Requests sharing prefixes on a small pool (preemptions), aborts and a cache reset; the
    invariants are checked after every step. Returns the number of preemptions and of
    requests admitted on a prefix hit."""
    core = _core(("sliding_attention", "mamba", "full_attention"), window=40, block_size=16,
                 num_gpu_blocks=20, max_num_seqs=4, max_num_batched_tokens=48,
                 enable_kv_cache_events=True, enable_prefix_caching=caching)  # fmt: skip
    pool, kv = core.pool, core.kv
    assert isinstance(kv, HybridKVCacheManager)
    groups = range(len(kv.used))
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000, 2000) for _ in range(60)] for _ in range(3)]
    index: set[tuple[int | None, BlockHash]] = set()
    now, n, hit_tokens = 0.0, 0, 0
    added: list[Request] = []
    for step in range(steps):
        if rng.random() < 0.3 and len(core.requests) < 6:
            prompt = rng.choice(prefixes)[: rng.choice([5, 16, 32, 40, 48, 60])]
            prompt += [rng.randrange(2000, 3000) for _ in range(rng.randrange(1, 30))]
            core.add_request(req(f"r{n}", prompt, rng.randrange(1, 25), ignore_eos=True))
            added.append(core.requests[f"r{n}"])
            n += 1
        events: list[KVEvent] = []
        if rng.random() < 0.03 and core.requests:
            core.abort_request(rng.choice(sorted(core.requests)), now)
        if step == steps // 2:
            events += core.reset_prefix_cache(now)[1].kv_events
        res = core.step(now)
        now = res.end
        for event in [*events, *res.kv_events]:
            if isinstance(event, BlockStored):
                stored = {(event.group_idx, h) for h in event.block_hashes}
                assert not stored & index, step  # a block is announced once
                index |= stored
            elif isinstance(event, BlockRemoved):
                index.difference_update((event.group_idx, h) for h in event.block_hashes)
            else:
                assert isinstance(event, AllBlocksCleared)
                index.clear()
        assert index == {(g, h) for g in groups for h in pool.cached_hashes(g)}, step
        check_groups(python_pool(pool), kv, core.requests.values())
        # Metric identities: the usage gauge is every group's share summed; hits are counted
        # once per admitted request, and never exceed what was queried.
        snap = core.snapshot()
        assert res.stats.kv_usage == snap.kv_usage == pool.num_used / pool.num_blocks
        assert snap.kv_usage == pytest.approx(sum(snap.group_usage))
        assert 0 <= res.stats.prefix_hits <= res.stats.prefix_queries
        hit_tokens += res.stats.prefix_hits
    preemptions = core.scheduler.num_preemptions
    while core.has_unfinished_requests():
        res = core.step(now)
        now = res.end
        hit_tokens += res.stats.prefix_hits
    assert pool.num_used == 0 and kv.used == [0] * len(groups)
    assert hit_tokens == sum(r.num_cached_tokens for r in added if r.num_cached_tokens > 0)
    return preemptions, sum(1 for r in added if r.num_cached_tokens > 0)


def test_random_workload_without_prefix_caching_keeps_the_counts() -> None:
    preemptions, hits = _random_workload(caching=False, seed=1)
    assert preemptions > 0 and hits == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_random_workload_with_prefix_caching_keeps_the_counts(seed: int) -> None:
    preemptions, hits = _random_workload(caching=True, seed=seed)
    assert preemptions > 0 and hits > 0


def test_engine_preemption_and_abort_free_every_group() -> None:
    # Two requests decoding in a pool too small for both: the newest is preempted and holds
    # nothing in any group; aborting both leaves every group's count at zero.
    core = _core(("sliding_attention", "mamba", "full_attention"), block_size=16,
                 num_gpu_blocks=24, max_num_batched_tokens=64)  # fmt: skip
    kv = core.kv
    assert isinstance(kv, HybridKVCacheManager)
    core.add_request(req("a", range(100, 148), 120, ignore_eos=True))
    core.add_request(req("b", range(300, 348), 120, ignore_eos=True))
    a, b = core.requests["a"], core.requests["b"]
    now = 0.0
    while not b.num_preemptions:
        now = core.step(now).end
        assert a.num_preemptions == 0
    assert b.group_blocks is None and b.blocks == []
    held = [_held(t) for t in group_tables(a)]
    assert kv.used == held and core.pool.num_used == sum(held)
    core.abort_request("a", now)
    core.abort_request("b", now)
    assert kv.used == [0, 0, 0] and core.pool.num_used == 0
