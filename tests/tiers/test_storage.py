"""Secondary tiers (fs, obj) below the CPU tier: the cascade, the staged promotion with its
retry-later lookup, failures that unwind both hops, and the per-tier events and metrics.

Times are computed by hand from the links: a copy of n blocks on a link of B GB/s with a
latency of L ms alone takes L/1000 + n × block_bytes / (B × 10^9) seconds, and a pass of t
new prompt tokens takes Dynamo's prefill polynomial (the core's own `pass_duration`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from mocker.clock import VirtualClock
from mocker.config import EngineConfig
from mocker.config_choices import OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.stats import FinishedRequestStats
from mocker.engine.virtual import VirtualDriver, VirtualRun
from mocker.kv.events import AllBlocksCleared, BlockStored
from mocker.kv.hashing import BlockHash
from mocker.metrics import MetricsCollector, StatsRecorder, build_registry
from mocker.request import EngineRequest, SamplingParams
from mocker.storage_spec import StorageKind, StorageTierSpec
from mocker.tiers.tier import BlockBatch, TierBlock
from mocker.tiers.transfers import TransferKind, TransferRecord
from tests.support.pools import python_pool

BLOCK = 16
PROMPT = 256  # 16 full blocks; the lookup stops one token short: 15 blocks
LOADABLE = (PROMPT - 1) // BLOCK
BLOCK_BYTES = BLOCK * 131072  # Llama-3-8B: 2 MiB per block
FS = StorageTierSpec(StorageKind.FS, 64, read_gbps=8.0, write_gbps=4.0, latency_ms=0.1)


def config(**overrides: object) -> EngineConfig:
    base = EngineConfig.of(
        block_size=BLOCK, num_gpu_blocks=64, max_model_len=512, num_cpu_blocks=16,
        offload_policy=OffloadPolicy.WRITE_THROUGH, storage_tiers=(FS,),
        enable_kv_cache_events=True,
    )  # fmt: skip
    return base.with_changes(**overrides)


def prompt(k: int) -> list[int]:
    return [1000 * (k + 1) + j for j in range(PROMPT)]


def request(rid: str, k: int, at: float) -> EngineRequest:
    sampling = SamplingParams(max_tokens=1, ignore_eos=True)
    return EngineRequest(rid, prompt(k), sampling, arrival_time=at)


def copy_s(blocks: int, gbps: float, latency_ms: float = 0.0) -> float:
    return latency_ms / 1000 + blocks * BLOCK_BYTES / (gbps * 1e9)


def warm_fs_only(core: EngineCore, driver: VirtualDriver) -> list[TransferRecord]:
    """A's prompt reaches fs (through the CPU tier), then B's evicts it from the CPU tier
    (16 slots), and the device's prefix cache is reset: A's KV is in fs only."""
    records: list[TransferRecord] = []
    for result in driver.steps([request("a", 0, 0.0), request("b", 1, 1.0)]):
        records += result.transfers
    assert core.connector is not None
    fs = core.connector.storage[0].tier
    cpu = core.connector.cpu
    assert fs.num_resident == 32 and cpu.num_resident == 16  # A's 16 evicted by B's 16
    core.reset_prefix_cache(driver.clock.now())
    return records


def run_again(
    driver: VirtualDriver, at: float
) -> tuple[FinishedRequestStats, list[TransferRecord]]:
    """A's prompt again ("a2") at `at`: its finished stats and every transfer of the run."""
    run = VirtualRun()
    records: list[TransferRecord] = []
    for result in driver.steps([request("a2", 0, at)], run=run):
        records += result.transfers
    (done,) = run.finished
    return done, records


