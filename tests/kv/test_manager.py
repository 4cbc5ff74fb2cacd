"""KV manager: prefix lookup, slot allocation with hits, caching full blocks, freeing."""

from mocker.kv.block_pool import BlockPool
from mocker.kv.eviction import LRUPolicy
from mocker.kv.hashing import BlockHasher
from mocker.kv.manager import KVCacheManager
from mocker.request import Request
from tests.support.engines import core_request
from tests.support.pools import python_pool

BS = 4


def _hashed(name: str, tokens: list[int]) -> Request:
    """A request of `tokens` whose full blocks are hashed (seed 0)."""
    r = core_request(name, tokens, 8)
    r.enable_hashing(BlockHasher(0), BS, None)
    return r


def _manager(n: int = 8) -> KVCacheManager:
    return KVCacheManager(BlockPool(n, BS))


def _prefill(kv: KVCacheManager, r: Request) -> None:
    hits = kv.get_computed_blocks(r)
    r.num_computed_tokens = 0
    assert kv.allocate_slots(r, r.num_tokens - len(hits) * BS, hits)
    r.num_computed_tokens = r.num_tokens
    kv.cache_blocks(r)


def test_allocate_rounds_up_to_blocks_and_caches_only_full_ones() -> None:
    kv = _manager()
    r = _hashed("a", list(range(10)))
    _prefill(kv, r)
    assert len(r.blocks) == 3 and r.num_cached_blocks == 2
    assert python_pool(kv.pool).lookup(r.block_hashes[1]) is r.blocks[1]
    assert r.blocks[2].block_hash is None  # partial block: never cached


def test_hits_are_shared_and_capped() -> None:
    kv = _manager()
    a = _hashed("a", list(range(12)))
    _prefill(kv, a)
    b = _hashed("b", list(range(12)))
    hits = kv.get_computed_blocks(b)
    assert hits == a.blocks[:2]  # 12 tokens: 3 full blocks, cap at 11 tokens → 2
    assert kv.allocate_slots(b, 4, hits)
    assert b.blocks[:2] == a.blocks[:2] and a.blocks[0].ref_cnt == 2
    assert b.num_cached_blocks == 2


def test_allocation_failure_changes_nothing() -> None:
    kv = _manager(4)
    a = _hashed("a", list(range(12)))
    _prefill(kv, a)  # 3 of 4 blocks held
    b = _hashed("b", [99] * 8)
    assert not kv.allocate_slots(b, 8)
    assert b.blocks == [] and kv.pool.num_used == 3


def test_hits_on_free_blocks_count_against_free_space() -> None:
    kv = _manager(4)
    a = _hashed("a", list(range(12)))
    _prefill(kv, a)
    kv.free(a)  # all 3 cached blocks are free but findable
    b = _hashed("b", [*range(12), 50, 51, 52, 53, 54, 55])
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 3
    # 18 tokens need 5 blocks: 3 revived hits + 2 new, but only 4 exist.
    assert not kv.allocate_slots(b, 6, hits)
    assert kv.pool.num_used == 0 and all(h.ref_cnt == 0 for h in hits)


def test_free_releases_tail_first() -> None:
    kv = _manager(4)
    a = _hashed("a", list(range(12)))
    _prefill(kv, a)
    ids = [b.block_id for b in a.blocks]
    kv.free(a)
    policy = python_pool(kv.pool).policy
    assert isinstance(policy, LRUPolicy)
    assert [b.block_id for b in policy.order()] == [3, *reversed(ids)]
    assert a.blocks == [] and a.num_cached_blocks == 0
