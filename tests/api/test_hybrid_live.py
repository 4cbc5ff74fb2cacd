"""Hybrid models through `mocker serve --model-shape`: the `openai` client, usage, /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.kv_consumer import Subscriber, replay
from tests.support.servers import scrape, serve


def info_labels(url: str) -> dict[str, str]:
    text = httpx.get(url + "/metrics", timeout=10).text
    (family,) = (f for f in text_string_to_metric_families(text)
                 if f.name == "vllm:cache_config_info")  # fmt: skip
    return dict(family.samples[0].labels)


def cached_tokens(client: openai.OpenAI, prompt: list[int]) -> int:
    c = client.completions.create(
        model="mocker", prompt=prompt, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert c.usage is not None and c.usage.prompt_tokens_details is not None
    assert c.usage.prompt_tokens == len(prompt) and c.usage.completion_tokens == 2
    return c.usage.prompt_tokens_details.cached_tokens or 0


def test_qwen3_next_hits_only_where_a_mamba_state_was_saved() -> None:
    # Block 544 (the attention block grown to hold a Gated DeltaNet state). A 2000-token
    # prompt is computed in two passes, [0, 1632) and [1632, 2000): its Mamba states are
    # saved at 1632 = 3 × 544 (the last boundary before the prompt's end) and no earlier.
    with serve("--model-shape", "qwen3-next-80b-a3b", "--speedup-ratio", "100",
               "--num-gpu-blocks-override", "2048") as (_, url):  # fmt: skip
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        a = list(range(1000, 3000))
        assert cached_tokens(client, a) == 0
        assert cached_tokens(client, a) == 1632  # full attention and every Mamba group
        # Shares 1000 tokens with `a`: full attention holds its first block, but no Mamba
        # state was saved at 544, so nothing hits (a dense model would hit 544).
        b = a[:1000] + list(range(5000, 6000))
        assert cached_tokens(client, b) == 0
        assert cached_tokens(client, b) == 1632  # b's own states, saved at 1632
        m = scrape(url)
        assert m["vllm:prefix_cache_hits_total", None] == 2 * 1632
        assert m["vllm:prefix_cache_queries_total", None] == 4 * 2000
        assert m["vllm:prompt_tokens_cached_total", None] == 2 * 1632
        assert m["vllm:kv_cache_usage_perc", None] == 0.0  # every request finished: all freed
        labels = info_labels(url)
        assert labels["block_size"] == "544"
        assert labels["mamba_cache_mode"] == "align"
        assert labels["kv_cache_groups"] == "0:mamba,1:mamba,2:mamba,3:full_attention"


def test_gpt_oss_hits_through_the_window(tmp_path: Path) -> None:
    # Sliding window 128 over blocks of 16: a hit needs the 8 blocks before it cached in the
    # sliding group, and the whole prefix in the full one.
    events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": f"ipc://{tmp_path}/events",
                         "replay_endpoint": "tcp://127.0.0.1:*"})  # fmt: skip
    with serve("--model-shape", "gpt-oss-20b", "--speedup-ratio", "100", "--max-model-len",
               "8192", "--num-gpu-blocks-override", "2048",
               "--kv-events-config", events) as (_, url):  # fmt: skip
        # The publisher sends (and keeps for replay) once a first subscriber is there.
        sub = Subscriber(f"ipc://{tmp_path}/events")
        try:
            sub.wait_for_seq(0)  # the engine's start-up batch
        finally:
            sub.close()
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        a = list(range(1000, 2000))
        assert cached_tokens(client, a) == 0
        assert cached_tokens(client, a) == 999 // 16 * 16  # 62 blocks: 992
        b = a[:500] + list(range(7000, 7500))
        assert cached_tokens(client, b) == 500 // 16 * 16  # 31 blocks: 496
        m = scrape(url)
        assert m["vllm:prefix_cache_hits_total", None] == 992 + 496
        assert m["vllm:kv_cache_usage_perc", None] == 0.0
        labels = info_labels(url)
        assert labels["block_size"] == "16"
        assert labels["kv_cache_groups"] == "0:sliding_window:128,1:full_attention"
        source = httpx.get(url + "/kv_event_sources", timeout=10).json()["0"]
        assert [g["kv_cache_spec_kind"] for g in source["kv_cache_groups"]] == [
            "sliding_window", "full_attention"
        ]  # fmt: skip
        # Every block both prompts computed is announced once per group, with vLLM's group
        # fields; nothing was evicted (a pool of 2048 blocks).
        stored: dict[int, list[int]] = {0: [], 1: []}
        for message in replay(source["replay_connect"], 0):
            for event in message.batch.events:
                if type(event).__name__ == "AllBlocksCleared":  # the start-up announcement
                    assert not stored[0]
                    continue
                assert type(event).__name__ == "BlockStored"
                assert (
                    event.kv_cache_spec_kind
                    == ("sliding_window", "full_attention")[event.group_idx]
                )
                assert event.kv_cache_spec_sliding_window == (128, None)[event.group_idx]
                stored[event.group_idx] += event.block_hashes
        # a: 1000 prompt + 2 output tokens fill 62 blocks; b: 31 shared, 31 more of its own.
        assert len(stored[0]) == len(set(stored[0])) == 62 + 31
        assert sorted(stored[0]) == sorted(stored[1])
