"""Conservation of blocks across the device pool, the CPU tier, the secondary tiers (fs, obj)
and transfers in flight, checked after every step of random workloads with 1, 2 or 3 tiers
below the device, aborts, preemptions, load timeouts and failing tiers."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mocker.config import EngineConfig
from mocker.config_choices import EvictionPolicyName, OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.engine.virtual import VirtualDriver, VirtualRun
from mocker.kv.block_pool import BlockPool
from mocker.kv.events import AllBlocksCleared, BlockStored
from mocker.kv.eviction import LRUPolicy
from mocker.kv.hashing import BlockHash
from mocker.metrics import StatsRecorder
from mocker.request import RequestStatus
from mocker.storage_spec import StorageKind, StorageTierSpec
from tests.support.kv_index import EventIndex
from tests.support.pools import all_blocks, free_order, view
from tests.support.workloads import random_geometry, random_requests


def check_invariants(core: EngineCore) -> None:
    pool, host, offload = core.pool, core.cpu, core.connector
    assert host is not None and offload is not None
    # Device (either pool): free + used + in flight = the pool; the counters match a recount.
    free = free_order(pool)
    blocks = all_blocks(pool)
    assert len(free) == pool.num_free
    assert sum(1 for b in blocks if b.ref_cnt > 0) == pool.num_used
    assert pool.num_free + pool.num_used + pool.num_displaced == pool.num_blocks
    assert all(blocks[i].ref_cnt == 0 for i in free)
    free_set = set(free)

    def held(block: object) -> bool:  # referenced, never on the free side
        b = view(pool, block)
        return b.ref_cnt > 0 and b.block_id not in free_set

    cached = pool.cached_hashes()
    storing = offload.stores.blocks()
    if offload.write_back:
        assert isinstance(pool, BlockPool)  # (the compiled pool serves no write-back engine)
        policy = pool.policy
        assert isinstance(policy, LRUPolicy)  # (lineage's too)
        assert sum(1 for b in policy.order() if b.retained) == pool.num_retained_free
        # Retained: exactly the cached device blocks the CPU tier does not hold.
        for block in pool.blocks:
            if block.block_hash is not None and cached.get(block.block_hash) == block.block_id:
                assert block.retained == (not host.holds(block.block_hash))
        assert len(storing) == pool.num_displaced
        for block in storing:  # evicted: slot held, findable nowhere on the device
            assert block.ref_cnt == 0 and block.prev_free is None
            assert block.block_hash is None or cached.get(block.block_hash) != block.block_id
    else:
        assert pool.num_displaced == 0 and pool.num_retained_free == 0
        assert all(map(held, storing))  # pinned
    # Host: resident + incoming = used <= capacity.
    assert host.num_resident + host.num_incoming == host.num_used <= host.capacity
    # Loads: device slots referenced (never on the free side), host blocks pinned.
    pins: Counter[BlockHash] = Counter()
    for request, hashes in offload.loads.blocks():
        assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert request in core.scheduler.loading
        assert all(map(held, request.blocks))
        for h in hashes:
            assert h in host
            pins[h] += 1
    # Every CPU pin is a load's, a promotion's hold or a cascade's read.
    assert dict(pins) == {k: n for k, n in pins.items() if n}
    assert offload.cpu_pins() == host.pins()
    for key, n in pins.items():
        assert offload.cpu_pins()[key] >= n
    # Secondary tiers: within capacity; pinned exactly by the promotions reading them.
    promotions = list(offload._promotions.values())
    for tier in offload.storage:
        t = tier.tier
        assert t.num_resident + t.num_incoming == t.num_used <= t.capacity
        reading = Counter(k for p in promotions if p.tier is tier for k in p.keys)
        if not tier.shared:  # a shared tier's pins are every engine's
            assert t.pins() == dict(reading)
    assert offload.num_promoting == len(offload._promotions)
    assert len(core.scheduler.loading) == offload.num_loading
    # Every live request's blocks are referenced.
    for request in core.requests.values():
        assert all(view(pool, b).ref_cnt > 0 for b in request.blocks)


def assert_drained(core: EngineCore) -> None:
    assert not core.requests and not core.has_pending_transfers()
    assert core.pool.num_used == 0 and core.pool.num_displaced == 0
    assert core.pool.num_free == core.pool.num_blocks
    assert core.cpu is not None and core.cpu.num_incoming == 0 and core.cpu.num_pinned() == 0
    assert core.connector is not None and len(core.connector.d2h) == len(core.connector.h2d) == 0
    assert core.connector.num_held_blocks == 0
    assert core.connector.cpu_pins() == {} and core.connector.num_promoting == 0
    for tier in core.connector.storage:
        assert tier.tier.num_incoming == 0 and tier.tier.num_pinned() == 0


# Far beyond any workload's end: the longest of seeds 0..3000 takes under 200 steps and 6
# simulated seconds. An engine still stepping past these makes no progress (a livelock):
# the test fails, naming what is left, instead of hanging.
MAX_STEPS = 5000
MAX_TIME = 120.0


class GuardedCore(EngineCore):
    """An engine core that fails the test when a workload runs far longer than any can."""

    num_steps = 0

    def step(self, now: float) -> StepResult:
        self.num_steps += 1
        if self.num_steps > MAX_STEPS or now > MAX_TIME:
            s = self.scheduler
            raise AssertionError(
                f"no progress: {self.num_steps} steps, {now:.3f} simulated s, "
                f"{len(self.requests)} requests left (running {len(s.running)}, waiting "
                f"{len(s.waiting)}, loading {len(s.loading)}, loaded {len(s.ready)}), "
                f"transfers pending: {self.has_pending_transfers()}"
            )
        return super().step(now)


@dataclass
class Seen:
    """What happened across workloads, so the property is known to have been exercised."""

    counts: Counter[str] = field(default_factory=Counter)


def random_workload(seed: int, seen: Seen) -> None:
    rng = random.Random(seed)
    block_size = 4
    failure = rng.choice([0.0, 0.0, 0.2])
    fs = StorageTierSpec(StorageKind.FS, rng.choice([16, 64, 512]), rng.choice([0.0, 0.1, 8.0]),
                         rng.choice([0.0, 0.1, 4.0]), rng.choice([0.0, 0.2]), failure)  # fmt: skip
    obj = StorageTierSpec(StorageKind.OBJ, rng.choice([32, 1024]), 1.0, 0.5, 1.0, failure)
    storage = rng.choice([(), (fs,), (fs, obj)])
    config = EngineConfig.of(
        **random_geometry(rng, block_size),
        num_cpu_blocks=rng.choice([8, 24, 64, 256]),
        offload_policy=rng.choice([OffloadPolicy.EVICT, OffloadPolicy.WRITE_THROUGH]),
        eviction_policy=rng.choice([EvictionPolicyName.LRU, EvictionPolicyName.LINEAGE]),
        cpu_write_gbps=rng.choice([0.0, 0.05, 1.0, 32.0]),
        cpu_read_gbps=rng.choice([0.0, 0.05, 1.0, 32.0]),
        offload_batch_size=rng.choice([1, 3, 32]),
        transfer_latency_ms=rng.choice([0.0, 0.5]),
        min_load_blocks=rng.randint(1, 3),
        load_timeout=rng.choice([10.0, 0.004, 0.0005]),
        enable_kv_cache_events=rng.random() < 0.5,
        storage_tiers=storage,
        seed=seed,
    )
    core = GuardedCore(config)
    requests, aborts = random_requests(rng)
    run = VirtualRun()
    indexer = EventIndex(block_size)
    metrics = StatsRecorder(config)
    storage_index: Counter[int] = Counter()  # copies per key in the secondary tiers
    first_token: set[str] = set()  # requests that produced their first token
    for result in VirtualDriver(core).steps(requests, aborts, run=run):
        metrics.on_step(result)
        first_token.update(o.request_id for o in result.outputs if o.first_token)
        check_invariants(core)
        seen.counts["idle"] += result.idle
        if config.cache.enable_kv_cache_events:
            # The events are true: applied in order, they give each tier's cached set.
            # (STORAGE is checked below, as copies per key.)
            indexer.apply(e for e in result.kv_events if getattr(e, "medium", "") != "STORAGE")
            assert indexer.hashes("GPU") == set(core.pool.cached_hashes())
            assert core.cpu is not None
            assert indexer.hashes("CPU") == core.cpu.resident_keys()
            seen.counts["events"] += len(result.kv_events)
            # STORAGE events count copies (a key can be in fs and obj at once).
            for event in result.kv_events:
                if not isinstance(event, AllBlocksCleared) and event.medium == "STORAGE":
                    delta = 1 if isinstance(event, BlockStored) else -1
                    for h in event.block_hashes:
                        storage_index[h] += delta
            assert core.connector is not None
            truth: Counter[int] = Counter()
            for tier in core.connector.storage:
                truth.update(tier.tier.resident_keys())
            assert +storage_index == truth
    assert_drained(core)
    # Counts reach the metrics even from passes that computed nothing.
    assert metrics.num_preemptions == core.scheduler.num_preemptions
    # The tier hits the requests report add up to the counters, each counted where vLLM
    # counts it. External prefix hits at admission (a load's when it ends): every request's,
    # an aborted one's too.
    by_tier: Counter[str] = Counter()
    for r in run.finished:
        by_tier.update(dict(r.tier_hits))
    for o in run.aborted:
        by_tier.update(dict(o.tier_hits))
    assert metrics.external_prefix_hits == sum(by_tier.values())
    # Cached prompt tokens by source with the prompt's first output, as vLLM's
    # prompt_tokens_cached (their totals match): a request aborted after its KV loaded but
    # before its first token is counted by the external hits only.
    by_tier_first: Counter[str] = Counter()
    for r in run.finished:
        if r.first_token_time is not None:
            by_tier_first.update(dict(r.tier_hits))
    for o in run.aborted:
        if o.request_id in first_token:
            by_tier_first.update(dict(o.tier_hits))
    assert +by_tier_first == +Counter(metrics.prompt_tokens_cached_by_tier)
    assert metrics.prompt_tokens_cached_tiers == by_tier_first.total()
    snap = core.snapshot()
    seen.counts["tiers"] += len(storage)
    seen.counts["storage_hits"] += sum(n for t, n in by_tier.items() if t in ("fs", "obj"))
    seen.counts["tier_failures"] += sum(t.promotion_failures + t.cascade_failures
                                        for t in snap.tiers)  # fmt: skip
    assert core.connector is not None
    seen.counts["loaded_blocks"] += core.connector.loaded_blocks
    seen.counts["stored_blocks"] += core.connector.stored_blocks
    seen.counts["preemptions"] += core.scheduler.num_preemptions
    seen.counts["aborted"] += len(run.aborted)
    seen.counts["timeouts"] += sum(r.load_timed_out for r in run.finished)
    assert core.cpu is not None
    seen.counts["host_full"] += core.cpu.num_used == core.cpu.capacity
    assert len(run.finished) + len(run.aborted) + len(run.rejected) == len(requests)


def test_conservation_over_seeded_workloads() -> None:
    seen = Seen()
    for seed in range(100):
        random_workload(seed, seen)
    # The property was exercised: hits, copies, preemptions, aborts, timeouts, idle waits,
    # a full host tier, events.
    for what in ("loaded_blocks", "stored_blocks", "preemptions", "aborted", "timeouts", "idle",
                 "host_full", "events", "tiers", "storage_hits", "tier_failures"):  # fmt: skip
        assert seen.counts[what] > 0, what


# Seeds whose workloads reach paths random seeds seldom take, run every time: a promotion
# that fails after a block with one of its keys is computed (224812027), a promotion that
# brings the key of a retained device block (598996197), a second load timing out after the
# first's tier hits are counted (1511), a request aborted after its load ended but before
# its first token (948, 5585, 2018398581), and a livelock to avoid (692): loaded requests
# hold the pool, the one `_unblock` releases is admitted again at once with a fresh load,
# and a promotion retried on every other pass keeps the engine "pending".
@pytest.mark.parametrize("seed", [224812027, 598996197, 1511, 948, 5585, 2018398581, 692])
def test_conservation_on_seeds_of_rare_paths(seed: int) -> None:
    random_workload(seed, Seen())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(1000, 2**31))
def test_conservation_property(seed: int) -> None:
    random_workload(seed, Seen())
