"""Hybrid offload (vLLM PR #38261): chunk units, whole-chunk stores and loads, min-prefix hits."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from mocker.config import ConfigError, EngineConfig
from mocker.config_choices import OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.outputs import RequestOutput
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.events import BlockStored
from mocker.kv.hashing import BlockHash
from mocker.model_shape import MODEL_PRESETS, ModelShape
from mocker.request import EngineRequest, Request, RequestId, RequestStatus, SamplingParams
from mocker.storage_spec import StorageKind, StorageTierSpec
from mocker.tiers.connector import TierConnector
from mocker.tiers.hybrid_store import ChunkUnit, HybridWriteThrough, chunk_keys
from mocker.tiers.lru import LruTier
from tests.support.engines import req
from tests.support.hybrid import check_groups, group_tables, hybrid_shape
from tests.support.pools import python_pool
from tests.support.settings import serve_config

GPT_OSS = MODEL_PRESETS["gpt-oss-20b"]  # block 16; groups: sliding (window 128), full
QWEN3_NEXT = MODEL_PRESETS["qwen3-next-80b-a3b"]  # block 544; groups: 3 Mamba, 1 full
# 16 tokens × 12 layers a group × 8 KV heads × 64 dims × 2 (K, V) × 2 bytes.
GPT_OSS_BLOCK_BYTES = 16 * 12 * 8 * 64 * 2 * 2  # 393,216
# 544 tokens × 12 layers a group × 2 KV heads × 256 dims × 2 (K, V) × 2 bytes (a Mamba
# group's page is padded to the same size).
QWEN3_NEXT_BLOCK_BYTES = 544 * 12 * 2 * 256 * 2 * 2  # 13,369,344

WRITE_THROUGH = OffloadPolicy.WRITE_THROUGH
SWA_FULL = ("sliding_attention", "full_attention")
MAMBA_FULL = ("mamba", "full_attention")
SWA_MAMBA_FULL = ("sliding_attention", "mamba", "full_attention")


def _config(types: tuple[str, ...], *, window: int = 8, **kw: Any) -> EngineConfig:
    # One layer per group: 32 bytes of KV per token (1 head × 8 dims × K, V × 2 bytes); a
    # 64-byte Mamba state fits a 16-token block, so a Mamba hybrid runs on 16-token blocks.
    base: dict[str, Any] = {
        "model": hybrid_shape(types, window, head_dim=8),
        "block_size": 4,
        "num_gpu_blocks": 40,
        "max_model_len": 64,
        "max_num_seqs": 4,
        "num_cpu_blocks": 64,
        "offload_policy": "write-through",
        "enable_kv_cache_events": True,
    }
    base.update(kw)
    return EngineConfig.of(**base)


def _kv(core: EngineCore) -> HybridKVCacheManager:
    assert isinstance(core.kv, HybridKVCacheManager)
    return core.kv


def _connector(core: EngineCore) -> TierConnector:
    assert core.connector is not None
    return core.connector


def _cpu(core: EngineCore) -> LruTier:
    assert core.cpu is not None
    return core.cpu


def _policy(core: EngineCore) -> HybridWriteThrough:
    policy = _connector(core).policy
    assert isinstance(policy, HybridWriteThrough)
    return policy


def _status(r: Request) -> RequestStatus:
    return r.status


def _held(r: Request) -> list[list[bool]]:
    """Which positions of each group's table hold a block."""
    return [[b is not None for b in t] for t in group_tables(r)]


