"""The headline scenario: a working set 4× the device pool but within the host tier, run twice.

The second round is served from host: TTFT drops by exactly the amount computed here from
Dynamo's prefill polynomial (4.209989e-7·t² + 1.518344e-2·t + 16.50142 ms for t new tokens)
and the block bytes, and metrics and KV events add up.
"""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mocker.config import EngineConfig
from mocker.config_choices import OffloadPolicy
from mocker.engine.core import EngineCore
from mocker.engine.virtual import VirtualDriver
from mocker.kv.events import BlockRemoved, BlockStored
from mocker.metrics import MetricsCollector, StatsRecorder, build_registry
from mocker.request import EngineRequest, SamplingParams
from tests.support.engines import prefill_ms

BLOCK = 16
PROMPT = 1024  # 64 blocks per prompt
PROMPTS = 16  # 1024 blocks of working set
DEVICE_BLOCKS = 256  # a quarter of it
HOST_BLOCKS = 2048
BLOCK_BYTES = BLOCK * 32 * 2 * 8 * 128 * 2  # Llama-3-8B: 131072 B/token → 2 MiB per block
GBPS = 32e9  # the default 32 GB/s links
LOADED = (PROMPT - 1) // BLOCK  # the lookup stops one token short: 63 blocks


def copy_s(blocks: int) -> float:
    return blocks * BLOCK_BYTES / GBPS


def scenario_requests() -> list[EngineRequest]:
    prompts = [[1000 * (k + 1) + j for j in range(PROMPT)] for k in range(PROMPTS)]
    sampling = SamplingParams(max_tokens=1, ignore_eos=True)
    return [
        EngineRequest(f"round{r}-{k}", prompts[k], sampling, arrival_time=float(r * PROMPTS + k))
        for r in range(2)
        for k in range(PROMPTS)
    ]


