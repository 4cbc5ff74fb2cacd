"""/metrics after a known workload: vLLM's names, labels and buckets, true values, promtool."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from mocker.metrics.histogram import (
    ITERATION_TOKEN_BUCKETS,
    ITL_BUCKETS,
    PREEMPTION_BUCKETS,
    REQUEST_TIME_BUCKETS,
    TRANSFER_SIZE_BUCKETS,
    TTFT_BUCKETS,
    one_two_five_buckets,
)
from tests.support.parsing import sse_events
from tests.support.servers import AppClient, make_app

EXPECTED_BUCKETS: dict[str, tuple[float, ...]] = {
    "vllm:time_to_first_token_seconds": TTFT_BUCKETS,
    "vllm:inter_token_latency_seconds": ITL_BUCKETS,
    "vllm:request_time_per_output_token_seconds": ITL_BUCKETS,
    **{
        f"vllm:{name}_seconds": REQUEST_TIME_BUCKETS
        for name in (
            "e2e_request_latency",
            "request_queue_time",
            "request_inference_time",
            "request_prefill_time",
            "request_decode_time",
        )
    },
    "vllm:request_prompt_tokens": tuple(one_two_five_buckets(512)),
    "vllm:request_generation_tokens": tuple(one_two_five_buckets(512)),
    "vllm:request_params_max_tokens": tuple(one_two_five_buckets(512)),
    "vllm:request_max_num_generation_tokens": tuple(one_two_five_buckets(512)),
    "vllm:request_prefill_kv_computed_tokens": tuple(one_two_five_buckets(512)),
    "vllm:request_params_n": (1, 2, 5, 10, 20),
    "vllm:iteration_tokens_total": ITERATION_TOKEN_BUCKETS,
    "vllm:request_num_preemptions": PREEMPTION_BUCKETS,
}
COUNTERS = (
    "prefix_cache_queries", "prefix_cache_hits", "external_prefix_cache_queries",
    "external_prefix_cache_hits", "num_preemptions", "prompt_tokens", "generation_tokens",
    "prompt_tokens_cached", "prompt_tokens_by_source", "prompt_tokens_cached_by_source",
    "request_success",
)  # fmt: skip
GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")


def _scrape(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict[str, Metric], name: str, **labels: str) -> float:
    """One sample's value; counters by their declared name (the sample has `_total`)."""
    wanted = (name, name + "_total")
    for family in families.values():
        for s in family.samples:
            if s.name in wanted and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name}{labels}")


async def _workload(c: AppClient) -> list[dict[str, Any]]:
    shared = list(range(500, 564))  # 4 full blocks every request shares

    async def one(i: int) -> dict[str, Any]:
        r = await c.http.post(
            "/v1/completions",
            json={"prompt": [*shared, *range(1000 + 16 * i, 1016 + 16 * i)], "max_tokens": 120},
        )
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    first = await one(99)  # warms the shared prefix
    return [first, *await asyncio.gather(*(one(i) for i in range(8)))]


async def test_metrics_are_vllms_and_true_after_hits_and_preemptions() -> None:
    # 48 blocks of 16 tokens, 8 requests peaking at 13 blocks each: preemption is certain.
    app = make_app(block_size=16, num_gpu_blocks=48, max_num_seqs=8, max_model_len=512)
    async with AppClient(app) as c:
        responses = await _workload(c)
        text = (await c.http.get("/metrics")).text
    fam = _scrape(text)
    usage = [r["usage"] for r in responses]
    completion = sum(u["completion_tokens"] for u in usage)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usage)
    assert cached > 0, "the workload must really hit the prefix cache"
    assert _value(fam, "vllm:num_preemptions") > 0, "the workload must really preempt"
    assert _value(fam, "vllm:generation_tokens") == completion == 9 * 120
    assert _value(fam, "vllm:prefix_cache_hits") == cached
    assert _value(fam, "vllm:prompt_tokens_cached") == cached
    assert _value(fam, "vllm:prompt_tokens") == sum(u["prompt_tokens"] for u in usage)
    assert _value(fam, "vllm:prefix_cache_queries") == sum(u["prompt_tokens"] for u in usage)
    assert _value(fam, "vllm:prompt_tokens_by_source", source="local_cache_hit") == cached
    assert _value(fam, "vllm:prompt_tokens_cached_by_source", source="device") == cached
    assert _value(fam, "vllm:request_success", finished_reason="length") == 9
    for gauge in GAUGES:  # idle again: nothing running, waiting or referenced
        assert _value(fam, "vllm:" + gauge) == 0
    assert _value(fam, "vllm:time_to_first_token_seconds_count") == 9
    assert _value(fam, "vllm:request_num_preemptions_count") >= 1
    # inference-perf's three: per request, its generated tokens (n = 1), its n, and the
    # prompt tokens it computed rather than found cached
    assert _value(fam, "vllm:request_max_num_generation_tokens_sum") == completion
    assert _value(fam, "vllm:request_max_num_generation_tokens_count") == 9
    assert _value(fam, "vllm:request_params_n_sum") == _value(fam, "vllm:request_params_n_count")
    assert _value(fam, "vllm:request_params_n_count") == 9
    prompt = sum(u["prompt_tokens"] for u in usage)
    assert _value(fam, "vllm:request_prefill_kv_computed_tokens_sum") == prompt - cached

    for name in COUNTERS:
        assert fam["vllm:" + name].type == "counter"
    for name in GAUGES:
        assert fam["vllm:" + name].type == "gauge"
    # (No KV connector: none of vLLM's OffloadingConnector families.)
    assert not [name for name in fam if name.startswith("vllm:kv_offload")]
    for name, bounds in EXPECTED_BUCKETS.items():
        assert fam[name].type == "histogram", name
        les = [s.labels["le"] for s in fam[name].samples if s.name == name + "_bucket"]
        assert [float(le) for le in les] == [*map(float, bounds), float("inf")], name
    # (vllm:admission_rejections is the API server's, as vLLM's: the model, no engine.)
    server = {"vllm:cache_config_info", "vllm:admission_rejections"}
    for family in fam.values():
        if family.name.startswith("vllm:") and family.name not in server:
            for s in family.samples:
                assert s.labels.get("model_name") == "mocker" and s.labels.get("engine") == "0"
    assert {s.labels["reason"] for s in fam["vllm:admission_rejections"].samples} == {
        "max_num_queued_reqs", "max_num_queued_tokens"
    }  # fmt: skip
    (info,) = fam["vllm:cache_config_info"].samples
    assert info.value == 1 and info.labels["block_size"] == "16"
    assert info.labels["num_gpu_blocks"] == "48" and info.labels["engine"] == "0"
    assert info.labels["enable_prefix_caching"] == "True"