def test_cascade_then_three_hop_promotion_by_hand() -> None:
    core = EngineCore(config())
    driver = VirtualDriver(core)
    warm = warm_fs_only(core, driver)
    # Each prompt's 16 blocks: device → CPU after its pass, then CPU → fs when that copy ends.
    stores = [(r.src, r.dst, r.num_blocks) for r in warm if r.kind is TransferKind.STORE]
    assert stores == [("gpu", "cpu", 16), ("cpu", "fs", 16)] * 2
    cascade = next(r for r in warm if r.dst == "fs")
    store = next(r for r in warm if r.dst == "cpu")
    assert cascade.start == store.end  # the cascade starts when the CPU copy lands
    assert cascade.duration == pytest.approx(copy_s(16, 4.0, 0.1), abs=1e-12)

    t0 = 10.0
    done, records = run_again(driver, t0)
    promote, load = [r for r in records if r.kind is TransferKind.LOAD]
    # The prompt's last block, computed, is stored to the CPU tier (fs holds it already).
    stores = [(r.src, r.dst, r.num_blocks) for r in records if r.kind is TransferKind.STORE]
    assert stores == [("gpu", "cpu", 1)]
    # Hop 1, fs → CPU, starts at the arrival; hop 2, CPU → device, when it lands.
    assert (promote.src, promote.dst, promote.start) == ("fs", "cpu", t0)
    assert promote.end == pytest.approx(t0 + copy_s(LOADABLE, 8.0, 0.1), abs=1e-12)
    assert (load.src, load.dst, load.start) == ("cpu", "gpu", promote.end)
    assert load.end == pytest.approx(promote.end + copy_s(LOADABLE, 32.0), abs=1e-12)
    # Then one pass computes the prompt's last block (16 tokens, 16 blocks in use).
    ttft = load.end + _last_block(core) - t0
    assert done.time_to_first_token == pytest.approx(ttft, abs=1e-12)
    assert done.tier_hits == (("fs", LOADABLE * BLOCK),)
    assert done.num_cached_tokens == LOADABLE * BLOCK
    snap = core.snapshot()
    assert snap.tiers[0].name == "fs" and snap.tiers[0].block_hits >= LOADABLE
    assert_drained(core)


def test_a_run_promoted_from_two_tiers_counts_each_by_hand() -> None:
    # fs (8 slots) keeps the first 8 of A's 16 blocks, obj all 16. With A gone from the
    # CPU tier, its continuation is promoted in two stages, fs first (lookup order), then
    # obj for the rest, and one load brings the 15 blocks to the device.
    fs = replace(FS, capacity_blocks=8)
    obj = replace(FS, kind=StorageKind.OBJ, capacity_blocks=64, read_gbps=16.0, latency_ms=0.2)
    core = EngineCore(config(storage_tiers=(fs, obj)))
    driver = VirtualDriver(core)
    driver.run([request("a", 0, 0.0)])
    assert core.connector is not None
    cpu = core.connector.cpu
    fs_tier, obj_tier = (t.tier for t in core.connector.storage)
    assert (fs_tier.num_resident, obj_tier.num_resident, cpu.num_resident) == (8, 16, 16)
    # Other blocks fill the CPU tier (its 16 slots): A is in fs and obj only.
    plan = cpu.prepare_store(
        BlockBatch.of([TierBlock(BlockHash(-k), None, ()) for k in range(1, 17)])
    )
    cpu.complete_store(plan.keys)
    assert len(plan.evicted) == 16
    core.reset_prefix_cache(driver.clock.now())

    t0 = 10.0
    done, records = run_again(driver, t0)
    from_fs, from_obj, load = [r for r in records if r.kind is TransferKind.LOAD]
    assert (from_fs.src, from_fs.dst, from_fs.num_blocks, from_fs.start) == ("fs", "cpu", 8, t0)
    assert from_fs.end == pytest.approx(t0 + copy_s(8, 8.0, 0.1), abs=1e-12)
    assert (from_obj.src, from_obj.num_blocks, from_obj.start) == ("obj", 7, from_fs.end)
    assert from_obj.end == pytest.approx(from_fs.end + copy_s(7, 16.0, 0.2), abs=1e-12)
    assert (load.src, load.num_blocks, load.start) == ("cpu", LOADABLE, from_obj.end)
    assert load.end == pytest.approx(from_obj.end + copy_s(LOADABLE, 32.0), abs=1e-12)
    ttft = load.end + _last_block(core) - t0
    assert done.time_to_first_token == pytest.approx(ttft, abs=1e-12)
    assert done.tier_hits == (("fs", 8 * BLOCK), ("obj", 7 * BLOCK))
    assert done.num_cached_tokens == LOADABLE * BLOCK
    assert_drained(core)


