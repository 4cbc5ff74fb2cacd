"""LMCache's metrics through its internal API server, beside a live `mocker serve`: a real
uvicorn, the `openai` client, the scrape a dashboard makes."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import openai
import pytest

from mocker.tiers import lmcache_stats
from tests.support.servers import ServerThread, make_app

LMCACHE: dict[str, Any] = {
    "block_size": 16, "num_gpu_blocks": 64, "max_model_len": 1024, "num_cpu_blocks": 512,
    "offload_policy": "write-through", "offload_backend": "lmcache", "sync_loads": True,
    "chunk_blocks": 16, "min_load_blocks": 16, "lmcache_api": ("127.0.0.1", 0),
}  # fmt: skip


def _sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and 'role="worker"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def test_lmcaches_worker_and_scheduler_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmcache_stats, "LMCACHE_FLUSH_S", 0.05)  # (LMCache's: 10 s)
    app = make_app(None, **LMCACHE)
    with ServerThread(app) as srv:
        api = srv.app.state.mocker.lmcache_api
        scheduler, worker = (f"http://127.0.0.1:{port}/metrics" for port in api.ports)
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        client.completions.create(model="mocker", prompt=list(range(1000, 1600)), max_tokens=1)
        client.close()
        deadline = time.monotonic() + 10
        while True:  # until a turn of the stats logger after the store landed
            text = httpx.get(worker, timeout=10).text
            if "lmcache:time_to_store_count" in text:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
        sched_text = httpx.get(scheduler, timeout=10).text
        # A vLLM /metrics of the same server has none of vLLM's offload families.
        assert "vllm:kv_offload" not in httpx.get(srv.url + "/metrics", timeout=10).text
    labels = '{model_name="mocker",role="worker",served_model_name="mocker",worker_id="0"}'
    assert f"lmcache:num_lookup_requests_total{labels} 1.0" in text
    # 600 tokens: two whole chunks of 256 looked up and stored, none found.
    assert _sample(text, "lmcache:num_lookup_tokens_total") == 512
    assert _sample(text, "lmcache:num_lookup_hits_total") == 0
    assert _sample(text, "lmcache:num_store_requests_total") == 1
    assert _sample(text, "lmcache:num_stored_tokens_total") == 512
    assert _sample(text, "lmcache:num_prompt_tokens_total") == 512
    assert _sample(text, "lmcache:local_cache_usage") == 32 * 16 * 131072  # 32 blocks' bytes
    assert _sample(text, "lmcache:lmcache_is_healthy") == 1.0
    # The scheduler's process: the families, no samples but its health at 0.
    assert "# TYPE lmcache:num_lookup_requests_total counter" in sched_text
    assert "lmcache:num_lookup_requests_total{" not in sched_text
    assert 'lmcache:lmcache_is_healthy{model_name="mocker",role="scheduler"' in sched_text
    for port in api.ports:  # closed with the server
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
