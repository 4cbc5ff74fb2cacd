"""The LRU tier: incoming vs resident, LRU eviction, pins, capacity and medium-tagged events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.kv.events import BlockRemoved, BlockStored
from mocker.kv.hashing import BlockHash
from mocker.tiers.lru import LruTier, _children_first, _post_order
from mocker.tiers.tier import BlockBatch, Medium, TierBlock


def blk(h: int, parent: int | None = None) -> TierBlock:
    return TierBlock(BlockHash(h), None if parent is None else BlockHash(parent), (h, h + 1), None)


def reserve(tier: LruTier, block: TierBlock) -> list[BlockHash] | None:
    """One block's prepare_store: the keys evicted for it, or None if it was skipped."""
    plan = tier.prepare_store(BlockBatch.of([block]))
    return None if plan.skipped else plan.evicted


def test_blocks_are_visible_only_once_their_copy_commits() -> None:
    host = LruTier(4, 2, record_events=True)
    assert reserve(host, blk(1)) == []
    assert host.holds(BlockHash(1)) and BlockHash(1) not in host
    assert host.num_incoming == 1 and host.num_used == 1
    assert host.take_events() == []
    host.complete_store([BlockHash(1)])
    assert BlockHash(1) in host and host.num_resident == 1 and host.num_incoming == 0
    [event] = host.take_events()
    assert event == BlockStored((BlockHash(1),), None, (1, 2), 2, None, "CPU")


def test_a_committed_chain_is_one_stored_event_with_its_parent() -> None:
    host = LruTier(8, 2, record_events=True)
    for h, parent in ((10, 9), (11, 10), (20, None)):
        reserve(host, blk(h, parent))
    host.complete_store([BlockHash(10), BlockHash(11), BlockHash(20)])
    first, second = host.take_events()
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.block_hashes == (10, 11) and first.parent_block_hash == 9
    assert first.token_ids == (10, 11, 11, 12)
    assert second.block_hashes == (20,) and second.parent_block_hash is None


def test_full_tier_evicts_least_recently_used_unpinned() -> None:
    host = LruTier(3, 2, record_events=True)
    for h in (1, 2, 3):
        reserve(host, blk(h))
    host.complete_store([BlockHash(1), BlockHash(2), BlockHash(3)])
    host.take_events()
    host.prepare_load([BlockHash(1)])  # a load of 1: also makes it most recently used
    assert reserve(host, blk(4)) == [BlockHash(2)]
    assert host.take_events() == [BlockRemoved((BlockHash(2),), "CPU")]
    host.complete_load([BlockHash(1)])
    assert reserve(host, blk(5)) == [BlockHash(3)]
    assert host.num_used == 3 <= host.capacity


def test_reserve_fails_cleanly_when_everything_is_pinned_or_incoming() -> None:
    host = LruTier(2, 2)
    reserve(host, blk(1))
    host.complete_store([BlockHash(1)])
    host.prepare_load([BlockHash(1)])
    reserve(host, blk(2))  # incoming: never evicted
    assert reserve(host, blk(3)) is None
    assert host.num_used == 2 and not host.holds(BlockHash(3))


def test_match_counts_a_contiguous_resident_run() -> None:
    host = LruTier(8, 2)
    for h in (1, 2, 4):
        reserve(host, blk(h))
    host.complete_store([BlockHash(1), BlockHash(2)])
    hashes = [BlockHash(h) for h in (0, 1, 2, 3, 4)]
    assert host.lookup(hashes, 1, 5) == 2
    assert host.lookup(hashes, 0, 5) == 0
    assert host.lookup(hashes, 1, 2) == 1  # bounded by stop
    assert host.lookup(hashes, 4, 5) == 0  # 4 is still incoming


def test_unpin_more_than_pinned_is_a_bug() -> None:
    host = LruTier(2, 2)
    reserve(host, blk(1))
    host.complete_store([BlockHash(1)])
    with pytest.raises(ValueError, match="unpinned more often"):
        host.complete_load([BlockHash(1)])


@pytest.mark.parametrize("order", [(1, 2, 3), (3, 2, 1)])
def test_a_chain_is_evicted_leaf_first_after_a_store_or_a_load(order: tuple[int, ...]) -> None:
    host = LruTier(3, 2)
    for h in order:  # 1 <- 2 <- 3, committed in either order
        reserve(host, blk(h, h - 1 if h > 1 else None))
    host.complete_store([BlockHash(h) for h in order])
    assert reserve(host, blk(9)) == [BlockHash(3)]  # the leaf, never the root
    host.complete_store([BlockHash(9)])
    host.prepare_load([BlockHash(1), BlockHash(2)])  # a load reads the chain root first
    host.complete_load([BlockHash(1), BlockHash(2)])
    assert reserve(host, blk(10)) == [BlockHash(9)]
    assert reserve(host, blk(11)) == [BlockHash(2)]  # then the chain, leaf first
    assert reserve(host, blk(12)) == [BlockHash(1)]