def test_retry_later_keeps_the_queue_moving() -> None:
    core = EngineCore(config())
    driver = VirtualDriver(core)
    warm_fs_only(core, driver)
    t0 = 10.0
    # a2 is first in line but must wait for its promotion; c, behind it, runs at once.
    run = driver.run([request("a2", 0, t0), request("c", 2, t0)])
    by_id = {r.request_id: r for r in run.finished}
    assert by_id["c"].first_scheduled_time == t0
    a2 = by_id["a2"]
    assert a2.first_scheduled_time is not None and a2.first_scheduled_time > t0
    assert a2.tier_hits == (("fs", LOADABLE * BLOCK),)
    assert_drained(core)


def test_failed_promotion_unwinds_both_hops_and_recomputes() -> None:
    core = EngineCore(config())
    driver = VirtualDriver(core)
    warm_fs_only(core, driver)
    assert core.connector is not None
    tier = core.connector.storage[0]
    tier.spec = replace(tier.spec, failure_rate=1.0)  # every copy from now on fails
    run = driver.run([request("a2", 0, 10.0)])
    (done,) = run.finished
    assert done.num_cached_tokens == 0 and done.tier_hits == () and done.load_timed_out
    assert core.snapshot().tiers[0].promotion_failures == 1
    assert_drained(core)


def test_failed_cascades_leave_nothing_behind() -> None:
    fs = replace(FS, failure_rate=1.0)
    core = EngineCore(config(storage_tiers=(fs,)))
    run = VirtualDriver(core).run([request("a", 0, 0.0), request("b", 1, 1.0)])
    assert len(run.finished) == 2
    assert core.connector is not None
    assert core.connector.storage[0].tier.num_resident == 0
    assert core.snapshot().tiers[0].cascade_failures == 2
    assert_drained(core)


def test_a_failure_rate_set_while_running_fails_the_next_cascades() -> None:
    core = EngineCore(config())
    assert core.connector is not None
    tier = core.connector.storage[0]
    tier.spec = replace(tier.spec, failure_rate=1.0)  # the tier's spec is read per copy
    VirtualDriver(core).run([request("a", 0, 0.0), request("b", 1, 1.0)])
    assert tier.tier.num_resident == 0
    assert core.snapshot().tiers[0].cascade_failures == 2
    assert_drained(core)


def test_slow_tier_times_out_and_recomputes() -> None:
    # Promoting pays off on paper (about 4 ms against 20 ms of prefill), but the load
    # timeout (1 ms) is shorter than the promotion.
    core = EngineCore(config(load_timeout=0.001))
    driver = VirtualDriver(core)
    warm_fs_only(core, driver)
    run = driver.run([request("a2", 0, 10.0)])
    (done,) = run.finished
    assert done.num_cached_tokens == 0 and done.load_timed_out
    assert done.first_scheduled_time == 10.001  # recomputed once the promotion timed out
    assert core.snapshot().tiers[0].promotion_failures == 1
    assert_drained(core)


def test_storage_events_say_storage_and_local() -> None:
    core = EngineCore(config())
    events = [e for r in VirtualDriver(core).steps([request("a", 0, 0.0)]) for e in r.kv_events]
    storage = [e for e in events if isinstance(e, BlockStored) and e.medium == "STORAGE"]
    assert sum(len(e.block_hashes) for e in storage) == 16
    assert {e.locality for e in storage} == {"LOCAL"}
    assert all(
        e.locality is None
        for e in events
        if not isinstance(e, AllBlocksCleared) and e.medium == "CPU"
    )


