"""The headline scenario: a working set 4× the device pool but within the host tier, run twice.

The second round is served from host: TTFT drops by exactly the amount computed here from
REFERENCE.md's prefill polynomial and the block bytes, and metrics and KV events add up.
"""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.engine.virtual import VirtualDriver
from mocker.kv.events import BlockRemoved, BlockStored
from mocker.metrics import EngineMetrics, EngineSnapshot, MetricsCollector, build_registry
from mocker.request import EngineRequest, SamplingParams

BLOCK = 16
PROMPT = 1024  # 64 blocks per prompt
PROMPTS = 16  # 1024 blocks of working set
DEVICE_BLOCKS = 256  # a quarter of it
HOST_BLOCKS = 2048
BLOCK_BYTES = BLOCK * 32 * 2 * 8 * 128 * 2  # Llama-3-8B: 131072 B/token → 2 MiB per block
GBPS = 32e9  # the default 32 GB/s links
LOADED = (PROMPT - 1) // BLOCK  # the lookup stops one token short: 63 blocks


def prefill_ms(t: int) -> float:
    return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142


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
    config = EngineConfig(
        block_size=BLOCK,
        num_gpu_blocks=DEVICE_BLOCKS,
        max_model_len=4096,
        num_host_blocks=HOST_BLOCKS,
        offload_policy=policy,
        enable_kv_cache_events=True,
    )
    core = EngineCore(config)
    metrics = EngineMetrics(config, lookup=core.requests.get)
    assert core.host is not None
    host = core.host
    metrics.snapshot = lambda: EngineSnapshot(0, 0, core.pool.usage, host.usage)
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
    # Round 2: the device holds none of it; 63 blocks load from host, 16 tokens compute.
    second = copy_s(LOADED) + prefill_ms(PROMPT - LOADED * BLOCK) / 1000
    for k in range(1, PROMPTS):  # (the first of round 2 may wait for evict copies too)
        r = finished[f"round1-{k}"]
        assert r.num_cached_tokens == r.num_host_cached_tokens == LOADED * BLOCK
        assert ttft(f"round1-{k}") == pytest.approx(second, rel=1e-9)
    drop = ttft(f"round0-{PROMPTS - 1}") - ttft(f"round1-{PROMPTS - 1}")
    assert drop == pytest.approx(steady_first - second, rel=1e-9)
    assert drop > 0.010  # over 10 ms faster

    # Every distinct block reached host exactly once; each round-2 prompt loaded 63 blocks.
    total_blocks = PROMPTS * PROMPT // BLOCK
    assert metrics.offload_store_bytes == total_blocks * BLOCK_BYTES
    assert metrics.offload_load_bytes == PROMPTS * LOADED * BLOCK_BYTES
    assert metrics.offload_load_size.count == PROMPTS
    assert metrics.offload_load_time == pytest.approx(PROMPTS * copy_s(LOADED), rel=1e-9)
    assert metrics.external_prefix_queries == 2 * PROMPTS * PROMPT
    assert metrics.external_prefix_hits == PROMPTS * LOADED * BLOCK
    assert metrics.prefix_hits == 0
    assert metrics.prompt_tokens_cached == metrics.prompt_tokens_cached_host
    assert metrics.prompt_tokens_cached == PROMPTS * LOADED * BLOCK
    # Events: each round stores every block on the device (64 per prompt, loaded or
    # computed); all but the last 256 left it; host received each block once.
    assert events["BlockStored", "GPU"] == 2 * total_blocks
    assert events["BlockRemoved", "GPU"] == 2 * total_blocks - DEVICE_BLOCKS
    assert events["BlockStored", "CPU"] == total_blocks
    assert events["BlockRemoved", "CPU"] == 0  # the host tier never filled
    assert host.num_resident == total_blocks and host.usage == total_blocks / HOST_BLOCKS

    text = generate_latest(build_registry(MetricsCollector([metrics], "m"), process=False))
    samples = {
        (sample.name, sample.labels.get("source")): sample
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }
    hits = PROMPTS * LOADED * BLOCK
    assert samples["vllm:prompt_tokens_cached_by_source_total", "host"].value == hits
    assert samples["vllm:prompt_tokens_cached_by_source_total", "device"].value == 0
    assert samples["vllm:external_prefix_cache_hits_total", None].value == hits
    assert samples["vllm:kv_offload_load_bytes_total", None].value == hits // BLOCK * BLOCK_BYTES
    assert samples["vllm:kv_offload_store_bytes_total", None].value == total_blocks * BLOCK_BYTES
    assert samples["vllm:kv_offload_cpu_cache_usage_perc", None].value == 0.5
    info = samples["vllm:cache_config_info", None].labels
    assert info["num_cpu_blocks"] == str(HOST_BLOCKS) and info["kv_offloading_size"] == "4.0"
