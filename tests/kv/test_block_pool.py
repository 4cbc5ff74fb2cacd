"""Block pool: vLLM's free-queue order, prefix-cache map, reference counts, events."""

from collections.abc import Iterable, Sequence

import pytest

from mocker.config_choices import EvictionPolicyName
from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from mocker.kv.eviction import LRUPolicy
from mocker.kv.hashing import BlockHash
from tests.support.hashes import as_hashes, hash_tuple, hashes

BS = 2


def _pool(
    n: int = 6,
    *,
    enable_caching: bool = True,
    eviction_policy: EvictionPolicyName = EvictionPolicyName.LRU,
) -> BlockPool:
    return BlockPool(
        n, BS, record_events=True, enable_caching=enable_caching, eviction_policy=eviction_policy
    )


def _order(pool: BlockPool) -> list[int]:
    policy = pool.policy
    assert isinstance(policy, LRUPolicy)
    return [b.block_id for b in policy.order()]


def _cache(
    pool: BlockPool,
    blocks: Iterable[KVBlock],
    hashes: Sequence[int],
    start: int = 0,
    end: int | None = None,
    tokens: Sequence[int] | None = None,
) -> list[KVBlock]:
    table = list(blocks)
    end = len(table) if end is None else end
    tokens = tokens if tokens is not None else list(range(len(hashes) * BS))
    pool.cache_full_blocks(table, start, end, as_hashes(hashes), tokens)
    return table


def test_fresh_pool_hands_out_ids_in_order() -> None:
    pool = _pool()
    assert [b.block_id for b in pool.get_new_blocks(3)] == [0, 1, 2]
    assert pool.num_free == 3 and pool.num_used == 3


def test_free_order_tail_first_and_unhashed_before_cached() -> None:
    pool = _pool()
    a = pool.get_new_blocks(3)  # 0, 1, 2
    b = pool.get_new_blocks(2)  # 3, 4
    _cache(pool, a, [101, 102, 103])
    _cache(pool, b, [201, 202], end=1)  # block 4 stays unhashed (partial block)
    assert _order(pool) == [5]
    pool.free_blocks(reversed(a))  # tail first: 2, 1, 0 appended
    assert _order(pool) == [5, 2, 1, 0]
    pool.free_blocks(reversed(b))  # 4 is unhashed -> head; 3 is cached -> tail
    assert _order(pool) == [4, 5, 2, 1, 0, 3]
    # A cached block stays findable until it is actually reused.
    assert pool.lookup(BlockHash(103)) is a[2]
    pool.take_events()
    got = pool.get_new_blocks(3)
    assert [x.block_id for x in got] == [4, 5, 2]
    assert pool.lookup(BlockHash(103)) is None and pool.lookup(BlockHash(102)) is a[1]
    assert pool.take_events() == [BlockRemoved(block_hashes=hash_tuple(103))]


def test_touch_revives_cached_free_block() -> None:
    pool = _pool()
    a = pool.get_new_blocks(2)
    _cache(pool, a, [1, 2])
    pool.free_blocks(reversed(a))
    hit = pool.lookup(BlockHash(1))
    assert hit is a[0] and hit.ref_cnt == 0
    pool.touch([hit])
    assert hit.ref_cnt == 1 and pool.num_used == 1
    assert 0 not in _order(pool)
    pool.touch([hit])
    assert hit.ref_cnt == 2 and pool.num_used == 1
    pool.free_blocks([hit, hit])
    assert _order(pool)[-1] == 0


def test_stored_events_carry_chain_and_tokens() -> None:
    pool = _pool()
    a = pool.get_new_blocks(3)
    tokens = [10, 11, 12, 13, 14, 15]
    _cache(pool, a, [7, 8, 9], end=2, tokens=tokens)
    _cache(pool, a, [7, 8, 9], start=2, end=3, tokens=tokens)
    assert pool.take_events() == [
        BlockStored(
            block_hashes=hash_tuple(7, 8),
            parent_block_hash=None,
            token_ids=(10, 11, 12, 13),
            block_size=BS,
        ),
        BlockStored(
            block_hashes=hash_tuple(9),
            parent_block_hash=BlockHash(8),
            token_ids=(14, 15),
            block_size=BS,
        ),
    ]
    assert pool.take_events() == []


def test_duplicate_hash_adopts_the_cached_block() -> None:
    pool = _pool()
    first = _cache(pool, pool.get_new_blocks(2), [1, 2])
    second = pool.get_new_blocks(3)  # ids 2, 3, 4: computed the same prefix concurrently
    pool.take_events()
    table = _cache(pool, second, [1, 2, 5])
    assert table[0] is first[0] and table[1] is first[1]
    assert table[2] is second[2]
    assert first[0].ref_cnt == 2 and second[0].ref_cnt == 0 and second[0].block_hash is None
    # Only the genuinely new block is announced; the released copies are reused first.
    assert pool.take_events() == [
        BlockStored(
            block_hashes=hash_tuple(5),
            parent_block_hash=BlockHash(2),
            token_ids=(4, 5),
            block_size=BS,
        )
    ]
    assert _order(pool)[:2] == [3, 2]
    assert pool.num_used == 3


