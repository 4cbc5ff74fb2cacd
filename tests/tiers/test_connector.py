"""The tier connector on the virtual clock: both store policies, batching, loads, timeouts, aborts.

Expected times are computed here from the models' formulas (Dynamo's prefill polynomial; a
link moves bytes at its bandwidth, shared equally by concurrent transfers) and the block
bytes, never by calling the code under test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.virtual import Abort, VirtualDriver, VirtualRun
from mocker.kv.compiled_pool import CompiledBlockPool
from mocker.kv.events import BlockRemoved, BlockStored
from mocker.request import EngineRequest, RequestStatus, SamplingParams
from mocker.tiers.stores import _cut_runs
from mocker.tiers.transfers import TransferKind
from tests.support.engines import prefill_ms, small_config
from tests.support.pools import all_blocks, free_order

BLOCK_BYTES = 4 * 32 * 2 * 8 * 128 * 2  # block_size 4 × Llama-3-8B's 131072 B/token
BLOCK_S = BLOCK_BYTES / 1e9  # seconds per block at 1 GB/s


def host_config(**overrides: Any) -> EngineConfig:
    host = {
        "max_num_batched_tokens": 512,
        "max_model_len": 64,
        "num_gpu_blocks": 16,
        "num_cpu_blocks": 64,
        "cpu_write_gbps": 1.0,
        "cpu_read_gbps": 1.0,
        "enable_kv_cache_events": True,
    }
    return small_config(**(host | overrides))


def prompt(k: int, n: int = 32) -> list[int]:
    return [1000 * (k + 1) + j for j in range(n)]


def one(rid: str, tokens: list[int], at: float, max_tokens: int = 1) -> EngineRequest:
    return EngineRequest(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True), at)


def run(
    core: EngineCore, requests: list[EngineRequest], aborts: Sequence[Abort] = ()
) -> VirtualRun:
    result = VirtualRun()
    for _ in VirtualDriver(core).steps(requests, list(aborts), run=result):
        pass
    return result


def finished(result: VirtualRun) -> dict[str, Any]:
    return {r.request_id: r for r in result.finished}


def assert_quiescent(core: EngineCore) -> None:
    assert core.pool.num_used == 0
    assert core.pool.num_displaced == 0
    assert core.pool.num_free == core.pool.num_blocks
    assert core.cpu is not None and core.cpu.num_incoming == 0
    assert core.cpu.num_pinned() == 0
    assert core.connector is not None and not core.connector.has_pending
    assert len(core.connector.d2h) == 0 and len(core.connector.h2d) == 0


# -- evict policy ------------------------------------------------------------------------------


def test_evict_keeps_the_device_slot_until_its_copy_ends() -> None:
    core = EngineCore(host_config(num_gpu_blocks=8))
    # A: 28 tokens = 7 full blocks, cached and then free but dirty (not on host).
    # B needs 7 blocks; one is free, so 6 of A's must be copied out first.
    result = run(core, [one("a", prompt(0, 28), 0.0), one("b", prompt(1, 28), 1.0)])
    b = finished(result)["b"]
    assert b.first_scheduled_time == pytest.approx(1.0 + 6 * BLOCK_S)
    assert b.first_token_time == pytest.approx(1.0 + 6 * BLOCK_S + prefill_ms(28) / 1000)
    # After b, every free block is dirty: the background evictor copies the least recently
    # used one, to keep 1 block (an eighth of this pool) reusable.
    assert core.connector is not None and core.connector.stored_blocks == 6 + 1
    assert core.pool.num_reusable == 1
    assert_quiescent(core)


def test_evict_while_copying_counts_the_slot_as_used() -> None:
    core = EngineCore(host_config(num_gpu_blocks=8))
    core.add_request(one("a", prompt(0, 28), 0.0))
    end = core.step(0.0).end
    core.add_request(one("b", prompt(1, 28), end))
    result = core.step(end)
    assert result.idle  # b waits for the copies
    assert core.pool.num_displaced == 6 and core.pool.num_used == 0
    assert core.pool.usage == pytest.approx(6 / 8)
    removed = [e for e in result.kv_events if isinstance(e, BlockRemoved)]
    assert sum(len(e.block_hashes) for e in removed) == 6
    assert all(e.medium == "GPU" for e in removed)
    deadline = core.next_transfer_deadline()
    assert deadline is not None and deadline == pytest.approx(end + 6 * BLOCK_S)
    assert core.cpu is not None and core.cpu.num_resident == 0  # nothing visible yet
    landed = core.step(deadline)
    stored = [e for e in landed.kv_events if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert sum(len(e.block_hashes) for e in stored) == 6
    assert core.cpu.num_resident == 6
    # b runs once the slots are free: its whole prompt, in the pass that starts then.
    assert landed.stats.num_scheduled_tokens == 28 and landed.start == deadline
    [record] = landed.transfers
    assert record.kind is TransferKind.STORE and record.nbytes == 6 * BLOCK_BYTES
    assert record.duration == pytest.approx(6 * BLOCK_S)


def test_blocks_already_on_host_are_not_copied_again() -> None:
    core = EngineCore(host_config())
    reqs = []
    t = 0.0
    for _ in range(3):  # three rounds over four 8-block prompts: 2× the device pool
        for k in range(4):
            reqs.append(one(f"r{t}", prompt(k), t))
            t += 1.0
    result = run(core, reqs)
    assert len(result.finished) == 12
    assert core.connector is not None
    # Every distinct full block is copied to host at most once.
    assert core.connector.stored_blocks <= 4 * 8
    assert core.connector.loaded_blocks > 0
    assert_quiescent(core)


def test_evictions_are_copied_in_batches_of_offload_batch_size() -> None:
    core = EngineCore(host_config(num_gpu_blocks=80, num_cpu_blocks=200, max_model_len=512))
    core.add_request(one("a", prompt(0, 280), 0.0))  # 70 cached blocks
    end = core.step(0.0).end
    core.add_request(one("b", prompt(1, 280), end))  # 10 free: 60 must be copied out
    core.step(end)
    assert core.connector is not None
    sizes = sorted(core.connector.stores.batches())
    assert sizes == [28, 32]
    # Both share the link: the 28-block one ends first, then the other at 60 blocks' time.
    deadline = core.next_transfer_deadline()
    assert deadline is not None
    done = core.step(deadline).transfers
    assert [t.num_blocks for t in done] == [28]
    assert done[0].end == pytest.approx(end + 2 * 28 * BLOCK_S)


# -- write-through -----------------------------------------------------------------------------


def test_write_through_holds_a_finished_request_until_its_stores_end() -> None:
    core = EngineCore(host_config(offload_policy="write-through"))
    core.add_request(one("a", prompt(0, 30), 0.0))  # 7 full prompt blocks, 2 tokens spare
    result = core.step(0.0)
    assert result.finished and result.finished[0].request_id == "a"
    # Its whole block table (7 full blocks + the partial one) is held, as vLLM's delay_free,
    # though the request is gone.
    assert core.pool.num_used == 8
    assert core.cpu is not None and core.cpu.num_incoming == 7
    assert core.connector is not None
    assert core.cpu.num_resident == 0  # not visible until the copy ends
    # The copy is an event at the pass's end, not a transfer started in the future: the
    # link sees nothing until the clock gets there.
    assert core.next_transfer_deadline() == result.end and not len(core.connector.d2h)
    assert core.advance_transfers(result.end).transfers == []
    assert len(core.connector.d2h) == 1
    deadline = core.next_transfer_deadline()
    assert deadline is not None and deadline == pytest.approx(result.end + 7 * BLOCK_S)
    idle = core.advance_transfers(deadline)
    assert core.cpu.num_resident == 7 and core.pool.num_used == 0
    assert [t.num_blocks for t in idle.transfers] == [7]
    assert_quiescent(core)


def test_write_through_copies_only_full_prompt_blocks() -> None:
    core = EngineCore(host_config(offload_policy="write-through"))
    # 10 prompt tokens (2 full blocks) + 14 generated tokens fill 6 blocks in all.
    run(core, [one("a", prompt(0, 10), 0.0, max_tokens=15)])
    assert core.connector is not None and core.connector.stored_blocks == 2


def test_eviction_is_free_under_write_through() -> None:
    core = EngineCore(host_config(num_gpu_blocks=8, offload_policy="write-through"))
    result = run(core, [one("a", prompt(0, 28), 0.0), one("b", prompt(1, 28), 1.0)])
    b = finished(result)["b"]
    assert b.first_scheduled_time == 1.0  # a's blocks are on host: no copy before reuse


# -- onboarding --------------------------------------------------------------------------------


def evicted_then_again(**overrides: Any) -> tuple[EngineCore, VirtualRun, list[RequestStatus]]:
    """a (8 blocks), b, c push a out of the 16-block device pool; then a comes back."""
    core = EngineCore(host_config(offload_policy="write-through", **overrides))
    reqs = [one("a", prompt(0), 0.0), one("b", prompt(1), 1.0), one("c", prompt(2), 2.0)]
    reqs.append(one("a2", prompt(0), 3.0))
    statuses: list[RequestStatus] = []
    result = VirtualRun()
    for _ in VirtualDriver(core).steps(reqs, run=result):
        if "a2" in core.requests:
            statuses.append(core.requests["a2"].status)
    return core, result, statuses


def test_host_hit_loads_parks_the_request_and_resumes_it() -> None:
    core, result, statuses = evicted_then_again()
    a2 = finished(result)["a2"]
    # No device hit; 7 blocks on host (the lookup stops one token short of the prompt).
    assert a2.num_cached_tokens == 28 and a2.num_tier_cached_tokens == 28
    assert RequestStatus.WAITING_FOR_REMOTE_KVS in statuses
    ttft = 7 * BLOCK_S + prefill_ms(4) / 1000
    assert a2.first_token_time - a2.arrival_time == pytest.approx(ttft)
    assert core.connector is not None and core.connector.loaded_blocks == 7
    assert_quiescent(core)


def test_device_hit_then_host_continuation() -> None:
    core = EngineCore(host_config(offload_policy="write-through"))
    # a caches 8 blocks; b and c (sharing a's first 2 blocks) evict a's other blocks.
    shared = prompt(0)[:8]
    reqs = [
        one("a", prompt(0), 0.0),
        one("b", shared + prompt(1)[:24], 1.0),
        one("c", prompt(2), 2.0),
        one("a2", prompt(0), 3.0),
    ]
    a2 = finished(run(core, reqs))["a2"]
    assert a2.num_cached_tokens == 28
    assert 0 < a2.num_tier_cached_tokens < 28  # part device hit, the rest loaded from host


def test_short_host_hits_are_recomputed() -> None:
    core, result, _ = evicted_then_again(min_load_blocks=8)
    a2 = finished(result)["a2"]
    assert a2.num_tier_cached_tokens == 0 and a2.num_cached_tokens == 0
    assert core.connector is not None and core.connector.loaded_blocks == 0


def test_loads_slower_than_prefill_are_recomputed() -> None:
    # 7 blocks at 0.0002 GB/s take ~18 s, far above prefill(28) ≈ 17 ms.
    core, result, _ = evicted_then_again(cpu_read_gbps=0.0002)
    assert finished(result)["a2"].num_tier_cached_tokens == 0
    assert core.connector is not None and core.connector.loaded_blocks == 0


def test_a_load_past_its_timeout_recomputes_and_leaks_nothing() -> None:
    # The load pays off on paper (3.7 ms < 16.6 ms) but a 1 ms timeout cuts it short.
    core, result, statuses = evicted_then_again(load_timeout=0.001)
    a2 = finished(result)["a2"]
    assert RequestStatus.WAITING_FOR_REMOTE_KVS in statuses
    assert a2.num_tier_cached_tokens == 0 and a2.num_cached_tokens == 0
    # Waited the timeout, then computed the whole prompt.
    assert a2.first_token_time - a2.arrival_time == pytest.approx(0.001 + prefill_ms(32) / 1000)
    assert core.connector is not None and core.connector.loaded_blocks == 0
    assert_quiescent(core)


def test_a_load_that_ends_at_its_timeout_made_it() -> None:
    # The timeout is the copy's own time (7 blocks at 1 GB/s): both fall due at one
    # instant, and the copy ends first, so the load counts and nothing is recomputed.
    core, result, _ = evicted_then_again(load_timeout=7 * BLOCK_BYTES / 1e9)
    a2 = finished(result)["a2"]
    assert a2.num_tier_cached_tokens == 28
    ttft = 7 * BLOCK_S + prefill_ms(4) / 1000
    assert a2.first_token_time - a2.arrival_time == pytest.approx(ttft)
    assert core.connector is not None and core.connector.loaded_blocks == 7
    assert_quiescent(core)


def test_abort_during_a_load_releases_everything() -> None:
    core = EngineCore(host_config(offload_policy="write-through"))
    reqs = [one("a", prompt(0), 0.0), one("b", prompt(1), 1.0), one("c", prompt(2), 2.0)]
    reqs.append(one("a2", prompt(0), 3.0))
    result = run(core, reqs, [Abort(3.0 + BLOCK_S, "a2")])  # mid-load
    assert [o.request_id for o in result.aborted] == ["a2"]
    assert "a2" not in finished(result)
    # Its hits count when its load ends, so none were counted: its output claims none.
    assert result.aborted[0].tier_hits == ()
    assert core.connector is not None and core.connector.loaded_blocks == 0
    assert_quiescent(core)


def test_instant_links_still_go_through_the_transfer_path() -> None:
    core, result, _ = evicted_then_again(cpu_write_gbps=0, cpu_read_gbps=0)
    a2 = finished(result)["a2"]
    assert a2.num_tier_cached_tokens == 28
    assert core.connector is not None and core.connector.loaded_blocks == 7
    assert a2.first_token_time - a2.arrival_time == pytest.approx(prefill_ms(4) / 1000)
    assert_quiescent(core)


def test_speedup_divides_transfer_times() -> None:
    _, result, _ = evicted_then_again(speedup_ratio=10.0)
    a2 = finished(result)["a2"]
    ttft = (7 * BLOCK_S + prefill_ms(4) / 1000) / 10
    assert a2.first_token_time - a2.arrival_time == pytest.approx(ttft)


def test_write_through_releases_a_finished_request_tail_first() -> None:
    core = EngineCore(host_config(offload_policy="write-through"))
    a = core.add_request(one("a", prompt(0, 30), 0.0))
    [finished] = core.step(0.0).finished
    assert finished.request_id == "a"
    while (deadline := core.next_transfer_deadline()) is not None:  # the start, then the end
        core.advance_transfers(deadline)
    blocks = all_blocks(core.pool)
    cached_order = [blocks[i].block_hash for i in free_order(core.pool)]
    cached_order = [h for h in cached_order if h is not None]
    # Leaf first, as vLLM frees a request's table: the chain's root is evicted last.
    assert cached_order == list(reversed(a.block_hashes[:7]))


def test_tiers_that_disagree_on_publishing_events_are_refused() -> None:
    # A cascade copies the CPU tier's event records into the tiers below it.
    from mocker.storage_spec import StorageKind, StorageTierSpec
    from mocker.tiers.lru import LruTier

    fs = StorageTierSpec(StorageKind.FS, 64, read_gbps=8.0, write_gbps=4.0)
    config = small_config(num_cpu_blocks=16, offload_policy="write-through",
                          storage_tiers=(fs,), enable_kv_cache_events=True)  # fmt: skip
    with pytest.raises(ValueError, match="only the fs tier records KV events"):
        EngineCore(config, cpu_tier=LruTier(16, config.block_size, record_events=False))


def test_a_block_without_a_hash_is_never_planned_for_a_store() -> None:
    from mocker.kv.block import BlockId, KVBlock

    core = EngineCore(small_config(num_cpu_blocks=8, offload_policy="write-through"))
    assert core.connector is not None
    # (Block 0 of a fresh pool: a `KVBlock` of the Python pool, an id of the compiled one.)
    block: Any = 0 if isinstance(core.pool, CompiledBlockPool) else KVBlock(BlockId(0))
    with pytest.raises(RuntimeError, match="holds no hash"):
        core.connector.stores.plan([block])
    assert core.connector.cpu.num_incoming == 0


@pytest.mark.parametrize(
    ("runs", "size", "pieces"),
    [
        ([("a", 40)], 32, [[("a", 32)], [("a", 8)]]),
        ([("a", 32)], 32, [[("a", 32)]]),
        ([("a", 10), ("b", 30)], 32, [[("a", 10), ("b", 22)], [("b", 8)]]),
        ([("a", 1), ("b", 1), ("c", 1)], 1, [[("a", 1)], [("b", 1)], [("c", 1)]]),
        ([("a", 3), ("b", 4)], 3, [[("a", 3)], [("b", 3)], [("b", 1)]]),
        ([], 32, []),
    ],
)
def test_a_stores_owners_are_cut_with_its_blocks(
    runs: list[Any], size: int, pieces: list[Any]
) -> None:
    """A store larger than offload_batch_size is copied in pieces: each piece's owners are
    the runs of its blocks, every block counted once."""
    assert _cut_runs(runs, size) == pieces


@pytest.mark.parametrize("batch", [2, 32])
def test_a_cascade_names_each_blocks_parent_as_the_cpu_tier_does(batch: int) -> None:
    """A store's parent keys travel with it to its cascades (nothing looks them up again):
    every block in fs has the parent it has in the CPU tier, its chain's previous block,
    also for a store copied in pieces and one of which the CPU tier held a part already."""
    from mocker.storage_spec import StorageKind, StorageTierSpec

    fs = StorageTierSpec(StorageKind.FS, 64, read_gbps=8.0, write_gbps=4.0)
    config = host_config(offload_policy="write-through", storage_tiers=(fs,),
                         enable_kv_cache_events=False, offload_batch_size=batch)  # fmt: skip
    core = EngineCore(config)
    # b shares a's first 4 blocks (already in the CPU tier when b's are stored): its store
    # reserves only the rest, whose first block's parent is one of a's.
    a, b = prompt(0, 30), prompt(0, 16) + prompt(1, 14)
    run(core, [one("a", a, 0.0), one("b", b, 1.0)])
    assert core.connector is not None
    [tier] = core.connector.storage
    stored = sorted(tier.tier.resident_keys())
    assert len(stored) == 7 + 3  # a's 7 full prompt blocks, b's 3 after the shared 4
    parents = tier.tier.parents(stored)
    assert parents == core.connector.cpu.parents(stored)
    # One tree: a's root, and a's 4th block the parent of a's 5th and b's 5th.
    counts = Counter(parents)
    assert counts.pop(None) == 1
    assert sorted(counts.values()) == [1] * 7 + [2]
    assert set(counts) <= set(stored)
    assert_quiescent(core)


# -- chunks (LMCache's chunk_size) --------------------------------------------------------------


def test_a_tier_stores_whole_chunks_only() -> None:
    # 30 prompt tokens fill 7 blocks of 4: one whole chunk of 4 blocks is stored, the partial
    # second chunk is not (LMCache's save_unfull_chunk false).
    for chunk, stored in ((1, 7), (4, 4), (3, 6)):
        core = EngineCore(host_config(offload_policy="write-through", chunk_blocks=chunk))
        run(core, [one("a", prompt(0, 30), 0.0)])
        assert core.connector is not None and core.connector.stored_blocks == stored


def test_a_tier_hit_ends_at_a_chunk_boundary_or_one_token_short_of_the_prompt() -> None:
    # a's 8 blocks come back from the CPU tier. Chunks of 3 blocks: 6 were stored, and the
    # hit is those 6 (24 tokens). Chunks of 4: both were, and the hit stops one token short
    # of the prompt, at block 7, as any hit does (LMCache: a full hit less its last token).
    for chunk, hit in ((3, 24), (4, 28)):
        core, result, _ = evicted_then_again(chunk_blocks=chunk)
        a2 = finished(result)["a2"]
        assert a2.num_tier_cached_tokens == hit and a2.num_cached_tokens == hit
        assert_quiescent(core)


def test_a_chunk_the_cpu_tier_holds_in_part_is_not_loaded() -> None:
    # The CPU tier loses one block of a's second chunk (as an eviction takes it): the hit is
    # the first chunk only, 16 tokens, where block by block it would be 20.
    for chunk, hit in ((1, 20), (4, 16)):
        core = EngineCore(host_config(offload_policy="write-through", chunk_blocks=chunk))
        run(core, [one("a", prompt(0), 0.0), one("b", prompt(1), 1.0), one("c", prompt(2), 2.0)])
        keys: list[Any] = []
        core.hasher.chain(None, None).extend(keys, prompt(0), 4)
        cpu = core.cpu
        assert cpu is not None and keys[5] in cpu
        cpu._order.pop_many([keys[5]])  # (the tier's eviction, of this one key)
        cpu._evicted([keys[5]])
        a2 = finished(run(core, [one("a2", prompt(0), 3.0)]))["a2"]
        assert a2.num_tier_cached_tokens == hit


@pytest.mark.parametrize(
    ("first", "again", "hit"),
    [(48, 40, 32),  # the chunk straddling the prompt's end was stored by a longer prompt
     (16, 16, 12),  # a prompt of one whole chunk: its hit one token short, loaded
     (32, 32, 28), (33, 33, 32)],
)  # fmt: skip
def test_a_tier_hit_is_of_the_prompts_whole_chunks(first: int, again: int, hit: int) -> None:
    # Chunks of 4 blocks of 4 tokens: vLLM's offload keys (and LMCache's lookups) cover the
    # prompt's whole chunks only, and the last token is computed.
    for sync in (False, True):
        core = EngineCore(host_config(offload_policy="write-through", chunk_blocks=4,
                                      sync_loads=sync))  # fmt: skip
        reqs = [one("a", prompt(0, first), 0.0), one("b", prompt(1, 60), 1.0),
                one("c", prompt(2, 60), 2.0), one("a2", prompt(0, again), 3.0)]  # fmt: skip
        a2 = finished(run(core, reqs))["a2"]
        assert a2.num_tier_cached_tokens == hit and a2.num_cached_tokens == hit
        assert_quiescent(core)
