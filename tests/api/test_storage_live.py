"""The fs tier through `mocker serve --kv-transfer-config` with the `openai` client: a prompt
evicted from the CPU tier and the device comes back from disk, in `cached_tokens` and
/metrics."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai

from tests.support.kv_consumer import Subscriber, replay
from tests.support.servers import scrape, serve

BLOCK_BYTES = 16 * 131072  # Llama-3-8B, 16-token blocks
PROMPT = 256  # 16 blocks; 15 loadable (the lookup stops one token short)
CONFIG = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 16 * BLOCK_BYTES,  # one prompt's blocks
        "secondary_tiers": [{"type": "fs", "root_dir": "/tmp/kv",
                             "capacity_bytes": 256 * BLOCK_BYTES}],
    },
}  # fmt: skip


def test_a_prompt_comes_back_from_disk() -> None:
    args = ("--kv-transfer-config", json.dumps(CONFIG), "--speedup-ratio", "20",
            "--load-timeout", "1000", "--num-gpu-blocks-override", "64",
            "--max-model-len", "1024")  # fmt: skip
    with serve(*args) as (_, url):
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)

        def cached(k: int) -> int:
            prompt = [1000 * (k + 1) + j for j in range(PROMPT)]
            c = client.completions.create(
                model="mocker", prompt=prompt, max_tokens=1, extra_body={"ignore_eos": True}
            )
            assert c.usage is not None and c.usage.prompt_tokens_details is not None
            return c.usage.prompt_tokens_details.cached_tokens or 0

        assert cached(0) == 0 and cached(1) == 0  # B's blocks push A's out of the CPU tier
        assert httpx.post(url + "/reset_prefix_cache", timeout=10).status_code == 200
        assert cached(0) == 15 * 16  # from fs, through the CPU tier
        m = scrape(url, "source", "tier")
        # vLLM 0.34's forms: the fs tier is "disk", and "1:fs" in the tiering metrics.
        assert m["vllm:prompt_tokens_cached_by_source_total", "disk"] == 240
        assert m["vllm:kv_offload_tiering_read_bytes_total", "1:fs"] == 15 * BLOCK_BYTES
        assert m["vllm:kv_offload_tiering_write_bytes_total", "1:fs"] >= 32 * BLOCK_BYTES
        assert m["vllm:kv_offload_tiering_chunk_hits_total", "1:fs"] >= 15
        assert m["vllm:kv_offload_tiering_chunk_queries_total", "0:primary"] >= 15
        assert m["vllm:kv_offload_tiering_promotion_job_failures_total", "1:fs"] == 0
        assert m["vllm:external_prefix_cache_hits_total", None] == 240


def test_a_vllm_034_tiering_config_serves_verbatim(tmp_path: Path) -> None:
    # vLLM 0.34's own form: fs without a size (it fills its disk), obj with its store_config,
    # 0.34's keys; a working set past the device and the CPU tier, sent twice, comes back
    # from fs, in the metrics (vLLM 0.34's names and tier labels) and in STORAGE events.
    config = {
        "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 16 * BLOCK_BYTES,
            "blocks_per_chunk": 1, "tier_poll_interval_s": 0.001, "sync_load_budget_bytes": 0,
            "secondary_tiers": [
                {"type": "fs", "root_dir": str(tmp_path / "kv"), "n_read_threads": 16,
                 "n_write_threads": 16, "enable_kv_events": True, "locality": "LOCAL"},
                {"type": "obj", "store_config": {"bucket": "kv", "endpoint_override": "http://s3"},
                 "prefix": "llama", "io_threads": 4},
            ],
        },
    }  # fmt: skip
    events = {"enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/events",
              "replay_endpoint": "tcp://127.0.0.1:*"}  # fmt: skip
    args = ("--kv-transfer-config", json.dumps(config), "--kv-events-config", json.dumps(events),
            "--speedup-ratio", "20", "--load-timeout", "1000", "--num-gpu-blocks-override", "64",
            "--max-model-len", "1024")  # fmt: skip
    with serve(*args) as (_, url):
        source = httpx.get(url + "/kv_event_sources", timeout=10).json()["0"]
        subscriber = Subscriber(source["connect"])  # (the publisher waits for one)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)
        cached: list[int] = []
        lookups: list[dict[str, tuple[float, float]]] = []
        for i in range(12):  # 6 prompts, 96 blocks: past the device's 64 and the CPU's 16
            prompt = [1000 * (i % 6 + 1) + j for j in range(PROMPT)]
            c = client.completions.create(model="mocker", max_tokens=1, prompt=prompt,
                                          extra_body={"ignore_eos": True})  # fmt: skip
            assert c.usage is not None and c.usage.prompt_tokens_details is not None
            cached.append(c.usage.prompt_tokens_details.cached_tokens or 0)
            if i in (5, 6):
                m = scrape(url, "source", "tier")
                lookups.append({tier: (m["vllm:kv_offload_tiering_chunk_queries_total", tier],
                                       m["vllm:kv_offload_tiering_chunk_hits_total", tier])
                                for tier in ("0:primary", "1:fs", "2:obj")})  # fmt: skip
        assert cached[:6] == [0] * 6 and cached[6] == 15 * 16  # the first prompt, from fs
        # vLLM 0.34's lookups, chunk by chunk until one no tier holds, once per request: a
        # new prompt walks its first chunk through every tier; the first prompt again finds
        # its 15 loadable chunks missing from the CPU tier and present in fs.
        assert lookups[0] == {"0:primary": (6, 0), "1:fs": (6, 0), "2:obj": (6, 0)}
        assert lookups[1] == {"0:primary": (21, 0), "1:fs": (21, 15), "2:obj": (6, 0)}
        m = scrape(url, "source", "tier")
        assert m["vllm:prompt_tokens_cached_by_source_total", "disk"] >= 240
        subscriber.close()
        storage = [e for b in replay(source["replay_connect"], 0) for e in b.batch.events
                   if type(e).__name__ == "BlockStored" and e.medium == "STORAGE"]  # fmt: skip
        assert storage and all(e.group_idx == 0 and e.token_ids == [] for e in storage)
