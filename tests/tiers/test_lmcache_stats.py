"""What LMCache's worker counts, and its flush every 10 seconds."""

from __future__ import annotations

from mocker.engine.core import EngineCore
from mocker.tiers.lmcache_stats import LMCacheStats
from tests.support.engines import small_config
from tests.support.workloads import two_rounds


def test_counts_move_only_when_flushed() -> None:
    stats = LMCacheStats(chunk_tokens=256)
    flushed: list[list[tuple[str, float]]] = []
    stats.on_flush = flushed.append
    stats.flush(0, 0)  # (LMCache's first flush: at start)
    stats.lookup(600, 512)
    stats.lookup(200, 0)  # no whole chunk: LMCache sends no lookup at all
    stats.retrieve(512, 0.002)
    stats.store(256)
    assert stats.totals.lookup_requests == 0
    stats.flush(4096, 8192)
    t = stats.totals
    assert (t.lookup_requests, t.lookup_tokens, t.lookup_hits) == (1, 512, 512)
    assert (t.retrieve_requests, t.requested_tokens, t.hit_tokens) == (1, 512, 512)
    assert (t.store_requests, t.stored_tokens) == (1, 256)
    assert stats.lookup_hit_rate == 1.0 and stats.retrieve_hit_rate == 1.0
    assert (stats.local_cache_usage, stats.local_storage_usage) == (4096, 8192)
    (observed,) = flushed
    assert ("request_cache_hit_rate", 1.0) in observed  # (of the whole chunks asked for)
    assert ("time_to_retrieve", 0.002) in observed and ("retrieve_speed", 256000.0) in observed
    # An interval without lookups or retrieves: LMCache's 0 and 1.
    stats.flush(0, 0)
    assert stats.lookup_hit_rate == 0.0 and stats.retrieve_hit_rate == 1.0


def test_an_engine_run_counts_as_lmcaches_worker() -> None:
    # Eight 600-token prompts (2 whole chunks and a partial one), twice, through a device of
    # 64 blocks of 16: round 1 stores 512 tokens of each, round 2 finds and reads them.
    config = small_config(
        block_size=16, num_gpu_blocks=64, max_model_len=1024, max_num_batched_tokens=2048,
        num_cpu_blocks=512, offload_policy="write-through", offload_backend="lmcache",
        sync_loads=True, chunk_blocks=16, lmcache_api=("127.0.0.1", 0),
    )  # fmt: skip
    core = EngineCore(config)
    two_rounds(core)
    assert core.connector is not None and core.connector.lmcache is not None
    stats = core.connector.lmcache
    core.connector.flush_lmcache()
    t = stats.totals
    assert (t.lookup_requests, t.lookup_tokens, t.lookup_hits) == (16, 16 * 512, 8 * 512)
    assert (t.retrieve_requests, t.requested_tokens) == (8, 8 * 512)
    assert (t.store_requests, t.stored_tokens) == (8, 8 * 512)
    assert (t.vllm_hit_tokens, t.prompt_tokens) == (0, 16 * 512)
