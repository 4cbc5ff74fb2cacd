"""The compiled pool against the Python one (the reference): the same ids, free order, map,
reference counts and errors after every operation of random workloads; whole replays give
the same rows; which runs it serves, and how `MOCKER_COMPILED` chooses."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from mocker import compiled
from mocker.compiled import ENV
from mocker.config import EngineConfig
from mocker.config_choices import EvictionPolicyName, KVRole, OffloadPolicy
from mocker.engine.kv_stack import build_kv_stack
from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.compiled_pool import (
    CompiledBlockPool,
    CompiledEventPool,
    serves,
)
from mocker.kv.eviction import LRUPolicy
from mocker.kv.hashing import BlockHash, BlockHashes, hash_array
from mocker.model_shape import MODEL_PRESETS
from mocker.replay.runner import replay
from mocker.replay.trace import SyntheticSpec, synthetic_trace
from mocker.storage_spec import StorageKind, StorageTierSpec
from mocker.tiers.lru import LruTier
from tests.support.pools import free_order

pytestmark = pytest.mark.skipif(
    not compiled.built("mocker.kv._cpool"), reason="mocker.kv._cpool was not built (no C compiler)"
)

BS = 4


@dataclass
class _Table:
    """One request's block table in both pools, and its chain of hashes."""

    py: list[KVBlock] = field(default_factory=list)
    c: list[int] = field(default_factory=list)
    hashes: BlockHashes = field(default_factory=list)
    cached: int = 0  # blocks registered


def _chain(rng: random.Random, n: int) -> list[BlockHash]:
    """Hashes of n blocks whose contents come from a 2-letter alphabet: chains share
    prefixes often, and two requests compute the same block."""
    out: list[BlockHash] = []
    parent = 0
    for _ in range(n):
        parent = hash((parent, rng.randrange(2))) & ((1 << 64) - 1)
        out.append(BlockHash(parent))
    return out


def _same_state(py: BlockPool, c: CompiledBlockPool) -> None:
    assert (c.num_used, c.num_free, c.num_reusable) == (py.num_used, py.num_free, py.num_reusable)
    assert c.usage == py.usage
    assert c.cached_hashes() == py.cached_hashes()
    policy = py.policy
    assert isinstance(policy, LRUPolicy)
    assert c.free_order() == [b.block_id for b in policy.order()]
    for block in py.blocks:
        assert c.ref_cnt(block.block_id) == block.ref_cnt
        assert c.block_hash(block.block_id) == block.block_hash
        if block.block_hash is not None:
            assert c.parent_hash(block.block_id) == block.parent_hash
    # The batch forms (a store's keys and parents) answer as the Python pool's.
    ids = [b.block_id for b in py.blocks]
    assert c.block_hashes(ids) == py.block_hashes(py.blocks)
    cached = [b for b in py.blocks if b.block_hash is not None]
    assert c.parent_hashes([b.block_id for b in cached]) == py.parent_hashes(cached)


def _ids(blocks: list[KVBlock]) -> list[int]:
    return [b.block_id for b in blocks]


def _both(py_call: Any, c_call: Any) -> tuple[Any, Any]:
    """Both results, or both errors of the same type and message."""
    try:
        a = py_call()
    except (ValueError, IndexError) as e:
        with pytest.raises(type(e)) as got:
            c_call()
        assert str(got.value) == str(e)
        return None, None
    return a, c_call()


