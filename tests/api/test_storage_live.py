"""The fs tier through `mocker serve --kv-transfer-config` with the `openai` client: a prompt
evicted from the CPU tier and the device comes back from disk, in `cached_tokens` and
/metrics."""

from __future__ import annotations

import json

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import serve

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


def scrape(url: str) -> dict[tuple[str, str | None], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, s.labels.get("source") or s.labels.get("tier")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


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
        m = scrape(url)
        assert m["vllm:prompt_tokens_cached_by_source_total", "fs"] == 240
        assert m["vllm:kv_offload_tiering_read_bytes_total", "fs"] == 15 * BLOCK_BYTES
        assert m["vllm:kv_offload_tiering_write_bytes_total", "fs"] >= 32 * BLOCK_BYTES
        assert m["vllm:kv_offload_tiering_block_hits_total", "fs"] >= 15
        assert m["vllm:kv_offload_tiering_promotion_job_failures_total", "fs"] == 0
        assert m["vllm:external_prefix_cache_hits_total", None] == 240
