"""Group managers: full, sliding-window and Mamba hits, hit tables and release points."""

from collections.abc import Iterable

import pytest

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.group_managers import (
    NEVER,
    GroupManager,
    MambaManager,
    SlidingWindowManager,
    make_group_manager,
)
from mocker.kv.hashing import BlockHash
from mocker.kv.spec import KVLayout, kv_layout
from tests.support.hybrid import HASHES, cache_free_blocks, hybrid_shape

BS = 4


def _layout(window: int = 8) -> KVLayout:
    """Group 0 sliding (window), 1 Mamba, 2 full attention."""
    return kv_layout(hybrid_shape(("sliding_attention", "mamba", "full_attention"), window), BS)


def _managers(window: int = 8, caching: bool = True) -> tuple[BlockPool, list[GroupManager]]:
    layout = _layout(window)
    pool = BlockPool(32, BS, groups=layout.groups)  # the managers read the pool's block size
    return pool, [make_group_manager(g, pool, caching) for g in layout.groups]


def _cache_findable(pool: BlockPool, group: int, positions: Iterable[int]) -> dict[int, KVBlock]:
    """cache_free_blocks, and each of them found under its hash."""
    blocks = cache_free_blocks(pool, group, positions)
    assert set(pool.cached_hashes(group)) == {HASHES[p] for p in blocks}
    return blocks


def test_make_group_manager_picks_the_kind() -> None:
    _, (sliding, mamba, full) = _managers()
    assert type(sliding) is SlidingWindowManager
    assert type(mamba) is MambaManager
    assert type(full) is GroupManager


# -- full attention ---------------------------------------------------------------------------


def test_full_attention_hit_is_the_longest_cached_prefix() -> None:
    pool, (_, _, full) = _managers()
    blocks = _cache_findable(pool, 2, [0, 1, 2, 3, 4, 6])
    assert full.find_hit(HASHES, 10) == 5  # 0..4 cached, 5 missing
    assert full.find_hit(HASHES, 3) == 3  # capped
    assert full.find_hit([BlockHash(999), *HASHES[1:]], 10) == 0  # block 0 missing
    assert full.hit_table(HASHES, 3) == [blocks[0], blocks[1], blocks[2]]
    assert full.num_skipped(1000) == 0 and full.next_release(1000) == NEVER


def test_full_attention_other_groups_hashes_do_not_count() -> None:
    pool, (sliding, mamba, full) = _managers()
    _cache_findable(pool, 0, range(6))  # cached in the sliding group only
    assert full.find_hit(HASHES, 10) == 0
    assert mamba.find_hit(HASHES, 10) == 0
    assert sliding.find_hit(HASHES, 10) == 6


# -- sliding window ---------------------------------------------------------------------------


def test_sliding_hit_needs_only_the_window_before_it() -> None:
    pool, (sliding, _, _) = _managers(window=8)
    # Window 8, block 4: a hit needs ceil(7 / 4) = 2 cached blocks just before it.
    blocks = _cache_findable(pool, 0, [0, 1, 2, 5, 6])
    # Right to left: 9, 8, 7 missing; 6 and 5 make a run of 2: hit 5 + 2 = 7 blocks.
    assert sliding.find_hit(HASHES, 10) == 7
    # At most 6: 5 alone, 4 and 3 missing, then 2 and 1: hit 1 + 2 = 3.
    assert sliding.find_hit(HASHES, 6) == 3
    # The table: the 7 − 2 = 5 positions before the window are null.
    assert sliding.hit_table(HASHES, 7) == [None] * 5 + [blocks[5], blocks[6]]
    assert sliding.hit_table(HASHES, 3) == [None, blocks[1], blocks[2]]


def test_sliding_without_a_full_run_the_leading_run_counts() -> None:
    pool, (sliding, _, _) = _managers(window=8)
    _cache_findable(pool, 0, [0, 4])  # no two contiguous blocks; block 0 starts the prompt
    assert sliding.find_hit(HASHES, 10) == 1
    pool2, (sliding2, _, _) = _managers(window=8)
    _cache_findable(pool2, 0, [3, 6])  # neither run reaches block 0: no hit
    assert sliding2.find_hit(HASHES, 10) == 0


@pytest.mark.parametrize(
    ("window", "hit"),
    [
        (5, 5),  # ceil(4 / 4) = 1 block needed: 4 alone ends a hit of 5
        (8, 5),  # ceil(7 / 4) = 2: 3 and 4
        (9, 5),  # ceil(8 / 4) = 2
        (10, 0),  # ceil(9 / 4) = 3: a run of 2 is too short, and it does not start at 0
    ],
)
def test_sliding_blocks_needed_follow_the_window(window: int, hit: int) -> None:
    pool, (sliding, _, _) = _managers(window=window)
    _cache_findable(pool, 0, [3, 4])
    assert sliding.find_hit(HASHES, 10) == hit


def test_sliding_release_points() -> None:
    _, (sliding, _, _) = _managers(window=8)
    # Blocks wholly before num_computed − 8 + 1 are skipped: (c − 7) // 4.
    assert [sliding.num_skipped(c) for c in (0, 7, 10, 11, 14, 15, 19)] == [0, 0, 0, 1, 1, 2, 3]
    # The next release: (skipped + 1) × 4 + 7.
    assert sliding.next_release(0) == 11
    assert sliding.next_release(11) == 15
    assert sliding.next_release(14) == 15
    assert sliding.next_release(15) == 19


# -- Mamba ------------------------------------------------------------------------------------


def test_mamba_hit_needs_a_state_exactly_at_the_hit_point() -> None:
    pool, (_, mamba, _) = _managers()
    blocks = _cache_findable(pool, 1, [2, 6])  # states after blocks 3 and 7
    assert mamba.find_hit(HASHES, 10) == 7  # right to left: 6 is the first cached
    assert mamba.find_hit(HASHES, 6) == 3
    assert mamba.find_hit(HASHES, 2) == 0
    assert mamba.hit_table(HASHES, 7) == [None] * 6 + [blocks[6]]
    assert mamba.hit_table(HASHES, 3) == [None, None, blocks[2]]
    assert mamba.hit_table(HASHES, 0) == []


def test_mamba_release_points() -> None:
    _, (_, mamba, _) = _managers(caching=True)
    # The previous state is skipped once a pass starts past its boundary + 1 token:
    # (c − 1) // 4 positions.
    assert [mamba.num_skipped(c) for c in (0, 1, 8, 9, 16, 17)] == [0, 0, 1, 2, 3, 4]
    assert mamba.next_release(8) == (1 + 1) * 4 + 1 == 9
    assert mamba.next_release(9) == (2 + 1) * 4 + 1 == 13
    _, (_, kept, _) = _managers(caching=False)
    assert kept.num_skipped(1000) == 0 and kept.next_release(1000) == NEVER