@pytest.mark.parametrize("vector", [False, True], ids=["list", "array"])
@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_random_workloads_match_the_python_pool(seed: int, events: bool, vector: bool) -> None:
    """`vector`: the requests' hashes are arrays('Q') (as replay's), read in place."""
    rng = random.Random(seed)
    n = rng.choice([8, 24, 64])
    caching = seed % 7 != 0
    py = BlockPool(n, BS, enable_caching=caching, record_events=events)
    kind = CompiledEventPool if events else CompiledBlockPool
    c = kind(n, BS, enable_caching=caching)
    assert c.record_events is events
    live: list[_Table] = []
    for _ in range(250):
        op = rng.random()
        if op < 0.3:  # admit a request: its prefix hits, then new blocks (the manager's order)
            chain = _chain(rng, rng.randint(1, 12))
            t = _Table(hashes=hash_array(array("Q", chain)) if vector else chain)
            want = rng.randint(1, len(t.hashes))
            hits_py = py.lookup_prefix(t.hashes[: want - 1]) if caching else []
            hits_c = c.lookup_prefix(t.hashes[: want - 1]) if caching else []
            assert hits_c == _ids(hits_py)
            assert c.num_cached_prefix(t.hashes) == py.num_cached_prefix(t.hashes)
            assert c.num_reviving(hits_c) == py.num_reviving(hits_py)
            need = want - len(hits_py)
            if need + py.num_reviving(hits_py) > py.num_reusable:
                continue
            py.touch(hits_py)
            c.touch(hits_c)
            t.py += hits_py
            t.c += hits_c
            t.cached = len(hits_py)
            new_py = py.get_new_blocks(need)
            got = c.get_new_blocks(need)
            assert got == _ids(new_py)
            t.py += new_py
            t.c += got
            live.append(t)
        elif op < 0.55 and live:  # register some of a request's blocks (all, or a prefix)
            t = rng.choice(live)
            end = rng.randint(t.cached, min(len(t.py), len(t.hashes)))
            tokens = [h % 1000 for h in t.hashes for _ in range(BS)]  # (what events name)
            lora = rng.choice([None, "adapter"])
            py.cache_full_blocks(t.py, t.cached, end, t.hashes, tokens, lora)
            c.cache_full_blocks(t.c, t.cached, end, t.hashes, tokens, lora)
            assert t.c == _ids(t.py)  # (a block computed twice is swapped for the cached one)
            t.cached = max(t.cached, end)
        elif op < 0.8 and live:  # finish one: tail first
            t = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                py.free_blocks(reversed(t.py))
                c.free_blocks(reversed(t.c))
            else:
                py.free_blocks_reversed(t.py)
                c.free_blocks_reversed(t.c)
        elif op < 0.85:  # decode: one more block for a request
            if live and py.num_reusable:
                t = rng.choice(live)
                got = c.get_new_blocks(1)
                (block,) = py.get_new_blocks(1)
                assert got == [block.block_id]
                t.py.append(block)
                t.c += got
                # Its hash, once full: the chain goes on (a generated block).
                parent = t.hashes[-1] if t.hashes else 0
                t.hashes.append(BlockHash(hash((parent, rng.randrange(2))) & ((1 << 64) - 1)))
        elif op < 0.9:  # more than there is
            _both(lambda: py.get_new_blocks(n + 1), lambda: c.get_new_blocks(n + 1))
        elif op < 0.96:
            assert c.reset_prefix_cache() == py.reset_prefix_cache()
        else:
            h = rng.choice([t.hashes[0] for t in live] or [BlockHash(1)])
            found = py.lookup(h)
            assert c.lookup(h) == (None if found is None else found.block_id)
        _same_state(py, c)
        assert c.take_events() == py.take_events()
    for t in live:
        py.free_blocks(reversed(t.py))
        c.free_blocks(reversed(t.c))
    _same_state(py, c)
    assert c.num_used == 0 and c.num_free == n


@pytest.mark.parametrize("seed", range(6))
def test_the_free_queue_keeps_the_lru_order_through_holes_and_wraparounds(seed: int) -> None:
    """The free queue is a ring with holes where revived blocks left: many revive / free
    cycles on a small pool fill the ring with holes (it is compacted when full), frees of
    blocks without a hash push at the head, and a reset moves cleared blocks from the middle
    to the head (positions below the first); the positions run past the ring's size many
    times over. The order stays the Python pool's."""
    rng = random.Random(seed)
    n = 6
    py, c = BlockPool(n, BS), CompiledBlockPool(n, BS)
    cached: list[BlockHash] = []  # hashes of cached blocks (each a block of its own)
    for step in range(3_000):
        op = rng.random()
        if op < 0.55 and cached:  # revive a cached block (a prefix hit) and free it again
            h = rng.choice(cached)
            hits_py, hits_c = py.lookup_prefix([h]), c.lookup_prefix([h])
            assert hits_c == _ids(hits_py)
            if hits_py:
                py.touch(hits_py)
                c.touch(hits_c)
                py.free_blocks(hits_py)
                c.free_blocks(hits_c)
        elif op < 0.8 and py.num_reusable:  # a new block, cached under a fresh hash
            h = BlockHash(rng.getrandbits(64))
            b_py, b_c = py.get_new_blocks(1), c.get_new_blocks(1)
            assert b_c == _ids(b_py)
            py.cache_full_blocks(b_py, 0, 1, [h], [0] * BS)
            c.cache_full_blocks(b_c, 0, 1, [h], [0] * BS)
            py.free_blocks(b_py)
            c.free_blocks(b_c)
            cached.append(h)
        elif op < 0.99 and py.num_reusable:  # a block freed without a hash: reused first
            k = rng.randint(1, py.num_reusable)
            b_py, b_c = py.get_new_blocks(k), c.get_new_blocks(k)
            assert b_c == _ids(b_py)
            py.free_blocks(reversed(b_py))
            c.free_blocks(reversed(b_c))
        elif op >= 0.99:
            assert c.reset_prefix_cache() == py.reset_prefix_cache()
        cached = [h for h in cached if py.lookup(h) is not None]  # (reuse evicts hashes)
        if step % 7 == 0 or step > 2_900:
            _same_state(py, c)
    _same_state(py, c)


