"""Property tests: random workloads keep the block pool, the request tables and the event
stream consistent after every step, under both eviction policies and both victim choices."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.engine.core import EngineCore
from mocker.engine.virtual import Abort, VirtualDriver
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.request import EngineRequest, SamplingParams
from tests.support.engines import small_config
from tests.support.pools import all_blocks, free_order, view

BS = 4
PREFIXES = [list(range(1000 + 100 * p, 1000 + 100 * p + 4 * BS)) for p in range(3)]


@dataclass
class Workload:
    config: dict[str, Any]
    requests: list[EngineRequest]
    aborts: list[Abort]


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    config: dict[str, Any] = {
        "block_size": BS,
        "num_gpu_blocks": draw(st.integers(16, 40)),
        "max_num_seqs": draw(st.integers(2, 8)),
        "max_num_batched_tokens": draw(st.sampled_from([16, 24, 64])),
        "max_model_len": 64,
        "enable_chunked_prefill": draw(st.booleans()),
        "eviction_policy": draw(st.sampled_from(["lru", "lineage"])),
        "preemption_victim": draw(st.sampled_from(["newest", "oldest"])),
        "eos_probability": draw(st.sampled_from([0.0, 0.05])),
        "enable_kv_cache_events": True,
    }
    if not config["enable_chunked_prefill"]:
        config["max_num_batched_tokens"] = 64
    n = draw(st.integers(4, 24))
    requests = []
    for i in range(n):
        prefix = draw(st.sampled_from([None, 0, 0, 1, 2]))
        prefix_tokens = PREFIXES[prefix][: draw(st.integers(1, 16))] if prefix is not None else []
        suffix = [5000 + 37 * i + j for j in range(draw(st.integers(0, 12)))]
        prompt = prefix_tokens + suffix or [7]
        max_tokens = draw(st.integers(1, 24))
        max_tokens = min(max_tokens, config["num_gpu_blocks"] * BS - len(prompt), 63 - len(prompt))
        requests.append(
            EngineRequest(
                f"r{i}",
                prompt,
                SamplingParams(max_tokens=max(1, max_tokens), ignore_eos=draw(st.booleans())),
                arrival_time=draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0, 2.0])),
            )
        )
    aborts = [
        Abort(draw(st.floats(0.0, 2.5)), f"r{i}")
        for i in draw(st.lists(st.integers(0, n - 1), max_size=3, unique=True))
    ]
    return Workload(config, requests, aborts)


def check_invariants(core: EngineCore, index: dict[int, tuple[int, ...]]) -> None:
    pool = core.pool
    blocks = all_blocks(pool)
    # Every reference is a request's block-table entry, and nothing else.
    holders: Counter[int] = Counter()
    for request in core.requests.values():
        for i, entry in enumerate(request.blocks):
            block = view(pool, entry)
            holders[block.block_id] += 1
            if holders[block.block_id] > 1 or block.block_hash is not None:
                # Shared blocks are shared prefix blocks: same position, same hash.
                assert block.block_hash == request.block_hashes[i]
    for block in blocks:
        assert block.ref_cnt >= 0
        assert block.ref_cnt == holders[block.block_id], block
    # in use + cached-free + free = pool size, and the policy holds exactly the free ones.
    in_use = sum(1 for b in blocks if b.ref_cnt > 0)
    cached_free = sum(1 for b in blocks if b.ref_cnt == 0 and b.block_hash is not None)
    free = sum(1 for b in blocks if b.ref_cnt == 0 and b.block_hash is None)
    assert in_use + cached_free + free == len(blocks)
    assert pool.num_used == in_use and pool.num_free == cached_free + free
    assert set(free_order(pool)) == {b.block_id for b in blocks if b.ref_cnt == 0}
    # The hash map agrees with the blocks, and replaying the events reproduces it exactly.
    cached = pool.cached_hashes()
    assert cached == {b.block_hash: b.block_id for b in blocks if b.block_hash is not None}
    assert set(index) == set(cached)
    # Stored token ids are exactly the tokens of the request blocks cached under those hashes.
    for request in core.requests.values():
        for i in range(request.num_cached_blocks):
            h = request.block_hashes[i]
            assert index[h] == tuple(request.all_token_ids[i * BS : (i + 1) * BS])


def apply_events(
    index: dict[int, tuple[int, ...]], events: Iterable[KVEvent], parents: dict[int, int | None]
) -> None:
    for ev in events:
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            for j, h in enumerate(ev.block_hashes):
                assert h not in index, "stored twice without removal"
                index[h] = tuple(ev.token_ids[j * BS : (j + 1) * BS])
                parents[h] = parent
                parent = h
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                del index[h]
        elif isinstance(ev, AllBlocksCleared):
            index.clear()


def run_checked(w: Workload) -> Counter[str]:
    core = EngineCore(small_config(**w.config))
    driver = VirtualDriver(core)
    index: dict[int, tuple[int, ...]] = {}
    parents: dict[int, int | None] = {}
    seen: Counter[str] = Counter()
    for result in driver.steps(w.requests, w.aborts):
        apply_events(index, result.kv_events, parents)
        check_invariants(core, index)
        seen["hits"] += result.stats.prefix_hits
        seen["preemptions"] += result.stats.num_preemptions
        seen["evictions"] += sum(isinstance(e, BlockRemoved) for e in result.kv_events)
    # Parent hashes chain: a stored block's parent was itself stored before it.
    for h, parent in parents.items():
        assert parent is None or parent in parents, h
    assert not core.has_unfinished_requests()
    assert core.pool.num_used == 0
    assert all(b.ref_cnt == 0 for b in all_blocks(core.pool))
    return seen


def test_invariants_hold_under_random_workloads() -> None:
    totals: Counter[str] = Counter()
    examples = 0

    @settings(
        max_examples=200,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(workloads())
    def check(w: Workload) -> None:
        nonlocal examples
        seen = run_checked(w)
        examples += 1
        for key, value in seen.items():
            totals[key] += value > 0

    check()
    # The generator must really exercise the interesting paths, not just pass vacuously.
    assert totals["hits"] >= examples // 4, totals
    assert totals["preemptions"] >= examples // 10, totals
    assert totals["evictions"] >= examples // 10, totals


def test_a_known_heavy_workload_preempts_hits_and_evicts() -> None:
    shared = PREFIXES[0]
    requests = [
        EngineRequest(
            f"r{i}",
            shared + [9000 + i] * (i % 5),
            SamplingParams(max_tokens=24),
            arrival_time=0.1 * (i % 4),
        )
        for i in range(12)
    ]
    requests += [
        EngineRequest(
            f"u{i}",
            [7000 + 31 * i + j for j in range(20)],
            SamplingParams(max_tokens=20),
            arrival_time=0.3,
        )
        for i in range(6)
    ]
    for policy in ("lru", "lineage"):
        w = Workload(
            {
                "block_size": BS,
                "num_gpu_blocks": 24,
                "max_num_seqs": 8,
                "max_num_batched_tokens": 24,
                "max_model_len": 64,
                "eviction_policy": policy,
                "enable_kv_cache_events": True,
            },
            requests,
            [Abort(0.2, "r3"), Abort(0.0, "r7")],
        )
        seen = run_checked(w)
        assert seen["hits"] > 0 and seen["preemptions"] > 0 and seen["evictions"] > 0, seen
