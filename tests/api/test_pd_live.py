"""P/D between two real `mocker serve` replicas (a NixlConnector kv_producer and kv_consumer)
talking over the loopback side channel: the handshake a router makes, the pull seen in the
decode replica's metrics, the prefill replica freeing its blocks, and the fallbacks (a hold
that expired, a prefill replica restarted mid-pull)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.api.test_metrics_endpoint import ALLOWED_LINT, _promtool
from tests.support.parsing import samples, sse_events
from tests.support.servers import AppClient, LoggedProcess, make_app, serve, stderr_of

BLOCK = 16
# The default model shape: bytes of KV per token (32 layers × 8 heads × 128 × 2 × 2 bytes).
KV_BYTES_PER_TOKEN = 131072
ENV = {**os.environ, "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
       "VLLM_NIXL_SIDE_CHANNEL_PORT": "0"}  # fmt: skip
ROUTER_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                 "remote_block_ids": None, "remote_host": None, "remote_port": None}  # fmt: skip


def nixl(role: str, **extra: Any) -> str:
    config: dict[str, Any] = {"kv_connector": "NixlConnector", "kv_role": role}
    if extra:
        config["kv_connector_extra_config"] = extra
    return json.dumps(config)


@contextmanager
def replica(role: str, *args: str, **extra: Any) -> Iterator[tuple[LoggedProcess, str]]:
    with serve("--kv-transfer-config", nixl(role, **extra), "--block-size", str(BLOCK),
               *args, env=ENV) as served:  # fmt: skip
        yield served


def metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    wanted = set(labels.items())
    return sum(v for k, v in samples(text, name).items() if wanted <= set(k))


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll `check` until it holds (bounded: a busy machine gets time, a bug fails)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


PROMPT = "Tell me about rivers. " * 30


def prefill(url: str, body: dict[str, Any], path: str = "/v1/completions") -> dict[str, Any]:
    """The router's first leg: max_tokens 1, no stream, do_remote_decode."""
    leg = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": ROUTER_PARAMS}
    resp = httpx.post(url + path, json=leg, timeout=30)
    assert resp.status_code == 200, resp.text
    params = resp.json()["kv_transfer_params"]
    assert isinstance(params, dict)
    return params