class Run:
    """Drives one engine on a clock of its own, keeping each request's final output and
    every KV event."""

    def __init__(self, core: EngineCore, now: float = 0.0) -> None:
        self.core = core
        self.now = now
        self.final: dict[str, RequestOutput] = {}
        self.events: list[object] = []

    def step(self) -> None:
        result = self.core.step(self.now)
        self.events += result.kv_events
        self.final.update({o.request_id: o for o in result.outputs if o.finished})
        check_groups(python_pool(self.core.pool), _kv(self.core))
        deadline = self.core.next_transfer_deadline()
        if result.idle and deadline is not None:
            self.now = max(self.now, deadline)  # nothing ran: wait for the next transfer
        else:
            self.now = max(result.end, self.now + 1e-6)

    def drain(self, *requests: EngineRequest) -> None:
        """Add the requests and run until they finished and every transfer ended."""
        core = self.core
        for spec in requests:
            core.add_request(spec)
        for _ in range(500):
            if not core.has_unfinished_requests() and not core.has_pending_transfers():
                assert core.pool.num_used == 0 and _kv(core).used == [0] * len(_kv(core).used)
                return
            self.step()
        raise AssertionError("the run did not end within 500 steps")


def _hashes(core: EngineCore, prompt: Sequence[int]) -> list[BlockHash]:
    """The block hashes the engine gives a request with this prompt."""
    probe = Request(RequestId("_probe"), list(prompt), len(prompt), 1, SamplingParams(), 0.0)
    probe.enable_hashing(core.hasher, core.config.block_size, None)
    return list(probe.block_hashes)


def _cpu_stored(events: Iterable[object]) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"]


# -- 1. units -----------------------------------------------------------------------------------


def test_gpt_oss_unit_is_a_chunk_of_both_attention_groups() -> None:
    base: dict[str, Any] = {"model": GPT_OSS, "num_gpu_blocks": 512, "max_model_len": 4096,
                            "num_cpu_blocks": 100, "offload_policy": "write-through"}  # fmt: skip
    for chunk in (None, 16):  # the default chunk is one block
        config = EngineConfig.of(**base, hybrid_chunk_size=chunk)
        assert config.block_size == 16 and config.block_bytes == GPT_OSS_BLOCK_BYTES
        # One block in each of the 2 attention groups.
        assert config.unit_blocks == 1 and config.unit_bytes == 2 * GPT_OSS_BLOCK_BYTES
    config = EngineConfig.of(**base, hybrid_chunk_size=64)
    # 64 tokens: 4 blocks in each of the 2 attention groups = 8 blocks' bytes.
    assert config.unit_blocks == 4 and config.unit_bytes == 8 * GPT_OSS_BLOCK_BYTES == 3145728
    fs = StorageTierSpec(StorageKind.FS, 100, 1.0, 1.0)
    core = EngineCore(config.with_changes(storage_tiers=(fs,)))
    connector, cpu = _connector(core), _cpu(core)
    # Tiers count chunks: 100 blocks' bytes // 8 blocks' bytes per chunk = 12 chunks.
    assert cpu.capacity == 12 and cpu.block_size == 64
    assert connector.storage[0].tier.capacity == 12
    assert connector.unit == 4 and connector.block_size == 64
    assert connector.block_bytes == 3145728


def test_qwen3_next_unit_is_a_full_attention_block_and_three_mamba_states() -> None:
    base: dict[str, Any] = {"model": QWEN3_NEXT, "num_gpu_blocks": 64, "max_model_len": 4096,
                            "num_cpu_blocks": 10, "offload_policy": "write-through"}  # fmt: skip
    config = EngineConfig.of(**base)
    assert config.block_size == 544 and config.block_bytes == QWEN3_NEXT_BLOCK_BYTES
    # 1 full-attention block + the 3 Mamba groups' states at its end: 4 blocks' bytes.
    assert config.unit_blocks == 1 and config.unit_bytes == 4 * QWEN3_NEXT_BLOCK_BYTES
    core = EngineCore(config)
    assert _cpu(core).capacity == 10 // 4 == 2
    assert _connector(core).block_bytes == 53477376
    # A chunk of 2 blocks: 2 full-attention blocks + 3 states (one each, at its end).
    config = EngineConfig.of(**base, hybrid_chunk_size=1088)
    assert config.unit_blocks == 2 and config.unit_bytes == 5 * QWEN3_NEXT_BLOCK_BYTES
    assert _cpu(EngineCore(config)).capacity == 10 // 5 == 2


