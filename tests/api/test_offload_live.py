"""The host-tier scenario through `mocker serve`: a real uvicorn, the `openai` client, /metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest

from tests.support.checks import not_none
from tests.support.engines import prefill_ms
from tests.support.servers import ServerThread, make_app, scrape

BLOCK = 16
PROMPT = 1024
PROMPTS = 16
BLOCK_BYTES = BLOCK * 131072  # Llama-3-8B
LOADED = (PROMPT - 1) // BLOCK
# A quarter of the modelled speed: round 2's saving (~50 ms a request) stands well clear of
# the few milliseconds a loaded machine adds to each live TTFT.
SPEEDUP = 0.25


@pytest.fixture(scope="module")
def host_server() -> Iterator[ServerThread]:
    # Real time (slowed down), so the engine's own TTFTs can be compared with hand values.
    app = make_app(speedup_ratio=SPEEDUP, block_size=BLOCK, num_gpu_blocks=256, num_cpu_blocks=2048)
    with ServerThread(app) as srv:
        yield srv


def test_working_set_4x_the_device_pool_is_served_from_host(host_server: ServerThread) -> None:
    client = openai.OpenAI(base_url=host_server.url + "/v1", api_key="x", max_retries=0)
    prompts = [[1000 * (k + 1) + j for j in range(PROMPT)] for k in range(PROMPTS)]
    ttft_sums = []
    cached: list[list[int]] = [[], []]
    for rnd in range(2):
        for prompt in prompts:
            c = client.completions.create(
                model="mocker", prompt=prompt, max_tokens=1, extra_body={"ignore_eos": True}
            )
            assert c.usage is not None and c.usage.prompt_tokens_details is not None
            cached[rnd].append(not_none(c.usage.prompt_tokens_details.cached_tokens))
        ttft_sum = scrape(host_server.url, "source")["vllm:time_to_first_token_seconds_sum", None]
        ttft_sums.append(ttft_sum)
    assert cached[0] == [0] * PROMPTS
    assert cached[1] == [LOADED * BLOCK] * PROMPTS  # every prompt found again

    stored_bytes = -1.0
    deadline = time.monotonic() + 10
    while True:  # the last copies to host may still be in flight
        m = scrape(host_server.url, "source")
        if m["vllm:kv_offload_store_bytes_total", None] == stored_bytes:
            break
        stored_bytes = m["vllm:kv_offload_store_bytes_total", None]
        assert time.monotonic() < deadline
        time.sleep(0.2)
    host = m["vllm:prompt_tokens_cached_by_source_total", "host"]  # vLLM 0.34's source
    device = m["vllm:prompt_tokens_cached_by_source_total", "device"]
    assert host + device == sum(cached[1])
    for unused in ("p2p", "disk", "external_unspecified"):
        assert m["vllm:prompt_tokens_cached_by_source_total", unused] == 0
    # Eviction takes clean blocks first, so the last round-1 prompts (never copied) may
    # still be on the device; the others come from host.
    assert host >= 12 * LOADED * BLOCK
    assert m["vllm:external_prefix_cache_hits_total", None] == host
    assert m["vllm:prefix_cache_hits_total", None] == device
    assert m["vllm:external_prefix_cache_queries_total", None] == 2 * PROMPTS * PROMPT
    assert m["vllm:kv_offload_load_bytes_total", None] == host // BLOCK * BLOCK_BYTES
    stored = stored_bytes / BLOCK_BYTES
    assert stored == int(stored) and stored >= 12 * PROMPT // BLOCK
    # vLLM 0.34's CPU usage is the share in-flight transfers pin: none once they are done.
    assert m["vllm:kv_offload_cpu_cache_usage_perc", None] == 0.0
    assert m["vllm:kv_offload_cpu_cache_write_usage_perc", None] == 0.0
    assert m["vllm:kv_offload_allocation_failure_total", None] == 0.0
    assert m["vllm:kv_cache_usage_perc", None] == 0.0

    # The engine's own TTFTs (not the client's). Round 1 computes all 1024 tokens (and,
    # once the pool is full, first waits for 32 evicted blocks to be copied out; the other
    # 32 were copied in the background). Round 2 loads what it found on host at 32 GB/s
    # and computes the last 16 tokens. Means over each round, in modelled seconds / SPEEDUP.
    prefill_16 = prefill_ms(PROMPT - LOADED * BLOCK) / 1000
    second = (host // BLOCK * BLOCK_BYTES / 32e9 + PROMPTS * prefill_16) / PROMPTS / SPEEDUP
    first = (4 * prefill_ms(PROMPT) / 1000 + 12 * (32 * BLOCK_BYTES / 32e9 + prefill_ms(PROMPT)
             / 1000)) / PROMPTS / SPEEDUP  # fmt: skip
    mean1 = ttft_sums[0] / PROMPTS
    mean2 = (ttft_sums[1] - ttft_sums[0]) / PROMPTS
    # Live passes start when the loop gets to them, so a loaded machine only adds to a TTFT
    # (a few ms of wake-up delay each): the model bounds each mean from below (round 1 by
    # its prefills alone, since a longer gap between requests may let a copy-out finish in
    # the background) and a loose allowance bounds it from above.
    assert prefill_ms(PROMPT) / 1000 / SPEEDUP * 0.99 <= mean1 <= first + 0.05, (mean1, first)
    assert second * 0.99 <= mean2 <= second + 0.05, (mean2, second)
    # Served from host, at least half the modelled saving shows (a delay hits both rounds).
    assert mean1 - mean2 > (first - second) / 2, (mean1, mean2, first, second)