def test_freeing_a_list_backwards_is_freeing_it_reversed() -> None:
    """free_blocks_reversed(blocks) is free_blocks(reversed(blocks)) on both pools: the same
    free order, and a block freed once too often stops the walk with the same error, the
    blocks before it freed all the same."""
    py, c = BlockPool(8, BS), CompiledBlockPool(8, BS)
    a_py, a_c = py.get_new_blocks(5), c.get_new_blocks(5)
    py.free_blocks_reversed(a_py[:2])
    c.free_blocks_reversed(a_c[:2])
    _same_state(py, c)
    _both(lambda: py.free_blocks_reversed(a_py), lambda: c.free_blocks_reversed(a_c))
    _same_state(py, c)
    assert c.num_used == py.num_used == 0
    with pytest.raises(TypeError, match="a list of blocks"):
        c.free_blocks_reversed(iter([0]))  # type: ignore[arg-type]


def test_a_block_computed_twice_is_swapped_for_the_cached_one() -> None:
    py, c = BlockPool(6, BS), CompiledBlockPool(6, BS)
    a_py, a_c = py.get_new_blocks(2), c.get_new_blocks(2)
    b_py, b_c = py.get_new_blocks(2), c.get_new_blocks(2)
    py.cache_full_blocks(a_py, 0, 2, [BlockHash(7), BlockHash(8)], [])
    c.cache_full_blocks(a_c, 0, 2, [BlockHash(7), BlockHash(8)], [])
    py.cache_full_blocks(
        b_py, 0, 2, [BlockHash(7), BlockHash(9)], []
    )  # block 0 of b is a's block 0
    c.cache_full_blocks(b_c, 0, 2, [BlockHash(7), BlockHash(9)], [])
    assert b_c == _ids(b_py) == [0, 3]
    assert c.ref_cnt(0) == 2 and c.free_order() == [2, 4, 5]  # b's own copy reused first
    _same_state(py, c)


