"""Hybrid offload under random workloads: per-group counts, references, events and a drained end."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from mocker.config import EngineConfig
from mocker.config_choices import OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kv.hashing import BlockHash
from mocker.model_shape import ModelShape
from mocker.request import EngineRequest, SamplingParams
from mocker.storage_spec import StorageKind, StorageTierSpec
from mocker.tiers.connector import TierConnector
from mocker.tiers.hybrid_store import ChunkUnit, HybridWriteThrough, chunk_keys
from mocker.tiers.lru import LruTier
from mocker.tiers.transfers import TransferKind
from tests.support.pools import python_pool

# Sliding window (24 tokens), Mamba, full attention: one layer each, 32 bytes of KV per
# token, a 64-byte state: 16-token blocks.
SHAPE = ModelShape(
    num_layers=3,
    num_kv_heads=1,
    head_dim=8,
    layer_types=("sliding_attention", "mamba", "full_attention"),
    sliding_window=24,
    mamba_state_bytes=64,
)
MAX_STEPS = 3000  # the drain's guard: far beyond any of these runs' end


@dataclass
class Seen:
    """What a run went through, so the properties are known to have been exercised."""

    counts: Counter[str] = field(default_factory=Counter)


def _config(chunk: int, fs: bool, seed: int) -> EngineConfig:
    rng = random.Random(seed)
    return EngineConfig.of(
        model=SHAPE,
        block_size=16,
        num_gpu_blocks=24,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=160,
        # A chunk of 32 tokens is 2 + 1 + 2 blocks' bytes: 8 chunks; of 16, 3: 13 chunks.
        num_cpu_blocks=40,
        offload_policy=OffloadPolicy.WRITE_THROUGH,
        hybrid_chunk_size=chunk,
        # Slow links (a chunk takes milliseconds) overlap copies with passes; loads pay
        # off (a chunk's copy is shorter than its prefill).
        cpu_write_gbps=rng.choice([0.0005, 32.0]),
        cpu_read_gbps=rng.choice([0.001, 32.0]),
        storage_tiers=(StorageTierSpec(StorageKind.FS, 400, 0.002, 0.001),) if fs else (),
        enable_kv_cache_events=True,
        seed=seed,
    )


def _hybrid(core: EngineCore) -> tuple[HybridKVCacheManager, TierConnector, LruTier]:
    kv, connector, cpu = core.kv, core.connector, core.cpu
    assert isinstance(kv, HybridKVCacheManager) and connector is not None and cpu is not None
    return kv, connector, cpu


def check_invariants(core: EngineCore, known_keys: set[BlockHash]) -> None:
    """After a step: every group's count, every block's references, the tiers' books."""
    pool = python_pool(core.pool)
    kv, connector, cpu = _hybrid(core)
    policy = connector.policy
    assert isinstance(policy, HybridWriteThrough)
    # Per group: `used` is the count of referenced pool blocks of that group.
    counts = Counter(b.group for b in pool.blocks if b.ref_cnt > 0)
    assert kv.used == [counts[g] for g in range(len(kv.used))]
    assert pool.num_used + pool.num_free == pool.num_blocks
    assert pool.num_used == sum(kv.used) and pool.num_displaced == 0
    # A block's references: the tables of live requests, finished requests' tables held
    # for their copies, and the copies in flight (each member of a chunk once).
    refs: Counter[int] = Counter()
    tables = [r.group_blocks for r in core.requests.values() if r.group_blocks is not None]
    tables += list(policy._held_tables.values())
    for request_tables in tables:
        for g, table in enumerate(request_tables):
            for block in table:
                if block is not None:
                    assert block.group == g
                    refs[block.block_id] += 1
    assert not policy.has_staged  # pinned at the pass's end, posted with it
    for unit in connector.stores.blocks():
        assert isinstance(unit, ChunkUnit) and unit.block_hash in known_keys
        for block in unit.members:
            refs[block.block_id] += 1
    assert {b.block_id: b.ref_cnt for b in pool.blocks if b.ref_cnt} == dict(refs)
    assert policy.num_held_blocks == sum(
        1 for t in policy._held_tables.values() for table in t for b in table if b is not None
    )
    # The CPU tier: within capacity, pinned exactly by the connector, holding chunk keys.
    assert cpu.num_resident + cpu.num_incoming == cpu.num_used <= cpu.capacity
    assert connector.cpu_pins() == cpu.pins()
    assert cpu.resident_keys() <= known_keys
    for tier in connector.storage:
        t = tier.tier
        assert t.num_resident + t.num_incoming == t.num_used <= t.capacity
        assert t.resident_keys() <= known_keys
    assert len(core.scheduler.loading) == connector.num_loading