def test_dense_model_unit_is_one_block() -> None:
    config = EngineConfig.of(num_cpu_blocks=8, offload_policy=WRITE_THROUGH, hybrid_chunk_size=64)
    assert config.unit_blocks == 1 and config.unit_bytes == config.block_bytes


def test_chunk_keys_are_each_chunks_last_hash() -> None:
    hashes = [BlockHash(100 + i) for i in range(7)]
    assert chunk_keys(hashes, 1) is hashes
    assert chunk_keys(hashes, 3) == [BlockHash(102), BlockHash(105)]  # the 7th is no chunk
    assert chunk_keys(hashes, 8) == []


# -- 2. stores: a chunk only when every group has it ----------------------------------------------


def test_repeated_prompt_hits_whole_chunks_in_the_cpu_tier() -> None:
    # Blocks of 4 tokens, chunks of 8 (2 blocks a group); unit = 2 blocks × 2 groups × 128 B.
    core = EngineCore(_config(SWA_FULL, num_gpu_blocks=10, hybrid_chunk_size=8))
    connector, cpu = _connector(core), _cpu(core)
    assert connector.block_bytes == 512 and cpu.capacity == 64 // 4 == 16
    run = Run(core)
    a_prompt, b_prompt = list(range(100, 120)), list(range(200, 220))
    run.drain(req("a", a_prompt, 1, ignore_eos=True))
    # 20 tokens = 5 full blocks: chunks [0, 8) and [8, 16) are whole (the 5th block starts a
    # third one): 2 units, keyed by the hashes of blocks 1 and 3.
    a_hashes = _hashes(core, a_prompt)
    assert connector.stored_blocks == 2
    assert cpu.resident_keys() == {a_hashes[1], a_hashes[3]}
    stored = _cpu_stored(run.events)
    assert [h for e in stored for h in e.block_hashes] == [a_hashes[1], a_hashes[3]]
    for event in stored:  # a CPU block is a chunk: 8 tokens each
        assert event.block_size == 8 and len(event.token_ids) == 8 * len(event.block_hashes)
    assert stored[0].token_ids[:8] == tuple(a_prompt[:8]) and stored[0].parent_block_hash is None
    # b's 20 tokens take 5 blocks in each group, the whole pool of 10: a's are evicted.
    run.drain(req("b", b_prompt, 1, ignore_eos=True))
    assert connector.stored_blocks == 4
    assert core.num_cached_prefix_blocks(a_hashes) == 0
    run.drain(req("a2", a_prompt, 1, ignore_eos=True))
    # The lookup stops one token short: (20 − 1) // 8 = 2 chunks, both held: 16 tokens.
    assert run.final["a2"].num_cached_tokens == 16
    assert run.final["a2"].tier_hits == (("cpu", 16),)
    assert connector.loaded_blocks == 2
    assert connector.stored_blocks == 4  # its chunks are in the CPU tier already