def test_a_batch_plan_skips_held_keys_and_stops_where_no_room_is_left() -> None:
    host = LruTier(3, 2)
    reserve(host, blk(1))
    host.complete_store([BlockHash(1)])
    host.prepare_load([BlockHash(1)])  # pinned: never evicted
    plan = host.prepare_store(BlockBatch.of([blk(1), blk(2), blk(3), blk(4), blk(1)]))
    assert plan.keys == [BlockHash(2), BlockHash(3)] and plan.evicted == []
    assert plan.skipped == 1  # 4 found no room; 1 is held, neither stored nor skipped


def test_a_failed_store_frees_its_slots_and_shows_nothing() -> None:
    tier = LruTier(2, 2, name="fs", medium=Medium.STORAGE, record_events=True)
    assert tier.prepare_store(BlockBatch.of([blk(1), blk(2)])).keys == [BlockHash(1), BlockHash(2)]
    tier.complete_store([BlockHash(1)], success=False)
    tier.complete_store([BlockHash(2)])
    assert not tier.holds(BlockHash(1)) and BlockHash(2) in tier and tier.num_used == 1
    [event] = tier.take_events()
    assert event == BlockStored((BlockHash(2),), None, (2, 3), 2, None, "STORAGE")


def test_touch_makes_a_chain_most_recently_used_root_last() -> None:
    tier = LruTier(3, 2)
    reserve(tier, blk(1))
    reserve(tier, blk(2, 1))
    reserve(tier, blk(3))
    tier.complete_store([BlockHash(1), BlockHash(2), BlockHash(3)])
    tier.touch([BlockHash(1), BlockHash(2)])
    assert reserve(tier, blk(4)) == [BlockHash(3)]
    assert reserve(tier, blk(5)) == [BlockHash(2)]  # leaf before root


def stored(tier: LruTier, *keys: int) -> None:
    tier.prepare_store(BlockBatch.of([blk(k) for k in keys]))
    tier.complete_store([BlockHash(k) for k in keys])


def test_a_pinned_block_the_eviction_passes_becomes_most_recently_used() -> None:
    # A cascade pins without touching; when eviction reaches the pinned block it counts as
    # in use (moved to the most recently used end), so no later store scans it again.
    tier = LruTier(3, 2)
    stored(tier, 1, 2, 3)
    tier.pin([BlockHash(1)])
    assert reserve(tier, blk(4)) == [BlockHash(2)]  # 1 is passed over: order 3, 1, 4
    tier.complete_store([BlockHash(4)])
    tier.unpin([BlockHash(1)])
    assert reserve(tier, blk(5)) == [BlockHash(3)]
    tier.complete_store([BlockHash(5)])
    assert reserve(tier, blk(6)) == [BlockHash(1)]


def test_a_store_never_evicts_a_block_of_its_own_batch() -> None:
    tier = LruTier(3, 2)
    stored(tier, 1, 2, 3)  # 1 is the least recently used
    plan = tier.prepare_store(BlockBatch.of([blk(4), blk(1)]))
    assert plan.keys == [BlockHash(4)] and plan.evicted == [BlockHash(2)]
    assert BlockHash(1) in tier


def test_a_key_twice_in_one_batch_is_reserved_once() -> None:
    tier = LruTier(4, 2)
    plan = tier.prepare_store(BlockBatch.of([blk(1), blk(2), blk(1)]))
    assert plan.keys == [BlockHash(1), BlockHash(2)] and tier.num_incoming == 2


def test_an_all_pinned_tier_skips_a_whole_batch_without_evicting() -> None:
    tier = LruTier(4, 2, record_events=True)
    stored(tier, 1, 2, 3, 4)
    tier.pin([BlockHash(k) for k in (1, 2, 3, 4)])
    tier.take_events()
    plan = tier.prepare_store(BlockBatch.of([blk(5), blk(6)]))
    assert (plan.keys, plan.evicted, plan.skipped) == ([], [], 2)
    assert tier.take_events() == [] and tier.num_used == 4


