"""Host tier: incoming vs resident, LRU eviction, pins, capacity and CPU-medium events."""

from __future__ import annotations

import pytest

from mocker.kv.events import BlockRemoved, BlockStored
from mocker.kv.hashing import BlockHash
from mocker.tiers.host import HostBlock, HostTier


def blk(h: int, parent: int | None = None) -> HostBlock:
    return HostBlock(BlockHash(h), None if parent is None else BlockHash(parent), (h, h + 1), None)


def test_blocks_are_visible_only_once_their_copy_commits() -> None:
    host = HostTier(4, 2, record_events=True)
    assert host.reserve(blk(1)) == []
    assert host.holds(BlockHash(1)) and BlockHash(1) not in host
    assert host.num_incoming == 1 and host.num_used == 1
    assert host.take_events() == []
    host.commit([BlockHash(1)])
    assert BlockHash(1) in host and host.num_resident == 1 and host.num_incoming == 0
    [event] = host.take_events()
    assert event == BlockStored((BlockHash(1),), None, (1, 2), 2, None, "CPU")


def test_a_committed_chain_is_one_stored_event_with_its_parent() -> None:
    host = HostTier(8, 2, record_events=True)
    for h, parent in ((10, 9), (11, 10), (20, None)):
        host.reserve(blk(h, parent))
    host.commit([BlockHash(10), BlockHash(11), BlockHash(20)])
    first, second = host.take_events()
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert first.block_hashes == (10, 11) and first.parent_block_hash == 9
    assert first.token_ids == (10, 11, 11, 12)
    assert second.block_hashes == (20,) and second.parent_block_hash is None


def test_full_tier_evicts_least_recently_used_unpinned() -> None:
    host = HostTier(3, 2, record_events=True)
    for h in (1, 2, 3):
        host.reserve(blk(h))
    host.commit([BlockHash(1), BlockHash(2), BlockHash(3)])
    host.take_events()
    host.pin([BlockHash(1)])  # a load of 1: also makes it most recently used
    assert host.reserve(blk(4)) == [BlockHash(2)]
    assert host.take_events() == [BlockRemoved((BlockHash(2),), "CPU")]
    host.unpin([BlockHash(1)])
    assert host.reserve(blk(5)) == [BlockHash(3)]
    assert host.num_used == 3 <= host.capacity


def test_reserve_fails_cleanly_when_everything_is_pinned_or_incoming() -> None:
    host = HostTier(2, 2)
    host.reserve(blk(1))
    host.commit([BlockHash(1)])
    host.pin([BlockHash(1)])
    host.reserve(blk(2))  # incoming: never evicted
    assert host.reserve(blk(3)) is None
    assert host.num_used == 2 and not host.holds(BlockHash(3))


def test_match_counts_a_contiguous_resident_run() -> None:
    host = HostTier(8, 2)
    for h in (1, 2, 4):
        host.reserve(blk(h))
    host.commit([BlockHash(1), BlockHash(2)])
    hashes = [BlockHash(h) for h in (0, 1, 2, 3, 4)]
    assert host.match(hashes, 1, 5) == 2
    assert host.match(hashes, 0, 5) == 0
    assert host.match(hashes, 1, 2) == 1  # bounded by stop
    assert host.match(hashes, 4, 5) == 0  # 4 is still incoming


def test_unpin_more_than_pinned_is_a_bug() -> None:
    host = HostTier(2, 2)
    host.reserve(blk(1))
    host.commit([BlockHash(1)])
    with pytest.raises(ValueError, match="unpinned more often"):
        host.unpin([BlockHash(1)])


@pytest.mark.parametrize("order", [(1, 2, 3), (3, 2, 1)])
def test_a_chain_is_evicted_leaf_first_after_a_store_or_a_load(order: tuple[int, ...]) -> None:
    host = HostTier(3, 2)
    for h in order:  # 1 <- 2 <- 3, committed in either order
        host.reserve(blk(h, h - 1 if h > 1 else None))
    host.commit([BlockHash(h) for h in order])
    assert host.reserve(blk(9)) == [BlockHash(3)]  # the leaf, never the root
    host.commit([BlockHash(9)])
    host.pin([BlockHash(1), BlockHash(2)])  # a load reads the chain root first
    host.unpin([BlockHash(1), BlockHash(2)])
    assert host.reserve(blk(10)) == [BlockHash(9)]
    assert host.reserve(blk(11)) == [BlockHash(2)]  # then the chain, leaf first
    assert host.reserve(blk(12)) == [BlockHash(1)]