def test_unit_takes_every_groups_blocks_of_the_chunk() -> None:
    # Sliding (window 16), Mamba, full on 16-token blocks; chunks of 32 (2 blocks).
    config = _config(SWA_MAMBA_FULL, window=16, block_size=16, num_gpu_blocks=32,
                     max_model_len=256, hybrid_chunk_size=32)  # fmt: skip
    core = EngineCore(config)
    policy = _policy(core)
    core.add_request(req("a", range(1000, 1080), 2, ignore_eos=True))
    r = core.requests["a"]
    run = Run(core)
    run.step()
    # The first pass stops at the first chunk's end: [0, 32), its Mamba state saved at 32.
    assert r.num_computed_tokens == 32
    swa, mamba, full = group_tables(r)
    assert mamba[0] is None and mamba[1] is not None
    unit = policy._unit(r, 0)
    assert isinstance(unit, ChunkUnit)
    assert unit.block_hash == r.block_hashes[1] and unit.parent_hash is None
    assert unit.token_start == 0
    # Group by group: the window's 2 blocks, the state at the chunk's end, full's 2 blocks.
    assert unit.members == [swa[0], swa[1], mamba[1], full[0], full[1]]
    assert policy._unit(r, 1) is None  # not computed yet
    # The chunk's copy pins every member (one reference more than the request's).
    assert all(b is not None and b.ref_cnt == 2 for b in unit.members)

    def without(group: int, position: int) -> ChunkUnit | None:
        saved = r.group_blocks
        r.group_blocks = [list(t) for t in group_tables(r)]
        r.group_blocks[group][position] = None
        try:
            return policy._unit(r, 0)
        finally:
            r.group_blocks = saved

    assert without(0, 0) is None  # a window's block released
    assert without(1, 1) is None  # no Mamba state at the chunk's end
    assert without(2, 1) is None
    assert without(1, 0) is not None  # a Mamba state inside the chunk is not needed
    run.step()  # [32, 64): the second chunk
    assert r.num_computed_tokens == 64
    unit = policy._unit(r, 1)
    assert unit is not None and unit.block_hash == r.block_hashes[3]
    assert unit.parent_hash == r.block_hashes[1] and unit.token_start == 32
    swa, mamba, full = group_tables(r)
    assert unit.members == [swa[2], swa[3], mamba[3], full[2], full[3]]
    run.drain()
    assert _connector(core).stored_blocks == 2


def test_positions_of_a_device_hit_are_not_stored_again() -> None:
    # Window 4 on 4-token blocks: a hit needs 1 block of the window; chunks of 16 (4 blocks).
    def run_b(after_a: bool) -> tuple[EngineCore, Run]:
        core = EngineCore(_config(SWA_FULL, window=4, hybrid_chunk_size=16))
        run = Run(core)
        a = list(range(100, 112))
        if after_a:
            run.drain(req("a", a, 1, ignore_eos=True))  # 3 blocks: no whole chunk
            assert _connector(core).stored_blocks == 0
        core.add_request(req("b", [*a, *range(300, 312)], 3, ignore_eos=True))
        run.step()
        return core, run

    core, run = run_b(after_a=True)
    b = core.requests["b"]
    # Hit: full 3 blocks; the window's hit table holds only its last block: [−, −, b2].
    # b computed [12, 24): 6 blocks, so chunk 0 ([0, 16)) is complete, but the window never
    # had its blocks 0 and 1: the chunk is not stored.
    assert b.num_cached_tokens == 12 and b.num_computed_tokens == 24
    assert _held(b) == [[False, False, True, True, True, True], [True] * 6]
    assert _policy(core)._unit(b, 0) is None
    run.drain()
    assert _connector(core).stored_blocks == 0 and _cpu(core).num_resident == 0
    # The same request without a hit stores its chunk.
    core, run = run_b(after_a=False)
    assert core.requests["b"].num_cached_tokens == 0
    run.drain()
    assert _connector(core).stored_blocks == 1


def test_chunked_prefill_loses_chunks_whose_window_moved_on() -> None:
    # Window 8, 4-token blocks, chunks of 16 (4 blocks), 12 tokens a pass. A pass that
    # starts at c first releases the window's blocks before c − 7: (c − 7) // 4 of them.
    # [0, 12) caches blocks 0-2; [12, 24) releases block 0, caches 3-5: chunk 0 lacks it.
    # [24, 36) releases 1-3, caches 6-8: chunk 1 (blocks 4-7) is whole. [36, 48) releases
    # 4-6, caches 9-11: chunk 2 (8-11) is whole. 50 tokens: no fourth chunk.
    core = EngineCore(_config(SWA_FULL, hybrid_chunk_size=16, max_num_batched_tokens=12))
    prompt = list(range(100, 150))
    Run(core).drain(req("a", prompt, 1, ignore_eos=True))
    hashes = _hashes(core, prompt)
    assert [hashes[i] in _cpu(core) for i in (3, 7, 11)] == [False, True, True]
    assert _connector(core).stored_blocks == 2