def test_a_tier_without_enable_kv_events_publishes_nothing() -> None:
    # vLLM 0.34's per-tier switch (false unless the config says so): the tier still stores,
    # the CPU tier and the device still publish.
    core = EngineCore(config(storage_tiers=(replace(FS, enable_kv_events=False),)))
    events = [e for r in VirtualDriver(core).steps([request("a", 0, 0.0)]) for e in r.kv_events]
    media = {getattr(e, "medium", None) for e in events}
    assert "STORAGE" not in media and {"GPU", "CPU"} <= media
    assert core.connector is not None and core.connector.storage[0].tier.num_resident == 16


def assert_drained(core: EngineCore) -> None:
    """Nothing in flight, nothing pinned, nothing referenced."""
    connector = core.connector
    assert connector is not None and not connector.has_pending
    assert connector.cpu.num_pinned() == 0 and connector.cpu.num_incoming == 0
    for tier in connector.storage:
        assert tier.tier.num_pinned() == 0 and tier.tier.num_incoming == 0
    assert connector.cpu_pins() == {}
    assert core.pool.num_used == 0


def test_shared_tier_events_are_local_to_the_storer_and_remote_to_the_others() -> None:
    from mocker.tiers.storage import StorageTier

    obj = StorageTier(replace(FS, kind=StorageKind.OBJ), BLOCK, BLOCK_BYTES, record_events=True)
    assert obj.shared
    obj.subscribe(0)
    obj.subscribe(1)
    blocks = [
        TierBlock(BlockHash(1), None, (1,) * BLOCK),
        TierBlock(BlockHash(2), BlockHash(1), (2,) * BLOCK),
    ]
    plan = obj.prepare_store(BlockBatch.of(blocks), engine=0)
    obj.complete_store(plan.keys, True)
    (mine,) = obj.take_events(0)
    (theirs,) = obj.take_events(1)
    assert isinstance(mine, BlockStored) and isinstance(theirs, BlockStored)
    assert (mine.medium, mine.locality, mine.block_hashes) == ("STORAGE", "LOCAL", (1, 2))
    assert (theirs.medium, theirs.locality) == ("STORAGE", "REMOTE")
    # A failed copy publishes nothing and frees its slots.
    plan = obj.prepare_store(
        BlockBatch.of([TierBlock(BlockHash(3), BlockHash(2), (3,) * BLOCK)]), engine=1
    )
    obj.complete_store(plan.keys, False)
    assert obj.take_events(0) == [] and obj.tier.num_used == 2


# -- write-back retention across promotions ----------------------------------------------------


def evict_config(fs: StorageTierSpec = FS) -> EngineConfig:
    """Write-back (offload on eviction) over a CPU tier and one fs tier."""
    return config(offload_policy="evict", storage_tiers=(fs,))


def put_in_fs(core: EngineCore, keys: Sequence[BlockHash]) -> None:
    """The chain of `keys` is resident in fs (and nowhere else)."""
    assert core.connector is not None
    fs = core.connector.storage[0]
    blocks = [TierBlock(k, p, ()) for p, k in zip([None, *keys], keys, strict=False)]
    fs.complete_store(fs.prepare_store(BlockBatch.of(blocks), engine=0).keys, True)


def assert_retained_iff_not_on_cpu(core: EngineCore) -> None:
    """Write-back: a cached device block is retained (copied before its slot is reused)
    exactly when the CPU tier does not hold its key, resident or incoming."""
    pool, cpu = python_pool(core.pool), core.cpu
    assert cpu is not None
    for block in pool.blocks:
        key = block.block_hash
        if key is not None and pool.lookup(key) is block:
            assert block.retained == (not cpu.holds(key)), block


def drain(core: EngineCore, now: float) -> None:
    """Run the core's requests and transfers to the end, checking retention after each step."""
    for _ in VirtualDriver(core, VirtualClock(now)).steps([]):
        assert_retained_iff_not_on_cpu(core)
    assert_drained(core)


