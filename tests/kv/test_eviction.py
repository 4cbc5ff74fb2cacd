"""Eviction order of both policies, exact, including out-of-chain-order releases."""

from collections.abc import Callable

from mocker.config_choices import EvictionPolicyName
from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.events import BlockRemoved
from mocker.kv.hashing import BlockHash

BS = 2


def _evictions(
    policy: EvictionPolicyName, release: Callable[[BlockPool, list[KVBlock], list[KVBlock]], None]
) -> list[int]:
    """Chain 0→1→2 (hashes 10, 11, 12) plus a branch 0→3 (hash 13); release, then refill."""
    pool = BlockPool(5, BS, eviction_policy=policy, record_events=True)
    chain = pool.get_new_blocks(3)
    table = list(chain)
    pool.cache_full_blocks(
        table, 0, 3, [BlockHash(10), BlockHash(11), BlockHash(12)], list(range(6))
    )
    pool.touch([chain[0]])
    branch_table = [chain[0], *pool.get_new_blocks(1)]
    pool.cache_full_blocks(branch_table, 1, 2, [BlockHash(10), BlockHash(13)], list(range(4)))
    release(pool, table, branch_table)
    pool.take_events()
    order: list[int] = []
    for _ in range(5):
        pool.get_new_blocks(1)
        for ev in pool.take_events():
            assert isinstance(ev, BlockRemoved)
            order.extend(ev.block_hashes)
    return order


def _tail_first(pool: BlockPool, chain: list[KVBlock], branch: list[KVBlock]) -> None:
    pool.free_blocks(reversed(chain))
    pool.free_blocks(reversed(branch))


def _head_first(pool: BlockPool, chain: list[KVBlock], branch: list[KVBlock]) -> None:
    # Out of chain order, as when asynchronous stores release blocks as they finish.
    pool.free_blocks(branch)
    pool.free_blocks(chain)


def test_lru_tail_first() -> None:
    # Free queue after release: [4 (never used), 12, 11, 13, 10].
    assert _evictions(EvictionPolicyName.LRU, _tail_first) == [12, 11, 13, 10]


def test_lineage_equals_lru_under_tail_first_release() -> None:
    assert _evictions(EvictionPolicyName.LINEAGE, _tail_first) == [12, 11, 13, 10]


def test_lru_head_first_strands_children() -> None:
    # Queue: [4, 13, 10, 11, 12]: LRU evicts parent 10 while 11 and 12 are still cached.
    assert _evictions(EvictionPolicyName.LRU, _head_first) == [13, 10, 11, 12]


def test_lineage_head_first_evicts_leaves_first() -> None:
    # Same queue; 10 and 11 are skipped while they have cached children.
    assert _evictions(EvictionPolicyName.LINEAGE, _head_first) == [13, 12, 11, 10]


def test_lineage_never_evicts_parent_with_cached_child_in_use() -> None:
    pool = BlockPool(3, BS, eviction_policy=EvictionPolicyName.LINEAGE)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(list(blocks), 0, 2, [BlockHash(1), BlockHash(2)], [0, 1, 2, 3])
    pool.free_blocks([blocks[0]])  # parent released while its child is still held
    got = pool.get_new_blocks(1)
    assert got[0].block_id == 2  # the unused block, not the pinned parent
    assert pool.lookup(BlockHash(1)) is blocks[0]