async def test_legacy_names_are_opt_in() -> None:
    async with AppClient(make_app()) as c:
        assert "vllm:gpu_cache_usage_perc" not in (await c.http.get("/metrics")).text
    from tests.support.servers import settings

    async with AppClient(make_app(settings(legacy_metric_names=True))) as c:
        text = (await c.http.get("/metrics")).text
    for name in (
        "vllm:gpu_cache_usage_perc",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:num_requests_swapped",
    ):
        assert name in text  # fmt: skip


def _promtool() -> str:
    """promtool, installing Debian's prometheus package when apt can; else a loud skip."""
    found = shutil.which("promtool")
    if found:
        return found
    if shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "prometheus"], env=env, check=False, timeout=900
        )
        found = shutil.which("promtool")
        if found:
            return found
    pytest.skip("SKIPPED LOUDLY: promtool is not installed and apt-get could not install it")


ALLOWED_LINT = (
    "metric names should not contain ':'",
    'vllm:iteration_tokens_total non-counter metrics should not have "_total" suffix',
)


async def test_promtool_finds_nothing_beyond_vllms_two_naming_rules() -> None:
    promtool = _promtool()
    app = make_app(block_size=16, num_gpu_blocks=48, max_num_seqs=8, max_model_len=512)
    async with AppClient(app) as c:
        await _workload(c)
        text = (await c.http.get("/metrics")).text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if line.strip() and not any(allowed in line for allowed in ALLOWED_LINT)
    ]
    assert problems == [], problems
    assert any("should not contain ':'" in line for line in result.stderr.splitlines())


async def test_identities_hold_with_stop_strings_and_batched_streams() -> None:
    async with AppClient(make_app()) as c:
        words = (await c.http.post(
            "/v1/completions", json={"prompt": "s", "max_tokens": 6},
            headers={"X-Request-Id": "w-0"},  # the id of choice 0 below: same tokens
        )).json()["choices"][0]["text"].split(" ")[1:]  # fmt: skip
        total = 6
        for stream in (False, True):
            usage = {"stream_options": {"include_usage": True}} if stream else {}
            r = await c.http.post(
                "/v1/completions",
                json={"prompt": ["s", "other prompt"], "max_tokens": 12, "stream": stream,
                      "stop": [" " + words[2]], **usage},
                headers={"X-Request-Id": "w"},
            )  # fmt: skip
            body = r.json() if not stream else [e for e in sse_events(r.text) if e != "[DONE]"][-1]
            total += body["usage"]["completion_tokens"]
        fam = _scrape((await c.http.get("/metrics")).text)
    assert _value(fam, "vllm:generation_tokens") == total
    assert _value(fam, "vllm:request_success", finished_reason="stop") >= 1


async def test_a_cpu_tier_brings_vllms_offload_families() -> None:
    # vLLM's OffloadingConnector families, with their types and buckets, from the start.
    app = make_app(block_size=16, num_gpu_blocks=48, max_model_len=512, num_cpu_blocks=64,
                   offload_policy="write-through")  # fmt: skip
    async with AppClient(app) as c:
        fam = _scrape((await c.http.get("/metrics")).text)
    for name in ("store_bytes", "load_bytes", "store_time", "load_time"):
        assert fam["vllm:kv_offload_" + name].type == "counter"
    assert fam["vllm:kv_offload_cpu_cache_usage_perc"].type == "gauge"
    for name in ("vllm:kv_offload_store_size", "vllm:kv_offload_load_size"):
        les = [s.labels["le"] for s in fam[name].samples if s.name == name + "_bucket"]
        assert [float(le) for le in les] == [*map(float, TRANSFER_SIZE_BUCKETS), float("inf")]