def _qwen3_next(**kw: Any) -> EngineCore:
    base: dict[str, Any] = {"model": QWEN3_NEXT, "num_gpu_blocks": 64, "max_model_len": 4096,
                            "num_cpu_blocks": 64, "offload_policy": "write-through"}  # fmt: skip
    base.update(kw)
    return EngineCore(EngineConfig.of(**base))


def _passes(core: EngineCore, num_tokens: int) -> list[int]:
    """Computed tokens after each pass of one request until its prompt is done; the run is
    then drained."""
    core.add_request(req("a", range(num_tokens), 1, ignore_eos=True))
    r = core.requests["a"]
    run = Run(core)
    seen = []
    while r.num_computed_tokens < num_tokens:
        run.step()
        seen.append(r.num_computed_tokens)
    run.drain()
    return seen


@pytest.mark.parametrize(
    ("chunk", "passes", "stored"),
    [
        # Every chunk's end (544, 1088, 1632), then the prompt's end; 2000 // 544 = 3 whole
        # prompt blocks: 3 chunks, each stored with its states.
        (544, [544, 1088, 1632, 2000], 3),
        # 1088, then the last block boundary 1632 (the state a longer prompt hits), then
        # 2000; only [0, 1088) is a whole chunk of 2 blocks.
        (1088, [1088, 1632, 2000], 1),
    ],
)
def test_mamba_prefill_stops_at_every_chunk_end(chunk: int, passes: list[int], stored: int) -> None:
    core = _qwen3_next(hybrid_chunk_size=chunk)
    assert _passes(core, 2000) == passes
    assert _connector(core).stored_blocks == stored
    hashes = _hashes(core, range(2000))
    assert _cpu(core).resident_keys() == set(chunk_keys(hashes, chunk // 544)[:stored])


def test_mamba_prefill_without_a_cpu_tier_stops_at_the_last_boundary_only() -> None:
    assert _passes(_qwen3_next(num_cpu_blocks=0), 2000) == [1632, 2000]


# -- 3. loads -----------------------------------------------------------------------------------


def test_cpu_hit_loads_whole_chunks_into_every_group() -> None:
    # Sliding (window 16), Mamba, full on 16-token blocks; chunks of 32; unit = 2 + 1 + 2
    # blocks' bytes; 64 // 5 = 12 chunks of CPU tier.
    config = _config(SWA_MAMBA_FULL, window=16, block_size=16, num_gpu_blocks=16,
                     max_model_len=256, hybrid_chunk_size=32)  # fmt: skip
    core = EngineCore(config)
    connector, kv = _connector(core), _kv(core)
    assert _cpu(core).capacity == 12
    run = Run(core)
    p = list(range(1000, 1080))  # 5 blocks: 2 whole chunks
    run.drain(req("a", p, 1, ignore_eos=True))
    assert connector.stored_blocks == 2
    # 7 blocks: 3 chunks; p's blocks are evicted
    run.drain(req("q", range(2000, 2112), 1, ignore_eos=True))
    assert connector.stored_blocks == 5
    hashes = _hashes(core, p)
    assert core.num_cached_prefix_blocks(hashes) == 0
    core.add_request(req("a2", p, 3, ignore_eos=True))
    a2 = core.requests["a2"]
    run.step()
    # (80 − 1) // 32 = 2 chunks are looked up and found: 4 positions reserved in every
    # group; the window's positions already out of it when the load ends (before
    # 64 − 16 + 1 = 49: 0..2) get no block, nor do the Mamba group's but its last state.
    assert a2.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert _held(a2) == [[False, False, False, True], [False, False, False, True], [True] * 4]
    assert kv.used == [1, 1, 4]
    deadline = core.next_transfer_deadline()
    assert deadline is not None
    core.advance_transfers(deadline)  # the load ends; no pass
    assert _status(a2) == RequestStatus.WAITING and a2.num_computed_tokens == 64
    swa, mamba, full = group_tables(a2)
    assert [
        python_pool(core.pool).group_map(2)[hashes[i]] for i in range(4)
    ] == full  # loaded, cached
    assert python_pool(core.pool).group_map(0)[hashes[3]] is swa[3]
    assert python_pool(core.pool).group_map(1)[hashes[3]] is mamba[3]
    assert kv.used == [1, 1, 4]
    check_groups(python_pool(core.pool), _kv(core))
    run.step()
    # The rest [64, 80): the window releases (64 − 15) // 16 = 3 blocks first; the Mamba
    # group takes a state at position 4 and keeps the loaded one for this pass.
    assert a2.num_computed_tokens == 80
    assert _held(a2) == [[False] * 3 + [True] * 2, [False] * 3 + [True] * 2, [True] * 5]
    assert kv.used == [2, 2, 5]
    run.drain()
    assert run.final["a2"].num_cached_tokens == 64
    assert run.final["a2"].tier_hits == (("cpu", 64),)
    assert connector.loaded_blocks == 2 and connector.stored_blocks == 5


@pytest.mark.parametrize(
    ("prompt_len", "min_load_blocks", "tier_hits"),
    [
        # 12 tokens: (12 − 1) // 8 = 1 chunk looked up (2 blocks a group): one unit.
        # min_load_blocks counts device blocks (as --min-load-blocks and vLLM's offload
        # block_size do): a chunk is 2 of them.
        (12, 2, (("cpu", 8),)),
        (12, 3, ()),  # 2 < 3: recomputed
        # 20 tokens: 2 chunks, 4 blocks.
        (20, 4, (("cpu", 16),)),
        (20, 5, ()),
    ],
)
def test_min_load_blocks_counts_chunks(
    prompt_len: int, min_load_blocks: int, tier_hits: tuple[tuple[str, int], ...]
) -> None:
    config = _config(SWA_FULL, num_gpu_blocks=10, hybrid_chunk_size=8,
                     min_load_blocks=min_load_blocks)  # fmt: skip
    core = EngineCore(config)
    run = Run(core)
    prompt = list(range(100, 100 + prompt_len))
    run.drain(req("a", prompt, 1, ignore_eos=True))
    # 5 blocks in each group: the whole pool
    run.drain(req("flush", range(500, 520), 1, ignore_eos=True))
    assert core.num_cached_prefix_blocks(_hashes(core, prompt)) == 0
    run.drain(req("a2", prompt, 1, ignore_eos=True))
    out = run.final["a2"]
    assert out.tier_hits == tier_hits
    assert out.num_cached_tokens == sum(n for _, n in tier_hits)
    assert _connector(core).loaded_blocks == out.num_cached_tokens // 8  # units loaded


# -- 4. the device's groups disagree: the tier continues from their minimum -------------------


def test_tier_continues_from_the_groups_minimum_hit() -> None:
    # Mamba + full on 16-token blocks, chunks of 32 (2 blocks; unit = 2 + 1 blocks' bytes).
    # Two engines share one CPU tier of 20 chunks.
    config = _config(MAMBA_FULL, block_size=16, num_gpu_blocks=32, max_model_len=256,
                     num_cpu_blocks=60, hybrid_chunk_size=32)  # fmt: skip
    cpu = LruTier(20, 32)
    e1, e2 = EngineCore(config, cpu_tier=cpu), EngineCore(config, cpu_tier=cpu)
    p = list(range(1000, 1080))  # 5 blocks
    Run(e1).drain(req("p1", p, 1, ignore_eos=True))
    hashes = _hashes(e1, p)
    assert cpu.resident_keys() == {hashes[1], hashes[3]}  # chunks [0, 32) and [32, 64)
    # On e2, r shares p's first 48 tokens: it loads chunk 0 from the tier, computes the rest
    # stopping at 64 and 80 (chunk end, last boundary), and stores its own chunk 1.
    run = Run(e2)
    run.drain(req("r", [*p[:48], *range(5000, 5040)], 1, ignore_eos=True))
    assert run.final["r"].tier_hits == (("cpu", 32),)
    assert len(cpu.resident_keys()) == 3
    # e2's device holds full-attention blocks 0-2 of p, but Mamba states of p only at
    # position 1 (r's states at 3 and 4 are r's own): the hit is their minimum, 2 blocks.
    kv = _kv(e2)
    assert kv.managers[1].find_hit(hashes, 4) == 3
    assert kv.managers[0].find_hit(hashes, 4) == 2
    assert e2.num_cached_prefix_blocks(hashes[:4]) == 2
    e2.add_request(req("p2", p, 2, ignore_eos=True))
    p2 = e2.requests["p2"]
    run.step()
    # The tier continues at chunk 1 (2 blocks = 1 chunk in): found (e1 stored it); the
    # lookup stops at (80 − 1) // 32 = 2 chunks: 1 chunk loaded into positions 2 and 3 of
    # every group, the full group's block 2 included (the device's is not counted).
    assert p2.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert _held(p2) == [[False, True, False, True], [True] * 4]
    device_block_2 = python_pool(e2.pool).group_map(1)[hashes[2]]
    assert group_tables(p2)[1][2] is not device_block_2  # reserved for the load
    run.drain()
    out = run.final["p2"]
    assert out.num_cached_tokens == 2 * 16 + 32  # not 3 × 16 + 32
    assert out.tier_hits == (("cpu", 32),)
    assert _connector(e2).loaded_blocks == 2  # r's chunk 0, p2's chunk 1


# -- 5. start-up checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "changes", "message"),
    [
        # (64 − 1) // 16 × 16 = 48: the largest chunk a 64-token context can fill.
        (GPT_OSS, {"max_model_len": 64, "hybrid_chunk_size": 64}, "use hybrid_chunk_size 48"),
        (GPT_OSS, {"max_model_len": 100, "hybrid_chunk_size": 128}, "use hybrid_chunk_size 96"),
        # (2000 − 1) // 544 × 544 = 1632.
        (QWEN3_NEXT, {"max_model_len": 2000, "hybrid_chunk_size": 2176},
         "use hybrid_chunk_size 1632"),
        # The default chunk (one 544-token block) cannot fit a 544-token context.
        (QWEN3_NEXT, {"max_model_len": 544}, "raise max_model_len above 544"),
        (GPT_OSS, {"hybrid_chunk_size": 24}, r"must be a multiple of the block size \(16\)"),
        (QWEN3_NEXT, {"hybrid_chunk_size": 1000}, r"multiple of the block size \(544\)"),
        (GPT_OSS, {"hybrid_chunk_size": 0}, "hybrid_chunk_size"),
        # 64 tokens: 4 blocks × 2 groups = 8 blocks' bytes a chunk, 7 are too few.
        (GPT_OSS, {"hybrid_chunk_size": 64, "num_cpu_blocks": 7}, "one needs 8 blocks' worth"),
        (GPT_OSS, {"offload_policy": "evict"}, "write-through"),
        (QWEN3_NEXT, {"offload_policy": "evict"}, "write-through"),
    ],
)  # fmt: skip
def test_hybrid_offload_mistakes_are_refused(
    model: ModelShape, changes: dict[str, Any], message: str
) -> None:
    base: dict[str, Any] = {"model": model, "num_gpu_blocks": 256, "max_model_len": 4096,
                            "num_cpu_blocks": 64, "offload_policy": "write-through"}  # fmt: skip
    base.update(changes)
    with pytest.raises(ConfigError, match=message):
        EngineConfig.of(**base)


def test_largest_fillable_chunk_is_accepted() -> None:
    # 48 < 64: a 49-token prompt fills it.
    config = EngineConfig.of(model=GPT_OSS, num_gpu_blocks=256, max_model_len=64,
                          num_cpu_blocks=64, offload_policy=WRITE_THROUGH,
                          hybrid_chunk_size=48)  # fmt: skip
    assert config.unit_blocks == 3
    config = EngineConfig.of(model=GPT_OSS, num_gpu_blocks=256, max_model_len=65,
                          num_cpu_blocks=64, offload_policy=WRITE_THROUGH,
                          hybrid_chunk_size=64)  # fmt: skip
    assert config.unit_blocks == 4


def _offloading(**extra: object) -> str:
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": extra})  # fmt: skip


def _from_flags(model: str, raw: str) -> EngineConfig:
    argv = ["--model-shape", model, "--max-model-len", "4096",
            "--num-gpu-blocks-override", "1024", "--kv-transfer-config", raw]  # fmt: skip
    return serve_config(*argv)


@pytest.mark.parametrize(
    ("model", "block_bytes", "chunk", "used"),
    [
        ("qwen3-next-80b-a3b", QWEN3_NEXT_BLOCK_BYTES, 1000, 544),
        ("qwen3-next-80b-a3b", QWEN3_NEXT_BLOCK_BYTES, 1200, 1088),  # rounded down
        ("qwen3-next-80b-a3b", QWEN3_NEXT_BLOCK_BYTES, 300, 544),  # at least one block
        ("gpt-oss-20b", GPT_OSS_BLOCK_BYTES, 40, 32),
    ],
)
def test_kv_transfer_config_chunk_not_a_multiple_warns_and_rounds_down(
    caplog: pytest.LogCaptureFixture, model: str, block_bytes: int, chunk: int, used: int
) -> None:
    raw = _offloading(cpu_bytes_to_use=16 * block_bytes, hybrid_chunk_size=chunk)
    with caplog.at_level(logging.WARNING, logger="mocker.settings.engine"):
        config = _from_flags(model, raw)
    assert config.offload.hybrid_chunk_size == used and config.offload.num_cpu_blocks == 16
    assert config.offload.offload_policy == "write-through"
    assert f"hybrid_chunk_size {chunk} is not a multiple" in caplog.text
    assert f"using {used}" in caplog.text


def test_kv_transfer_config_chunk_that_is_a_multiple_is_kept_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = _offloading(cpu_bytes_to_use=16 * QWEN3_NEXT_BLOCK_BYTES, hybrid_chunk_size=1088)
    with caplog.at_level(logging.WARNING, logger="mocker.settings.engine"):
        config = _from_flags("qwen3-next-80b-a3b", raw)
    assert config.offload.hybrid_chunk_size == 1088 and config.unit_blocks == 2
    assert "hybrid_chunk_size" not in caplog.text


@pytest.mark.parametrize("chunk", [0, -544, "544", True, 544.0])
def test_kv_transfer_config_chunk_must_be_a_positive_int(chunk: object) -> None:
    raw = _offloading(cpu_bytes_to_use=16 * QWEN3_NEXT_BLOCK_BYTES, hybrid_chunk_size=chunk)
    with pytest.raises(ConfigError, match="hybrid_chunk_size"):
        _from_flags("qwen3-next-80b-a3b", raw)


# -- a Mamba group's superseded states ----------------------------------------------------------


def _mamba_states(core: EngineCore, r: Request) -> list[int]:
    kv = _kv(core)
    return [
        sum(b is not None for b in table)
        for table, group in zip(group_tables(r), kv.layout.groups, strict=True)
        if not group.is_attention
    ]


def test_mamba_group_holds_at_most_two_states_with_multi_block_chunks() -> None:
    # A pass over several blocks leaves a sparse Mamba table ([−, s1, −, s3]): the state it
    # superseded is released all the same.
    # 5000 + 2 − 1 tokens need 10 full-attention blocks + 2 states in each of 3 Mamba groups =
    # 16 blocks (KVLayout.max_blocks_per_request): a pool of 16 holds the request alone.
    core = _qwen3_next(num_gpu_blocks=16, max_model_len=8192, hybrid_chunk_size=1088)
    core.add_request(req("a", range(5000), 2, ignore_eos=True))
    r = core.requests["a"]
    run = Run(core)
    while r.num_computed_tokens < 5000:
        run.step()
        # The state it runs on, and the one it was copied from for one pass.
        assert r.group_blocks is not None
        assert max(_mamba_states(core, r)) <= 2, r.num_computed_tokens
    run.drain()
    assert core.scheduler.num_preemptions == 0
