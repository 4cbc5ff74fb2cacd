"""The KV-event stream is true: a consumer applying it ends with exactly the engine's cache per
tier, with every block's tokens and parent as the engine hashed them — after every step of
random workloads with shared prefixes, preemption, aborts, eviction, resets and a host tier."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.config_choices import EvictionPolicyName, OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.virtual import VirtualDriver, VirtualRun
from mocker.kv.events import parents_first
from mocker.kv.hashing import BlockHash, BlockHasher
from tests.support.kv_index import EventIndex
from tests.support.workloads import random_geometry, random_requests


def _parent(h: int | None) -> BlockHash | None:
    return None if h is None else BlockHash(h)


def test_parents_first_orders_chains_and_forests() -> None:
    # (hash, parent): two chains given leaf first and mixed, one block whose parent is absent.
    items = [(3, 2), (2, 1), (1, None), (12, 11), (11, 10), (10, None), (21, 99)]
    ordered = parents_first(items, lambda x: BlockHash(x[0]), lambda x: _parent(x[1]))
    position = {h: i for i, (h, _) in enumerate(ordered)}
    assert sorted(position) == [1, 2, 3, 10, 11, 12, 21]
    for h, parent in items:
        if parent in position:
            assert position[parent] < position[h]


def test_parents_first_handles_long_chains() -> None:
    chain = [(i, i - 1 if i else None) for i in range(50_000)]  # no recursion limit
    assert (
        parents_first(reversed(chain), lambda x: BlockHash(x[0]), lambda x: _parent(x[1])) == chain
    )


def check_index(index: EventIndex, core: EngineCore) -> None:
    """The index equals the engine's cached set per tier, and every block's tokens and
    parent hash to the engine's own hash for it."""
    assert index.hashes("GPU") == set(core.pool.cached_hashes())
    host_hashes = core.cpu.resident_keys() if core.cpu is not None else set()
    assert index.hashes("CPU") == host_hashes
    hasher = core.hasher
    assert isinstance(hasher, BlockHasher)  # (the config's default: the fast chain)
    for medium in ("GPU", "CPU"):
        for h, known in index.media[medium].items():
            assert hasher.hash_block(_parent(known.parent), known.tokens) == h
    # Each live request's cached blocks were announced with its tokens at those positions.
    bs = core.config.block_size
    for request in core.requests.values():
        for i, block in enumerate(request.blocks[: request.num_cached_blocks]):
            h = request.block_hashes[i]
            if core.pool.lookup(h) is block:
                known = index.media["GPU"][h]
                assert known.tokens == tuple(request.all_token_ids[i * bs : (i + 1) * bs])
                assert known.parent == (request.block_hashes[i - 1] if i else None)


def random_workload(seed: int, seen: Counter[str]) -> None:
    rng = random.Random(seed)
    block_size = 4
    config = EngineConfig.of(
        **random_geometry(rng, block_size),
        eviction_policy=rng.choice([EvictionPolicyName.LRU, EvictionPolicyName.LINEAGE]),
        num_cpu_blocks=rng.choice([0, 0, 8, 64]),  # no host tier half the time
        offload_policy=rng.choice([OffloadPolicy.EVICT, OffloadPolicy.WRITE_THROUGH]),
        cpu_write_gbps=rng.choice([0.0, 1.0, 32.0]),
        cpu_read_gbps=rng.choice([0.0, 1.0, 32.0]),
        enable_kv_cache_events=True,
        seed=seed,
    )
    core = EngineCore(config)
    requests, aborts = random_requests(rng)
    index = EventIndex(block_size)
    run = VirtualRun()
    for result in VirtualDriver(core).steps(requests, aborts, run=run):
        index.apply(result.kv_events)
        check_index(index, core)
        seen["prefix_hits"] += result.stats.prefix_hits
        if rng.random() < 0.03:
            # POST /reset_prefix_cache between two passes, whatever is running.
            cleared, reset = core.reset_prefix_cache(result.end)
            assert cleared is not None  # (a partial reset is never refused)
            index.apply(reset.kv_events)
            check_index(index, core)
            seen["resets"] += 1
            seen["reset_kept"] += len(core.pool.cached_hashes())
            seen["reset_cleared"] += cleared
    seen["preemptions"] += core.scheduler.num_preemptions
    seen["aborted"] += len(run.aborted)
    seen["removed"] += index.counts["BlockRemoved"]
    if core.connector is not None:
        seen["host_loads"] += core.connector.loaded_blocks
        seen["host_stores"] += core.connector.stored_blocks
    assert not core.requests


def test_events_match_the_cache_over_seeded_workloads() -> None:
    seen: Counter[str] = Counter()
    for seed in range(80):
        random_workload(seed, seen)
    # The property was exercised: hits, evictions, preemptions, aborts, the host tier in
    # both directions, and resets that kept blocks of running requests.
    for what in ("prefix_hits", "removed", "preemptions", "aborted", "host_loads",
                 "host_stores", "resets", "reset_kept", "reset_cleared"):  # fmt: skip
        assert seen[what] > 0, what


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(1000, 2**31))
def test_events_match_the_cache_property(seed: int) -> None:
    random_workload(seed, Counter())