def test_failed_promotion_retains_the_blocks_computed_while_it_was_in_flight() -> None:
    # x's prompt is in fs only: x's lookup promotes it, and its keys are incoming in the CPU
    # tier (held there). In the same pass c, which must recompute (as after a failed load),
    # computes the same prompt: its device blocks are not retained, as the CPU tier holds
    # their keys. The promotion fails: the CPU tier drops the keys, and the device blocks
    # are the only copies left outside fs, so they must be retained again.
    core = EngineCore(evict_config(replace(FS, failure_rate=1.0)))
    x = core.add_request(request("x", 0, 0.0))
    c = core.add_request(request("c", 0, 0.0))
    c.skip_tier_load = True
    promoted = x.block_hashes[:LOADABLE]
    put_in_fs(core, promoted)
    first = core.step(0.0)
    assert core.connector is not None and core.connector.num_promoting == 1
    assert core.cpu is not None
    for key in promoted:
        block = python_pool(core.pool).lookup(key)
        assert block is not None and not block.retained and core.cpu.holds(key)
    drain(core, first.end)
    assert core.snapshot().tiers[0].promotion_failures == 1
    for key in promoted:  # still cached on the device (nothing needed the room), retained
        block = python_pool(core.pool).lookup(key)
        assert block is not None and block.retained and not core.cpu.holds(key)


def test_promotion_releases_a_retained_device_block_of_a_key_it_brings() -> None:
    # The device holds x's second block, retained (the CPU tier does not hold it), but not
    # its first (a chain can lose an ancestor first under write-back: a block the CPU tier
    # holds is reused at once, while a retained one waits for its copy). x's device hit is
    # then 0, and its promotion from fs brings the second block's key to the CPU tier too:
    # the device block need not be copied any more.
    core = EngineCore(evict_config())
    x = core.add_request(request("x", 0, 0.0))
    put_in_fs(core, x.block_hashes[:LOADABLE])
    pool = python_pool(core.pool)
    table = pool.get_new_blocks(2)
    pool.cache_full_blocks(table, 1, 2, x.block_hashes, x.all_token_ids)
    pool.retain(table[1:])
    pool.free_blocks(reversed(table))
    child = pool.lookup(x.block_hashes[1])
    assert child is not None and child.retained and pool.lookup(x.block_hashes[0]) is None
    first = core.step(0.0)
    assert core.connector is not None and core.connector.num_promoting == 1
    assert core.cpu is not None and core.cpu.holds(x.block_hashes[1])
    assert not child.retained
    assert_retained_iff_not_on_cpu(core)
    drain(core, first.end)
    assert x.tier_hits == (("fs", LOADABLE * BLOCK),)


def test_blocks_promoted_twice_count_once_for_their_tier() -> None:
    # The CPU tier holds A's first 5 blocks; the rest are promoted from fs, but the load
    # cannot start (no device room) and CPU stores push blocks 10-14 out again, so they are
    # promoted a second time. The load of 15 blocks: 5 from the CPU tier, 10 from fs.
    core = EngineCore(config())
    driver = VirtualDriver(core)
    warm_fs_only(core, driver)
    conn, cpu = core.connector, core.cpu
    assert conn is not None and cpu is not None
    req = core.add_request(request("a2", 0, 10.0))
    core.scheduler.waiting.remove(req)  # the connector is driven by hand
    h = req.block_hashes
    plan = cpu.prepare_store(conn.storage[0].tier.copies(h[:5]))
    cpu.complete_store(plan.keys)
    conn.poll(10.0)
    assert conn.num_matched_blocks(req, 0) is None  # promotes blocks 5-14
    conn.promotions.end_schedule()
    conn.poll(11.0)
    assert conn.num_matched_blocks(req, 0) == LOADABLE
    conn.promotions.end_schedule()  # the scheduler found no device room: no load, the hold goes
    cpu.pin(h[:10])  # (so that the filler below evicts exactly blocks 10-14)
    plan = cpu.prepare_store(
        BlockBatch.of([TierBlock(BlockHash(-k), None, ()) for k in range(1, 7)])
    )
    cpu.unpin(h[:10])
    cpu.complete_store(plan.keys)
    assert set(h[10:15]) <= set(plan.evicted)
    assert conn.num_matched_blocks(req, 0) is None  # promotes blocks 10-14 again
    conn.promotions.end_schedule()
    conn.poll(12.0)
    assert conn.num_matched_blocks(req, 0) == LOADABLE
    conn.loads.start(12.0, req, 0, LOADABLE)
    conn.promotions.end_schedule()
    assert req.tier_hits == (("cpu", 5 * BLOCK), ("fs", 10 * BLOCK))