def test_over_free_and_over_allocate_are_errors() -> None:
    pool = _pool(2)
    blocks = pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="cannot allocate"):
        pool.get_new_blocks(1)
    pool.free_blocks(blocks)
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks(blocks[:1])


def test_caching_disabled_keeps_nothing() -> None:
    pool = _pool(enable_caching=False)
    a = pool.get_new_blocks(2)
    _cache(pool, a, [1, 2])
    assert pool.lookup(BlockHash(1)) is None and pool.take_events() == []


def test_reset_prefix_cache_clears_everything_when_idle() -> None:
    pool = _pool()
    a = pool.get_new_blocks(2)
    _cache(pool, a, [1, 2])
    pool.free_blocks(reversed(a))
    pool.take_events()
    assert pool.reset_prefix_cache() == 2
    assert pool.cached_hashes() == {} and pool.num_free == 6
    assert pool.take_events() == [AllBlocksCleared()]
    # Cleared blocks hold nothing: they are handed out before any cached block.
    assert [b.block_id for b in pool.get_new_blocks(2)] == [1, 0]


def test_reset_prefix_cache_keeps_referenced_chains_and_reannounces_them() -> None:
    pool = _pool(8, eviction_policy=EvictionPolicyName.LINEAGE)
    a = pool.get_new_blocks(3)  # a chain 1 <- 2 <- 3, tokens 0..5
    _cache(pool, a, [1, 2, 3])
    b = pool.get_new_blocks(1)  # a separate, finished chain: 9
    _cache(pool, b, [9], tokens=[40, 41])
    pool.free_blocks(b)
    pool.free_blocks(reversed(a[1:]))  # only block 1 stays referenced ...
    pool.touch([a[2]])  # ... and 3, held alone (as a write-through copy holds a block)
    pool.take_events()
    assert pool.reset_prefix_cache() == 1  # only 9: 2 is the parent of the held block 3
    assert set(pool.cached_hashes()) == {1, 2, 3}
    assert pool.take_events() == [
        AllBlocksCleared(),
        BlockStored(
            block_hashes=hash_tuple(1), parent_block_hash=None, token_ids=(0, 1), block_size=BS
        ),
        BlockStored(
            block_hashes=hash_tuple(2),
            parent_block_hash=BlockHash(1),
            token_ids=(2, 3),
            block_size=BS,
        ),
        BlockStored(
            block_hashes=hash_tuple(3),
            parent_block_hash=BlockHash(2),
            token_ids=(4, 5),
            block_size=BS,
        ),
    ]
    # Lineage counts were recounted among the survivors: 2 keeps its cached child 3.
    assert [a[0].num_cached_children, a[1].num_cached_children] == [1, 1]
    assert a[2].num_cached_children == 0


def test_usage_counts_only_referenced_blocks() -> None:
    pool = _pool(4)
    a = pool.get_new_blocks(2)
    _cache(pool, a, [1, 2])
    assert pool.usage == 0.5
    pool.free_blocks(reversed(a))
    assert pool.usage == 0.0  # cached but unreferenced counts as free, as in vLLM


def test_lineage_allocation_sees_each_eviction_before_the_next_pick() -> None:
    # A parent freed before its child (as write-through copies release them) is skipped
    # while the child is cached; once the child is evicted by this very allocation, the
    # parent is the next pick, ahead of the unrelated block behind it.
    pool = BlockPool(3, 1, enable_caching=True, eviction_policy=EvictionPolicyName.LINEAGE)
    parent, child, other = pool.get_new_blocks(3)
    pool.cache_full_blocks([parent, child], 0, 2, hashes(111, 222), [5, 6])
    pool.cache_full_blocks([other], 0, 1, hashes(333), [7])
    for block in (parent, child, other):
        pool.free_blocks([block])
    got = pool.get_new_blocks(2)
    assert [b.block_id for b in got] == [child.block_id, parent.block_id]
    assert pool.cached_hashes() == {333: other.block_id}


def test_an_over_free_still_frees_the_blocks_before_it() -> None:
    pool = BlockPool(3, 1)
    a, b, _ = pool.get_new_blocks(3)
    pool.free_blocks([b])
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks([a, b])
    assert pool.num_used == 1 and pool.num_free == 2