def decode(url: str, body: dict[str, Any], params: dict[str, Any],
           path: str = "/v1/completions") -> dict[str, Any]:  # fmt: skip
    resp = httpx.post(url + path, json={**body, "kv_transfer_params": params}, timeout=60)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_prefill_answers_vllms_params_and_decode_pulls_instead_of_computing() -> None:
    with replica("kv_producer") as (_, p_url), replica("kv_consumer") as (_, d_url):
        body = {"model": "mocker", "prompt": PROMPT, "max_tokens": 8}
        params = prefill(p_url, body)
        assert list(params) == [
            "do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
            "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size",
            "pp_size", "remote_num_tokens", "remote_blocks_expiry_time",
            "remote_registration_generation", "transfer_mode", "remote_prefill_cached_tokens",
        ]  # fmt: skip
        assert params["do_remote_prefill"] is True and params["remote_host"] == "127.0.0.1"
        assert params["remote_port"] > 0 and params["transfer_mode"] == "pull"
        prompt_tokens = params["remote_num_tokens"]
        num_blocks = -(-prompt_tokens // BLOCK)
        assert len(params["remote_block_ids"]) == 1
        assert len(params["remote_block_ids"][0]) == num_blocks
        # Held: the prefill replica's blocks stay in use until the pull.
        assert metric(p_url, "vllm:kv_cache_usage_perc") > 0

        out = decode(d_url, body, params)
        assert out["usage"]["prompt_tokens"] == prompt_tokens
        assert out["usage"]["completion_tokens"] == 8
        assert out["kv_transfer_params"] is None  # vLLM's decode side answers none
        # The decode replica pulled the prompt: no prompt token computed there but the one
        # recomputed to sample, all counted as external KV.
        assert metric(d_url, "vllm:prompt_tokens_by_source_total",
                      source="external_kv_transfer") == prompt_tokens  # fmt: skip
        assert metric(d_url, "vllm:prompt_tokens_by_source_total", source="local_compute") == 0
        assert metric(d_url, "vllm:prompt_tokens_cached_by_source_total",
                      source="p2p") == prompt_tokens  # fmt: skip
        assert metric(d_url, "vllm:nixl_xfer_time_seconds_count") == 1
        nbytes = num_blocks * BLOCK * KV_BYTES_PER_TOKEN
        assert metric(d_url, "vllm:nixl_bytes_transferred_sum") == nbytes
        assert metric(d_url, "vllm:nixl_num_failed_transfers_total") == 0
        # The prefill replica was told: its blocks are free (before the decode answered).
        assert metric(p_url, "vllm:kv_cache_usage_perc") == 0

        # Chat goes the same way.
        chat = {"model": "mocker", "max_tokens": 4,
                "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip
        params = prefill(p_url, chat, "/v1/chat/completions")
        out = decode(d_url, chat, params, "/v1/chat/completions")
        assert out["choices"][0]["finish_reason"] == "length"
        assert metric(d_url, "vllm:nixl_xfer_time_seconds_count") == 2
        until(lambda: metric(d_url, "vllm:kv_cache_usage_perc") == 0)
        assert metric(p_url, "vllm:kv_cache_usage_perc") == 0
        # vLLM's async-load gauge: on the decode side only, every stage empty again.
        stages = samples(httpx.get(d_url + "/metrics", timeout=10).text,
                         "vllm:num_requests_kv_fetch_by_stage")  # fmt: skip
        assert sorted(dict(k)["stage"] for k in stages) == [
            "completed_waiting", "in_progress", "waiting_to_start"]  # fmt: skip
        assert set(stages.values()) == {0.0}
        assert "kv_fetch_by_stage" not in httpx.get(p_url + "/metrics", timeout=10).text

        promtool = _promtool()
        for url in (p_url, d_url):
            text = httpx.get(url + "/metrics", timeout=10).text
            result = subprocess.run([promtool, "check", "metrics"], input=text,
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
            problems = [line for line in (result.stdout + result.stderr).splitlines()
                        if line.strip() and not any(a in line for a in ALLOWED_LINT)]  # fmt: skip
            assert problems == [], problems


def test_expired_hold_frees_the_blocks_and_the_late_pull_recomputes() -> None:
    # A 30 s lease at speedup 100: 0.3 s of wall time.
    with (
        replica("kv_producer", "--speedup-ratio", "100", kv_lease_duration=30) as (_, p_url),
        replica("kv_consumer", "--speedup-ratio", "100") as (_, d_url),
    ):
        body = {"model": "mocker", "prompt": PROMPT, "max_tokens": 4}
        params = prefill(p_url, body)
        until(lambda: metric(p_url, "vllm:nixl_num_kv_expired_reqs_total") == 1)
        assert metric(p_url, "vllm:kv_cache_usage_perc") == 0
        out = decode(d_url, body, params)
        assert out["usage"]["completion_tokens"] == 4
        # The prefill replica no longer held it: the pull failed, the prompt was computed.
        assert metric(d_url, "vllm:nixl_num_failed_transfers_total") == 1
        assert metric(d_url, "vllm:prompt_tokens_by_source_total",
                      source="local_compute") == params["remote_num_tokens"]  # fmt: skip
        assert metric(p_url, "vllm:nixl_num_notifications_after_expiry_total") == 1
        until(lambda: metric(d_url, "vllm:kv_cache_usage_perc") == 0)


def test_prefill_replica_restarted_mid_pull_makes_decode_recompute() -> None:
    # A pull of ~2.5 MB at 0.001 GB/s: ~2.5 s, long enough to restart the prefill replica.
    with replica("kv_consumer", pull_gbps=0.001) as (d_proc, d_url), ThreadPoolExecutor(1) as pool:
        body = {"model": "mocker", "prompt": PROMPT, "max_tokens": 3}
        with replica("kv_producer") as (proc, p_url):
            params = prefill(p_url, body)
            started = time.monotonic()
            pending = pool.submit(httpx.post, d_url + "/v1/completions", timeout=60,
                                  json={**body, "kv_transfer_params": params})  # fmt: skip
            stage = "vllm:num_requests_kv_fetch_by_stage"
            until(lambda: metric(d_url, stage, stage="in_progress") == 1)
            assert metric(d_url, "vllm:num_requests_waiting") == 1  # vLLM counts it waiting
            proc.kill()  # mid-pull: the KV it held is gone
            proc.wait(timeout=10)
        with replica("kv_producer") as (_, p2_url):  # restarted: a new engine id
            resp = pending.result(timeout=60)
            # Its side channel's port (any free one) is usually another: the notification
            # then goes unanswered. If the system gave it the old one, the restarted engine
            # answers instead, "not held" (another engine id): a failed pull all the same,
            # but no failed notification.
            reused = prefill(p2_url, body)["remote_port"] == params["remote_port"]
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 3
        assert time.monotonic() - started < 30  # recomputed, did not hang
        assert metric(d_url, "vllm:nixl_num_failed_transfers_total") == 1
        assert metric(d_url, "vllm:nixl_num_failed_notifications_total") == (0 if reused else 1)
        assert metric(d_url, "vllm:prompt_tokens_by_source_total",
                      source="local_compute") == params["remote_num_tokens"]  # fmt: skip
        until(lambda: metric(d_url, "vllm:kv_cache_usage_perc") == 0)
        # The dead peer's failures were each someone's: none left for the loop to log.
        log = stderr_of(d_proc)
        assert "never retrieved" not in log and "Traceback" not in log, log


def test_generate_route_and_a_refused_decode_request() -> None:
    with replica("kv_producer") as (_, p_url), replica("kv_consumer") as (_, d_url):
        # vLLM's token-in/token-out route carries kv_transfer_params both ways too.
        ids = list(range(100, 180))
        leg = {"token_ids": ids, "sampling_params": {"max_tokens": 1},
               "kv_transfer_params": ROUTER_PARAMS}  # fmt: skip
        resp = httpx.post(p_url + "/inference/v1/generate", json=leg, timeout=30)
        assert resp.status_code == 200, resp.text
        params = resp.json()["kv_transfer_params"]
        assert params["do_remote_prefill"] is True and params["remote_num_tokens"] == 80
        body = {"token_ids": ids, "sampling_params": {"max_tokens": 4},
                "kv_transfer_params": params}  # fmt: skip
        out = httpx.post(d_url + "/inference/v1/generate", json=body, timeout=30).json()
        assert len(out["choices"][0]["token_ids"]) == 4
        assert metric(d_url, "vllm:nixl_xfer_time_seconds_count") == 1
        until(lambda: metric(p_url, "vllm:kv_cache_usage_perc") == 0)

        # A decode request refused at the door (an unknown model): the prefill replica frees
        # what it held at once, not at the lease's end (vLLM's rejected-request notice).
        params = prefill(p_url, {"model": "mocker", "prompt": PROMPT})
        assert metric(p_url, "vllm:kv_cache_usage_perc") > 0
        refused = httpx.post(d_url + "/v1/completions", timeout=30, json={
            "model": "no-such-model", "prompt": PROMPT, "kv_transfer_params": params})  # fmt: skip
        assert refused.status_code == 404
        until(lambda: metric(p_url, "vllm:kv_cache_usage_perc") == 0, timeout=10)
        assert metric(p_url, "vllm:nixl_num_kv_expired_reqs_total") == 0


async def test_a_streamed_prefill_leg_ends_with_the_params(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM puts kv_transfer_params on a streamed completion's or chat's last chunk only
    (its generate stream has no such field)."""
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "0")  # any free port
    async with AppClient(make_app(kv_role="kv_producer")) as c:
        legs: list[tuple[str, dict[str, Any]]] = [
            ("/v1/completions", {"model": "mocker", "prompt": PROMPT}),
            ("/v1/chat/completions",
             {"model": "mocker", "messages": [{"role": "user", "content": PROMPT}]}),
            ("/inference/v1/generate", {"token_ids": list(range(100, 140))}),
        ]  # fmt: skip
        for path, body in legs:
            leg = {**body, "stream": True, "kv_transfer_params": ROUTER_PARAMS}
            if path == "/inference/v1/generate":
                leg["sampling_params"] = {"max_tokens": 2}
            else:
                leg["max_tokens"] = 2
            text = (await c.http.post(path, json=leg)).text
            chunks = [e for e in sse_events(text) if e != "[DONE]"]
            with_params = [e for e in chunks if "kv_transfer_params" in e]
            if path == "/inference/v1/generate":
                assert with_params == []  # vLLM's generate stream has no such field
                continue
            assert with_params == [chunks[-1]], path
            params = with_params[0]["kv_transfer_params"]
            assert params["do_remote_prefill"] is True and params["transfer_mode"] == "pull"
        # Nothing stays held beyond the three holds (released by their lease, unpulled).
        (engine,) = c.state.engines
        assert engine.core.holds is not None and len(engine.core.holds) == 3


async def test_bad_kv_transfer_params_are_a_400() -> None:
    async with AppClient(make_app(kv_role="kv_consumer")) as c:
        for params, message in [
            ({"do_remote_prefill": True}, "needs remote_block_ids"),
            ({"do_remote_prefill": "yes"}, "must be true or false"),
            ({**ROUTER_PARAMS, "do_remote_prefill": True}, "both true"),
            ([1, 2], "valid dictionary"),
            ({"do_remote_prefill": True, "remote_block_ids": [], "remote_engine_id": "x",
              "remote_request_id": "r", "remote_host": "h", "remote_port": 1}, "non-empty"),
            ({"do_remote_prefill": True, "remote_block_ids": [[1]], "remote_engine_id": "x",
              "remote_request_id": "r", "remote_host": "h", "remote_port": 0}, "port number"),
        ]:  # fmt: skip
            resp = await c.http.post("/v1/completions", json={
                "model": "mocker", "prompt": "hi", "kv_transfer_params": params})  # fmt: skip
            assert resp.status_code == 400, (params, resp.text)
            error = resp.json()["error"]
            assert message in error["message"] and error["param"] == "kv_transfer_params"
        # Several prompts cannot share one prefill's blocks, nor ask for one set of params.
        two = {"model": "mocker", "prompt": ["a", "b"], "kv_transfer_params": ROUTER_PARAMS}
        resp = await c.http.post("/v1/completions", json=two)
        assert resp.status_code == 400 and "one prompt" in resp.json()["error"]["message"]
        params = {"do_remote_prefill": True, "remote_block_ids": [[1]], "remote_engine_id": "x",
                  "remote_request_id": "r", "remote_host": "h", "remote_port": 1}  # fmt: skip
        resp = await c.http.post("/v1/completions", json={
            "model": "mocker", "prompt": ["a", "b"], "kv_transfer_params": params})  # fmt: skip
        assert resp.status_code == 400 and "one prompt" in resp.json()["error"]["message"]