class Index:
    """The cached sets the events describe: per device group, the CPU tier, the fs tier."""

    def __init__(self) -> None:
        self.gpu: set[tuple[int | None, BlockHash]] = set()
        self.media: dict[str, Counter[BlockHash]] = {"CPU": Counter(), "STORAGE": Counter()}

    def apply(self, events: list[KVEvent]) -> None:
        for event in events:
            if isinstance(event, AllBlocksCleared):
                self.gpu.clear()
                continue
            assert isinstance(event, BlockStored | BlockRemoved)
            if event.medium == "GPU":
                keys = {(event.group_idx, h) for h in event.block_hashes}
                if isinstance(event, BlockStored):
                    assert not keys & self.gpu  # announced once
                    self.gpu |= keys
                else:
                    assert keys <= self.gpu  # removed once, after it was stored
                    self.gpu -= keys
                continue
            delta = 1 if isinstance(event, BlockStored) else -1
            for h in event.block_hashes:
                self.media[event.medium][h] += delta

    def check(self, core: EngineCore) -> None:
        kv, connector, cpu = _hybrid(core)
        truth = {(g, h) for g in range(len(kv.used)) for h in core.pool.cached_hashes(g)}
        assert self.gpu == truth
        assert +self.media["CPU"] == Counter(cpu.resident_keys())
        storage: Counter[BlockHash] = Counter()
        for tier in connector.storage:
            storage.update(tier.tier.resident_keys())
        assert +self.media["STORAGE"] == storage


def random_run(seed: int, chunk: int, fs: bool, seen: Seen, steps: int = 300) -> None:
    """Requests sharing prefixes arrive on a small pool (preemptions, evictions into and out
    of the tiers), some are aborted (while waiting, loading or running); every step is
    checked, then everything is drained."""
    config = _config(chunk, fs, seed)
    core = EngineCore(config)
    kv, connector, cpu = _hybrid(core)
    unit = config.unit_blocks
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000, 2000) for _ in range(80)] for _ in range(3)]
    known_keys: set[BlockHash] = set()
    index = Index()
    hits: Counter[str] = Counter()
    now, n = 0.0, 0

    def step() -> StepResult:
        nonlocal now
        result = core.step(now)
        index.apply(result.kv_events)
        index.check(core)
        check_invariants(core, known_keys)
        for out in result.outputs:
            if out.finished:
                hits.update(dict(out.tier_hits))
        for record in result.transfers:
            seen.counts[f"{record.kind.name}:{record.src}->{record.dst}"] += 1
        seen.counts["idle"] += result.idle
        deadline = core.next_transfer_deadline()
        if result.idle and deadline is not None:
            now = max(now, deadline)
        else:
            now = max(result.end, now + 1e-6)
        return result

    for _ in range(steps):
        if rng.random() < 0.35 and len(core.requests) < 6:
            prompt = rng.choice(prefixes)[: rng.choice([0, 16, 32, 48, 64, 80])]
            prompt += [rng.randrange(2000, 3000) for _ in range(rng.randrange(1, 30))]
            spec = EngineRequest(
                f"r{n}", prompt, SamplingParams(max_tokens=rng.randrange(1, 16), ignore_eos=True)
            )
            request = core.add_request(spec)
            known_keys.update(chunk_keys(request.block_hashes, unit))
            n += 1
        if rng.random() < 0.04 and core.requests:
            rid = rng.choice(sorted(core.requests))
            seen.counts[f"abort:{core.requests[rid].status.name}"] += 1
            core.abort_request(rid, now)
            check_invariants(core, known_keys)
        step()
    for _ in range(MAX_STEPS):
        if not core.has_unfinished_requests() and not core.has_pending_transfers():
            break
        step()
    else:
        raise AssertionError(f"seed {seed}: not drained after {MAX_STEPS} steps")
    # Drained: nothing referenced, nothing held or pinned anywhere.
    assert core.pool.num_used == 0 and core.pool.num_free == core.pool.num_blocks
    assert kv.used == [0] * len(kv.used)
    assert connector.num_held_blocks == 0 and connector.cpu_pins() == {}
    assert cpu.num_pinned() == 0 and cpu.num_incoming == 0
    assert connector.num_loading == 0 and connector.num_promoting == 0
    for tier in connector.storage:
        assert tier.tier.num_pinned() == 0 and tier.tier.num_incoming == 0
    seen.counts["requests"] += n
    seen.counts["preemptions"] += core.scheduler.num_preemptions
    seen.counts["stored"] += connector.stored_blocks
    seen.counts["loaded"] += connector.loaded_blocks
    seen.counts["cpu_full"] += cpu.num_used == cpu.capacity
    for source, tokens in hits.items():
        assert tokens % (unit * config.block_size) == 0  # whole chunks
        seen.counts[f"hits:{source}"] += tokens


@pytest.mark.parametrize(("chunk", "seeds"), [(32, (1, 2, 3)), (16, (4, 5))])
def test_random_workloads_keep_every_count(chunk: int, seeds: tuple[int, ...]) -> None:
    seen = Seen()
    for seed in seeds:
        random_run(seed, chunk, fs=False, seen=seen)
    c = seen.counts
    assert c["preemptions"] > 0 and c["stored"] > 0 and c["loaded"] > 0
    assert c["hits:cpu"] > 0 and c["cpu_full"] > 0
    assert sum(v for k, v in c.items() if k.startswith("abort:")) > 0


def test_random_workloads_with_an_fs_tier_promote_chunks() -> None:
    seen = Seen()
    for seed in (11, 12):
        random_run(seed, 32, fs=True, seen=seen)
    c = seen.counts
    # Chunks were cascaded to fs, promoted back to the CPU tier and loaded from there.
    assert c[f"{TransferKind.STORE.name}:cpu->fs"] > 0
    assert c[f"{TransferKind.LOAD.name}:fs->cpu"] > 0
    assert c["hits:fs"] > 0 and c["preemptions"] > 0
    assert sum(v for k, v in c.items() if k.startswith("abort:")) > 0