@pytest.mark.parametrize(("events", "keep"), [(True, True), (False, True), (False, False)])
def test_the_all_new_run_path_leaves_what_the_per_block_path_leaves(
    events: bool, keep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cache_full_blocks registers a run of all-new hashes at C level; a run with a cached
    # hash, or a hash twice, takes the per-block path. Random tables (shared prefixes,
    # repeated hashes, partial ranges) through both must leave the same pool.
    import random

    def play(fast: bool) -> tuple[object, ...]:
        pool = BlockPool(40, BS, record_events=events, keep_tokens=keep)
        if not fast:  # (after the fast run: the class is patched until the test ends)
            monkeypatch.setattr(BlockPool, "_cache_new_run", lambda *a: False)
        rng = random.Random(11)
        held: list[list[KVBlock]] = []
        chains: list[
            list[tuple[BlockHash | None, BlockHash | None]]
        ] = []  # every block's hash and parent after each step
        for step in range(300):
            if held and (rng.random() < 0.4 or pool.num_reusable < 8):
                table = held.pop(rng.randrange(len(held)))
                pool.free_blocks(reversed(table))
                continue
            n = rng.randint(1, 6)
            run = [rng.choice([1, 2, 3]) * 100 + k for k in range(n)]
            start = rng.randint(0, n - 1)
            r = rng.random()
            if r < 0.4:  # a new prefix, cached in one or two runs
                run = [rng.randrange(10**6, 10**9) + k for k in range(n)]
                if n > 1 and r < 0.15:  # with a hash twice in it
                    run[-1] = run[0]
                    start = 0
            table = pool.get_new_blocks(n)
            tokens = list(range(step, step + n * BS))  # (each table's own token list)
            pool.cache_full_blocks(table, 0, start, as_hashes(run), tokens, "lora")
            pool.cache_full_blocks(table, start, n, as_hashes(run), tokens, "lora")
            held.append(table)
            chains.append([(b.block_hash, b.parent_hash) for b in pool.blocks])
        return (
            chains,
            _order(pool),
            sorted((h, b.block_id) for h, b in pool._cached.items()),
            [  # every block, held or free: what a later hit, copy or event would read
                (
                    b.block_id,
                    b.ref_cnt,
                    b.block_hash,
                    b.parent_hash,
                    b.token_start,
                    b.lora_name,
                    None if b.token_src is None else list(b.token_src),
                )
                for b in pool.blocks
            ],
            [[b.block_id for b in t] for t in held],
            pool.take_events(),
            pool.num_used,
        )

    fast, slow = play(True), play(False)
    assert fast == slow
    assert fast[4] or not events


@pytest.mark.parametrize(("events", "keep"), [(True, True), (False, True), (False, False)])
def test_reusing_cached_free_blocks_forgets_them_on_every_allocation_path(
    events: bool, keep: bool
) -> None:
    # get_new_blocks evicts in one of three loops (events; no events with tokens kept; no
    # events, one map, no tokens: the common replay); each leaves the same pool.
    pool = BlockPool(4, BS, record_events=events, keep_tokens=keep)
    table = pool.get_new_blocks(4)
    pool.cache_full_blocks(table, 0, 3, hashes(11, 12, 13), list(range(4 * BS)), "lora")
    pool.free_blocks(reversed(table))  # unhashed block 3 first, then 13, 12, 11
    got = pool.get_new_blocks(3)
    assert [b.block_id for b in got] == [3, 2, 1]
    assert {h: b.block_id for h, b in pool._cached.items()} == {11: 0}
    for block in got:
        assert (block.ref_cnt, block.block_hash, block.parent_hash, block.token_src) == (
            1,
            None,
            None,
            None,
        )
    assert (table[0].token_src is not None) == keep  # (still cached: it keeps what it had)
    assert pool.num_used == 3 and pool.num_free == 1


def test_a_run_over_blocks_cached_as_themselves_stores_only_the_new_ones() -> None:
    # The all-new run path inserts with `setdefault` and undoes what it inserted when a hash
    # was there already: blocks there as themselves (an earlier call over part of the same
    # range) are not what it inserted. They stay as they were, announced once.
    pool = _pool(8)
    table = pool.get_new_blocks(3)
    _cache(pool, table, [11, 12, 13], end=2)
    pool.take_events()
    _cache(pool, table, [11, 12, 13])
    (event,) = pool.take_events()
    assert isinstance(event, BlockStored) and event.block_hashes == (13,)
    assert [(h, b.block_id, b.block_hash) for h, b in pool._cached.items()] == [
        (11, 0, 11),
        (12, 1, 12),
        (13, 2, 13),
    ]
    assert [b.parent_hash for b in table] == [None, 11, 12]


def test_a_run_longer_than_its_table_changes_nothing_before_it_fails() -> None:
    pool = BlockPool(8, BS)
    table = pool.get_new_blocks(2)
    with pytest.raises(IndexError):
        pool.cache_full_blocks(table, 0, 3, hashes(11, 12, 13), list(range(3 * BS)))
    # As the per-block path leaves it: the blocks it reached are cached, each as itself.
    assert {h: (b.block_id, b.block_hash) for h, b in pool._cached.items()} == {
        11: (0, 11),
        12: (1, 12),
    }
