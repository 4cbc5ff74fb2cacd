"""P/D behind a real router: vllm-router 0.1.17 `--vllm-pd-disaggregation` in front of one
prefill and one decode `mocker serve` replica (NixlConnector kv_producer / kv_consumer),
50 requests. Every request must succeed, the decode replica must pull every prompt it does
not hold already (no prompt token computed there), the prefill replica must end with every
block freed, no replica may answer a 4xx/5xx or log a traceback, and the router must never
warn of a missing kv_transfer_params."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.api.test_pd_live import metric
from tests.api.test_routers import (
    ACCESS,
    VLLM_ROUTER,
    _send,
    free_port,
    logged_replica,
    start_router,
    workload,
)
from tests.support.tool_venv import tool_venv

REQUESTS = 50
CONCURRENCY = 8


def _nixl(role: str) -> str:
    return json.dumps({"kv_connector": "NixlConnector", "kv_role": role})


def _argv(bin_dir: Path, port: int, prefill: str, decode: str) -> list[str]:
    return [str(bin_dir / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
            "--vllm-pd-disaggregation", "--prefill", prefill, "--decode", decode,
            "--policy", "round_robin", "--worker-startup-check-interval", "1",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]  # fmt: skip


def test_vllm_router_pd_disaggregation(monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tool_venv("vllm-router", VLLM_ROUTER)
    # The prefill replica's side channel on loopback, on a port of the system's choosing
    # (kv_transfer_params name it).
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "0")
    common = ("--speedup-ratio", "50")
    with (
        logged_replica(*common, "--kv-transfer-config", _nixl("kv_producer")) as prefill,
        logged_replica(*common, "--kv-transfer-config", _nixl("kv_consumer")) as decode,
        start_router(
            lambda port: _argv(bin_dir, port, prefill.url, decode.url), workers=0
        ) as router,
        httpx.Client(timeout=httpx.Timeout(120, connect=10)) as client,
        ThreadPoolExecutor(CONCURRENCY) as pool,
    ):
        bodies = [body for _, body in workload()[:REQUESTS]]
        jobs = [pool.submit(_send, client, router.url, body) for body in bodies]
        failures, prompt_tokens = [], 0
        for job in jobs:
            error, answer = job.result(timeout=300)
            if error:
                failures.append(error)
            else:
                prompt_tokens += answer["usage"]["prompt_tokens"]
        log = router.log()
        assert failures == [], failures[:5]
        assert "No kv_transfer_params" not in log, log[-2000:]

        by_source = "vllm:prompt_tokens_by_source_total"
        pulled = metric(decode.url, by_source, source="external_kv_transfer")
        local_hits = metric(decode.url, by_source, source="local_cache_hit")
        # The decode replica computed no prompt token: each came over the link or was cached
        # there by an earlier pull of the same document.
        assert metric(decode.url, by_source, source="local_compute") == 0
        assert pulled + local_hits == prompt_tokens and pulled > 0
        assert metric(decode.url, "vllm:nixl_xfer_time_seconds_count") == REQUESTS
        assert metric(decode.url, "vllm:nixl_num_failed_transfers_total") == 0
        # The prefill replica computed every prompt and then freed every block it held.
        assert metric(prefill.url, "vllm:prompt_tokens_total") == prompt_tokens
        assert metric(prefill.url, "vllm:kv_cache_usage_perc") == 0
        assert metric(prefill.url, "vllm:nixl_num_kv_expired_reqs_total") == 0

        for replica in (prefill, decode):
            text = replica.log()
            assert "Traceback" not in text, text[-3000:]
            bad = [m[0] for m in ACCESS.finditer(text) if int(m["status"]) >= 400]
            assert bad == [], bad[:5]
            served = [m for m in ACCESS.finditer(text) if m["method"] == "POST"]
            assert len(served) == REQUESTS