def test_cascaded_records_are_shared_and_pins_are_each_tiers_own() -> None:
    cpu = LruTier(4, 2, record_events=True)
    fs = LruTier(4, 2, name="fs", record_events=True)
    stored(cpu, 1, 2)
    copies = cpu.copies([BlockHash(1), BlockHash(2)])
    fs.prepare_store(copies)
    fs.complete_store([BlockHash(1), BlockHash(2)])
    again = fs.copies([BlockHash(1)]).meta
    assert copies.meta is not None and again is not None
    assert again[0] is copies.meta[0]  # one record, no copy made
    assert fs.copies([BlockHash(2)]).parents == [None]
    cpu.pin([BlockHash(1)])
    assert cpu.pins() == {BlockHash(1): 1} and fs.pins() == {}
    with pytest.raises(KeyError):
        cpu.pin([BlockHash(9)])  # only a resident block can be pinned


def chains(draw: st.DrawFn) -> tuple[list[BlockHash], list[BlockHash | None]]:
    """A batch as a connector makes them: chains root first, leaf first, or mixed, some
    continuing a chain of the batch (a branch)."""
    keys: list[BlockHash] = []
    parents: list[BlockHash | None] = []
    next_key = 1
    for _ in range(draw(st.integers(1, 4))):
        length = draw(st.integers(1, 5))
        root_parent: BlockHash | None = draw(
            st.sampled_from([None, BlockHash(10_000 + next_key), *keys])  # or outside
        )
        chain = [BlockHash(next_key + i) for i in range(length)]
        next_key += length
        chain_parents = [root_parent, *chain[:-1]]
        if draw(st.booleans()):  # leaf first
            chain, chain_parents = chain[::-1], chain_parents[::-1]
        keys += chain
        parents += chain_parents
    return keys, parents


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_children_first_orders_every_batch_as_the_post_order_walk(data: st.DataObject) -> None:
    keys, parents = data.draw(st.composite(chains)())
    if data.draw(st.booleans()):  # any order at all (chains interleaved, parents after)
        order = data.draw(st.permutations(range(len(keys))))
        keys, parents = [keys[i] for i in order], [parents[i] for i in order]
    got_keys, got_parents = _children_first(list(keys), list(parents))
    walked = _post_order(list(zip(keys, parents, strict=True)), set(keys))
    assert list(zip(got_keys, got_parents, strict=True)) == walked
    position = {k: i for i, k in enumerate(got_keys)}
    for k, p in zip(got_keys, got_parents, strict=True):
        if p is not None and p in position:
            assert position[p] > position[k]  # every block after its descendants


@pytest.mark.parametrize("unique", [True, False])
def test_a_unique_batch_reserves_as_any_batch_does(unique: bool) -> None:
    # The no-dict path for batches of distinct keys and the general path agree, whether
    # the batch fits, partly is held already, or needs evictions.
    tier = LruTier(6, 2, record_events=True)
    stored(tier, 1, 2, 3)
    batch = BlockBatch.of([blk(4, 3), blk(5, 4)])
    batch.unique = unique
    plan = tier.prepare_store(batch)
    assert (plan.keys, plan.evicted, plan.skipped) == ([BlockHash(4), BlockHash(5)], [], 0)
    batch = BlockBatch.of([blk(5, 4), blk(6, 5), blk(7, 6), blk(8, 7)])
    batch.unique = unique
    plan = tier.prepare_store(batch)  # 5 incoming already; 6, 7, 8 evict 1 and 2
    assert plan.keys == [BlockHash(6), BlockHash(7), BlockHash(8)]
    assert plan.evicted == [BlockHash(1), BlockHash(2)]
    tier.complete_store([BlockHash(k) for k in (4, 5, 6, 7, 8)])
    stored_events = [e for e in tier.take_events() if isinstance(e, BlockStored)]
    assert stored_events[-1].block_hashes == (4, 5, 6, 7, 8)
    assert stored_events[-1].token_ids == (4, 5, 5, 6, 6, 7, 7, 8, 8, 9)


def test_pins_are_counted_per_key_only_once_an_eviction_meets_them() -> None:
    tier = LruTier(3, 2)
    stored(tier, 1, 2, 3)
    load = [BlockHash(1), BlockHash(2)]
    tier.prepare_load(load)  # 3 is now the least recently used
    assert tier._pins._counts is None  # a read alone counts nothing per key
    assert reserve(tier, blk(4)) == [BlockHash(3)]  # the scan needed the counts
    assert tier._pins._counts == {BlockHash(1): 1, BlockHash(2): 1}
    assert reserve(tier, blk(5)) is None  # 1 and 2 are pinned, 4 incoming: no room
    tier.complete_load(load)
    assert tier._pins._counts is None and tier.num_pinned() == 0