def test_errors_name_the_block_as_the_python_pool_does() -> None:
    py, c = BlockPool(4, BS), CompiledBlockPool(4, BS)
    _both(lambda: py.get_new_blocks(5), lambda: c.get_new_blocks(5))
    blocks_py, blocks_c = py.get_new_blocks(2), c.get_new_blocks(2)
    py.free_blocks(blocks_py)
    c.free_blocks(blocks_c)
    _both(lambda: py.free_blocks(blocks_py), lambda: c.free_blocks(blocks_c))
    _same_state(py, c)  # (the first block's count went below 0 on both sides, the rest kept)
    with pytest.raises(ValueError, match="not in this pool"):
        c.touch([4])
    with pytest.raises(IndexError):
        c.cache_full_blocks([0], 0, 2, [BlockHash(1), BlockHash(2)], [])
    with pytest.raises(TypeError):
        c.cache_full_blocks((0,), 0, 1, [BlockHash(1)], [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in this pool"):
        c.block_hashes([0, 4])
    with pytest.raises(TypeError):
        c.parent_hashes(7)  # type: ignore[arg-type]


def test_hashes_are_read_from_a_vector_of_uint64_or_as_ints() -> None:
    """A buffer of native uint64 (array('Q'), numpy uint64) is read in place; any other
    buffer or sequence as ints: the same blocks, the same answers, the same errors."""
    hashes = [BlockHash((k * 0x9E3779B97F4A7C15) & (2**64 - 1)) for k in range(1, 7)]
    forms: list[Sequence[BlockHash]] = [hashes, tuple(hashes), hash_array(array("Q", hashes)),
             cast("Sequence[BlockHash]", np.asarray(hashes, dtype=np.uint64))]  # fmt: skip
    for form in forms:
        c = CompiledBlockPool(8, BS)
        table = c.get_new_blocks(4)
        c.cache_full_blocks(table, 0, 3, form, [])
        assert [c.block_hash(b) for b in table] == [*hashes[:3], None]
        assert c.parent_hash(table[1]) == hashes[0]
        assert c.lookup_prefix(form) == table[:3]
        assert c.num_cached_prefix(form) == 3
    # Another buffer is a sequence of ints: signed words are no hashes if negative.
    signed = array("q", [h - 2**64 if h >= 2**63 else h for h in hashes])
    assert min(signed) < 0
    with pytest.raises(OverflowError):
        CompiledBlockPool(8, BS).cache_full_blocks([0, 1, 2], 0, 3, signed, [])  # type: ignore[arg-type]
    with pytest.raises(IndexError):  # (a vector shorter than the blocks registered)
        CompiledBlockPool(8, BS).cache_full_blocks([0, 1], 0, 2, hash_array(array("Q", [5])), [])


def test_a_pool_of_hashes_in_one_home_slot_still_finds_and_forgets_each() -> None:
    # The map probes linearly and shifts entries back on deletion: hashes that share a slot
    # (multiples of 2**61 all land in slot 0 of any table) are found and removed in any order.
    c = CompiledBlockPool(16, BS)
    table = c.get_new_blocks(16)
    hashes = [BlockHash(k << 61) for k in range(8)] + [BlockHash(k) for k in range(1, 9)]
    c.cache_full_blocks(table, 0, 16, hashes, [])
    assert c.num_cached_prefix(hashes) == 16
    c.free_blocks(table[::-3])
    order = c.free_order()
    c.get_new_blocks(len(order))  # evicts those, in free order
    left = {h for h, b in zip(hashes, table, strict=True) if b not in order}
    assert set(c.cached_hashes()) == left
    assert all(c.lookup(h) is not None for h in left)


# -- whole runs ---------------------------------------------------------------------------------


def _trace(**kw: Any) -> Any:
    spec = SyntheticSpec(num_requests=120, rate=40.0, input_length=300, output_length=40,
                         distribution="uniform", shared_prefix_fraction=0.5, seed=3,
                         **kw)  # fmt: skip
    return synthetic_trace(spec, trace_block_size=64)


# A CPU tier stored to write-through, and an fs tier it cascades to.
WRITE_THROUGH: dict[str, Any] = {
    "num_gpu_blocks": 150,
    "num_cpu_blocks": 200,
    "offload_policy": "write-through",
}
FS = StorageTierSpec(StorageKind.FS, 400, read_gbps=8.0, write_gbps=4.0)


@pytest.mark.parametrize(
    ("changes", "engines", "router", "prefill_engines"),
    [
        ({}, 1, "round-robin", 0),
        ({"num_gpu_blocks": 120}, 1, "round-robin", 0),  # preemptions
        ({"num_gpu_blocks": 400}, 3, "kv-aware", 0),
        ({"enable_prefix_caching": False}, 2, "least-loaded", 0),
        ({"enable_kv_cache_events": True, "num_gpu_blocks": 300}, 2, "kv-aware", 0),
        ({}, 3, "kv-aware", 1),  # P/D: a prefill engine, two decode engines pulling
        # Write-through to a CPU tier (and an fs tier below it): stores, cascades, loads.
        (WRITE_THROUGH | {"storage_tiers": (FS,)}, 2, "round-robin", 0),
        (WRITE_THROUGH | {"enable_kv_cache_events": True}, 1, "round-robin", 0),
    ],
)
def test_replays_give_the_same_rows_with_either_pool(
    monkeypatch: pytest.MonkeyPatch,
    changes: dict[str, Any],
    engines: int,
    router: str,
    prefill_engines: int,
) -> None:
    cfg = EngineConfig.of(
        **{"block_size": 16, "num_gpu_blocks": 2000, "max_num_seqs": 32, **changes}
    )
    trace = _trace()
    runs = {}
    for impl, switch in (("python", "0"), ("compiled", "1")):
        monkeypatch.setenv(ENV, switch)
        runs[impl] = replay(trace, cfg, num_engines=engines, router=router, num_samples=50,
                            prefill_engines=prefill_engines)  # fmt: skip
    py, c = runs["python"], runs["compiled"]
    assert all(isinstance(core.pool, CompiledBlockPool) for core in c.cores)
    assert all(isinstance(core.pool, BlockPool) for core in py.cores)
    assert c.records == py.records
    assert c.samples == py.samples
    assert (c.num_steps, c.sim_duration) == (py.num_steps, py.sim_duration)
    assert c.link_bytes == py.link_bytes
    if "num_cpu_blocks" in changes:  # (the tiers were used)
        assert sum(sum(r.cached_tokens_by_tier.values()) for r in c.records) > 0
    if "num_gpu_blocks" in changes and engines == 1:
        assert sum(r.preemptions for r in c.records) > 0
    if prefill_engines:
        assert all(r.status == "finished" and r.prefill_engine == 0 for r in c.records)
    for a, b in zip(c.cores, py.cores, strict=True):
        assert free_order(a.pool) == free_order(b.pool)
        assert a.pool.cached_hashes() == b.pool.cached_hashes()


# -- choosing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "compiled"),
    [
        ({}, True),
        ({"enable_prefix_caching": False}, True),
        ({"enable_kv_cache_events": True}, True),
        ({"eviction_policy": EvictionPolicyName.LINEAGE}, False),
        ({"kv_role": KVRole.PRODUCER}, True),
        ({"num_cpu_blocks": 64, "offload_policy": "write-through"}, True),
        ({"num_cpu_blocks": 64, "offload_policy": "evict"}, False),  # write-back: retains
        ({"model": MODEL_PRESETS["gpt-oss-20b"]}, False),  # hybrid: sliding-window groups
    ],
)
def test_what_the_compiled_pool_serves(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], compiled: bool
) -> None:
    monkeypatch.setenv(ENV, "auto")
    cfg = EngineConfig.of(**changes)
    assert serves(cfg) is compiled
    stack = build_kv_stack(cfg, lambda n: 1.0)
    assert isinstance(stack.pool, CompiledBlockPool) is compiled
    if compiled:
        assert isinstance(stack.pool, CompiledEventPool) is cfg.cache.enable_kv_cache_events
    monkeypatch.setenv(ENV, "0")
    assert isinstance(build_kv_stack(cfg, lambda n: 1.0).pool, BlockPool)