@pytest.mark.parametrize("policy", ["evict", "write-through"])
def test_second_round_is_served_from_host(policy: str) -> None:
    config = EngineConfig.of(
        block_size=BLOCK,
        num_gpu_blocks=DEVICE_BLOCKS,
        max_model_len=4096,
        num_cpu_blocks=HOST_BLOCKS,
        offload_policy=OffloadPolicy(policy),
        enable_kv_cache_events=True,
    )
    core = EngineCore(config)
    metrics = StatsRecorder(config)
    assert core.cpu is not None
    host = core.cpu
    metrics.snapshot = core.snapshot
    events: Counter[tuple[str, str]] = Counter()
    finished = {}
    for result in VirtualDriver(core).steps(scenario_requests()):
        metrics.on_step(result)
        finished.update({r.request_id: r for r in result.finished})
        for e in result.kv_events:
            if isinstance(e, BlockStored | BlockRemoved):
                events[type(e).__name__, e.medium] += len(e.block_hashes)

    def ttft(rid: str) -> float:
        r = finished[rid]
        assert r.first_token_time is not None
        return r.first_token_time - r.arrival_time

    # Round 1 computes every prompt. Under `evict`, once the pool is full each admission
    # needs 64 blocks evicted, and so copied to host, first: 32 of them (an eighth of the
    # pool) were copied in the background after the previous prompt's pass, the other 32
    # are copied while it waits. Under write-through the copies happened after each
    # prompt's pass, and eviction is free.
    first = prefill_ms(PROMPT) / 1000
    ahead = DEVICE_BLOCKS // 8
    steady_first = copy_s(PROMPT // BLOCK - ahead) + first if policy == "evict" else first
    for k in range(PROMPTS):
        expected = first if k < DEVICE_BLOCKS // (PROMPT // BLOCK) else steady_first
        assert ttft(f"round0-{k}") == pytest.approx(expected, rel=1e-9)
    # Round 2: 63 blocks are found (the lookup stops one token short), 16 tokens computed.
    # With write-through the device holds none of a prompt by then (plain LRU), so all 63
    # load from host. With `evict`, eviction takes clean blocks (already on host) before
    # dirty ones, so the last round-1 prompts, never copied, are still on the device for
    # the last round-2 requests; only the rest of the hit loads.
    second = copy_s(LOADED) + prefill_ms(PROMPT - LOADED * BLOCK) / 1000
    host_hits = device_hits = 0
    for k in range(PROMPTS):
        r = finished[f"round1-{k}"]
        assert r.num_cached_tokens == LOADED * BLOCK
        loaded = r.num_tier_cached_tokens
        host_hits, device_hits = host_hits + loaded, device_hits + r.num_cached_tokens - loaded
        if policy == "write-through" or 1 <= k <= 12:
            assert loaded == LOADED * BLOCK and ttft(f"round1-{k}") == pytest.approx(second)
        if k >= 1:  # (the first of round 2 may wait for evict copies too)
            expected = copy_s(loaded // BLOCK) + prefill_ms(PROMPT - LOADED * BLOCK) / 1000
            assert ttft(f"round1-{k}") == pytest.approx(expected, rel=1e-9)
    drop = ttft("round0-8") - ttft("round1-8")
    assert drop == pytest.approx(steady_first - second, rel=1e-9)
    assert drop > 0.010  # over 10 ms faster
    assert host_hits >= 12 * LOADED * BLOCK

    # Metrics and events add up with what the requests saw.
    total_blocks = PROMPTS * PROMPT // BLOCK
    assert core.connector is not None
    stored = core.connector.stored_blocks
    assert stored == total_blocks or (policy == "evict" and stored >= total_blocks - 4 * 64)
    assert metrics.offload_store_bytes == stored * BLOCK_BYTES
    assert metrics.offload_load_bytes == host_hits // BLOCK * BLOCK_BYTES
    assert metrics.offload_load_time == pytest.approx(copy_s(host_hits // BLOCK), rel=1e-9)
    assert metrics.external_prefix_queries == 2 * PROMPTS * PROMPT
    assert metrics.external_prefix_hits == metrics.prompt_tokens_cached_tiers == host_hits
    assert metrics.prefix_hits == device_hits
    assert metrics.prompt_tokens_cached == host_hits + device_hits
    # Events: a block is stored on the device when computed or loaded (a device hit, or a
    # last block still cached from round 1, is already there); it was removed unless still
    # cached; host received each copy once.
    gpu_stored = events["BlockStored", "GPU"]
    if policy == "write-through":
        assert gpu_stored == 2 * total_blocks
    else:
        assert 0 <= total_blocks + (PROMPTS * PROMPT - device_hits) // BLOCK - gpu_stored <= 3
    assert events["BlockRemoved", "GPU"] == gpu_stored - len(core.pool.cached_hashes())
    assert events["BlockStored", "CPU"] == stored
    assert events["BlockRemoved", "CPU"] == 0  # the host tier never filled
    assert host.num_resident == stored and host.usage == stored / HOST_BLOCKS

    text = generate_latest(build_registry(MetricsCollector([metrics], "m"), process=False))
    samples = {
        (sample.name, sample.labels.get("source")): sample
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }
    assert samples["vllm:prompt_tokens_cached_by_source_total", "host"].value == host_hits
    assert samples["vllm:prompt_tokens_cached_by_source_total", "device"].value == device_hits
    # vLLM 0.33's form (--vllm-compat 0.33): the tier by name, counted at the first token.
    metrics.release = "0.33"
    text = generate_latest(build_registry(MetricsCollector([metrics], "m"), process=False))
    old = {
        (sample.name, sample.labels.get("source")): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if sample.name == "vllm:prompt_tokens_cached_by_source_total"
    }
    assert old == {
        ("vllm:prompt_tokens_cached_by_source_total", "device"): device_hits,
        ("vllm:prompt_tokens_cached_by_source_total", "cpu"): host_hits,
    }
    metrics.release = "0.34"
    assert samples["vllm:external_prefix_cache_hits_total", None].value == host_hits
    load_bytes = host_hits // BLOCK * BLOCK_BYTES
    assert samples["vllm:kv_offload_load_bytes_total", None].value == load_bytes
    assert samples["vllm:kv_offload_store_bytes_total", None].value == stored * BLOCK_BYTES
    # vLLM 0.34's: the share transfers pin (none now, all copies landed); 0.33's residency
    # is the snapshot's cpu_usage.
    assert samples["vllm:kv_offload_cpu_cache_usage_perc", None].value == 0.0
    assert metrics.current().cpu_usage == stored / HOST_BLOCKS
    info = samples["vllm:cache_config_info", None].labels
    assert info["num_cpu_blocks"] == str(HOST_BLOCKS) and info["kv_offloading_size"] == "None"