def _last_block(core: EngineCore) -> float:
    """The pass computing the prompt's last block after the loaded ones (16 blocks in use)."""
    return core.pass_duration(PROMPT - LOADABLE * BLOCK, 0, 16, prefill_requests=1,
                              prefill_context=LOADABLE * BLOCK, decode_context=0)  # fmt: skip


def test_jobs_in_flight_by_tier() -> None:
    # vLLM 0.34's active promotion / cascade jobs and the share of the CPU tier (16 blocks)
    # their copies use, per secondary tier: a cascade reads A's 16 CPU blocks into fs; a
    # promotion writes A's 15 loadable blocks from fs into the CPU tier.
    core = EngineCore(config())
    driver = VirtualDriver(core)
    seen = []
    for _ in driver.steps([request("a", 0, 0.0)]):
        fs = core.snapshot().tiers[0]
        seen.append((fs.active_cascades, fs.primary_read_usage))
    assert (1, 1.0) in seen and seen[-1] == (0, 0.0)
    core = EngineCore(config())
    warm_fs_only(core, VirtualDriver(core))  # A's KV is in fs only
    core.add_request(request("a2", 0, 10.0))
    core.step(10.0)  # the lookup starts the promotion
    fs = core.snapshot().tiers[0]
    assert (fs.active_promotions, fs.primary_write_usage) == (1, LOADABLE / 16)
    assert fs.active_cascades == 0


def test_promotion_latency_by_tier_and_result() -> None:
    # vLLM 0.34's vllm:kv_offload_tiering_promotion_latency_seconds{tier, result}: from the
    # job's start to its end, a failed (timed-out) one too.
    for timeout, result in ((10.0, "success"), (0.001, "failure")):
        core = EngineCore(config(load_timeout=timeout))
        metrics = StatsRecorder(core.config)
        driver = VirtualDriver(core)
        for r in driver.steps([request("a", 0, 0.0), request("b", 1, 1.0)]):
            metrics.on_step(r)
        core.reset_prefix_cache(driver.clock.now())
        for r in driver.steps([request("a2", 0, 10.0)]):
            metrics.on_step(r)
        (latency,) = metrics.promotion_latency.items()
        assert latency[0] == ("fs", result) and latency[1].count == 1
        expected = copy_s(LOADABLE, 8.0, 0.1) if result == "success" else timeout
        assert latency[1].total == pytest.approx(expected, abs=1e-9)
        collector = MetricsCollector([metrics], "m")
        text = generate_latest(build_registry(collector, process=False)).decode()
        series = f'engine="0",model_name="m",result="{result}",tier="1:fs"'
        assert f"vllm:kv_offload_tiering_promotion_latency_seconds_count{{{series}}} 1.0" in text
        assert collector.text() == text  # (the fast exposition prints the same)


def test_cpu_tier_shares_pinned_by_loads_and_stores() -> None:
    # vLLM 0.34's kv_offload_cpu_cache_{read,write}_usage_perc: A's 16 blocks land in the CPU
    # tier (16 slots), then its 15 loadable ones are read back to the device.
    core = EngineCore(config(storage_tiers=()))
    driver = VirtualDriver(core)
    writes = []
    for _ in driver.steps([request("a", 0, 0.0)]):
        writes.append(core.snapshot().cpu_write_usage)
    assert writes[-1] == 0.0 and max(writes) == 1.0  # (all 16 slots, while landing)
    core.reset_prefix_cache(driver.clock.now())
    core.add_request(request("a2", 0, 10.0))
    core.step(10.0)  # the CPU hit's load starts
    snapshot = core.snapshot()
    assert (snapshot.cpu_read_usage, snapshot.cpu_write_usage) == (LOADABLE / 16, 0.0)