@pytest.mark.parametrize(("policy", "compiled"), [("evict", False), ("write-through", True)])
def test_a_cpu_tier_given_from_outside_counts_as_the_engines(
    monkeypatch: pytest.MonkeyPatch, policy: str, compiled: bool
) -> None:
    """A CPU tier handed to the stack (shared, built elsewhere) under the config's write-back
    policy gets the Python pool, which retains and displaces; write-through the compiled."""
    monkeypatch.setenv(ENV, "auto")
    cfg = EngineConfig.of(offload_policy=OffloadPolicy(policy))
    assert serves(cfg) is True and serves(cfg, given_cpu=True) is compiled
    stack = build_kv_stack(cfg, lambda n: 1.0, cpu=LruTier(100, cfg.block_size))
    assert isinstance(stack.pool, CompiledBlockPool) is compiled
    assert stack.connector is not None


def test_a_pool_whose_init_never_ran_raises_instead_of_crashing() -> None:
    class Skips(CompiledBlockPool):
        __slots__ = ()

        def __init__(self) -> None:  # (no super().__init__)
            pass

    pool = Skips()
    for call in (lambda: pool.get_new_blocks(1), lambda: pool.free_blocks([0]),
                 lambda: pool.lookup_prefix([BlockHash(1)]), pool.reset_prefix_cache):  # fmt: skip
        with pytest.raises(RuntimeError, match="not initialised"):
            call()
    assert pool.num_free == 0 and pool.usage == 0.0


def test_a_failed_registration_leaves_the_event_pool_whole() -> None:
    # A hash list too short: as in the Python pool, the block registered before the error
    # gets no event; evicting it later and a reset do not trip over its missing tokens.
    c = CompiledEventPool(2, BS)
    table = c.get_new_blocks(2)
    with pytest.raises(IndexError):
        c.cache_full_blocks(table, 0, 2, [BlockHash(5)], list(range(2 * BS)))
    py = BlockPool(2, BS, record_events=True)
    py_table = py.get_new_blocks(2)
    with pytest.raises(IndexError):
        py.cache_full_blocks(py_table, 0, 2, [BlockHash(5)], list(range(2 * BS)))
    assert c.take_events() == py.take_events() == []
    c.reset_prefix_cache()
    c.free_blocks(reversed(table))
    assert c.get_new_blocks(2) == [1, 0] and c.num_used == 2


def test_blocks_must_be_plain_ids_and_are_cached_under_one_hash() -> None:
    c = CompiledBlockPool(2, BS)
    table = c.get_new_blocks(1)

    class Id(int):
        pass

    with pytest.raises(TypeError, match="its id"):
        c.touch([Id(0)])
    c.cache_full_blocks(table, 0, 1, [BlockHash(7)], [])
    with pytest.raises(ValueError, match="under another hash"):
        c.cache_full_blocks(table, 0, 1, [BlockHash(8)], [])  # (the map never outgrows the pool)
    assert c.cached_hashes() == {7: 0}
