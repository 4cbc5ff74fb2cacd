"""vLLM flags that mean nothing here: accepted, each warned about once."""

from __future__ import annotations

from mocker.settings import IGNORED_VLLM_FLAGS, resolve, server_settings_from
from tests.support.settings import ALL, parse_flags


def test_ignored_vllm_flags_warn_once_each() -> None:
    ns = parse_flags(["--enforce-eager", "--trust-remote-code", "--dtype", "bfloat16"])
    _, warnings = resolve(ns, ALL, environ={})
    assert warnings == [
        "ignoring --dtype: no meaning for a mock engine",
        "ignoring --enforce-eager: no meaning for a mock engine",
        "ignoring --trust-remote-code: no meaning for a mock engine",
    ]
    # Read (they size the KV cache and time the passes): not in the ignored list.
    for flag in ("tensor_parallel_size", "pipeline_parallel_size", "gpu_memory_utilization",
                 "quantization", "kv_cache_dtype", "enable_expert_parallel"):  # fmt: skip
        assert flag not in IGNORED_VLLM_FLAGS


def test_deployment_vllm_flags_are_accepted_and_data_parallel_is_read() -> None:
    ns = parse_flags(["--kv-offloading-backend", "native", "--data-parallel-size", "2",
                      "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'])  # fmt: skip
    values, warnings = resolve(ns, ALL, environ={})
    assert warnings == []  # (--kv-offloading-backend is read: mocker.settings.offload)
    assert values["kv_offloading_backend"] == "native"
    assert server_settings_from(values).data_parallel_size == 2
    # Read, not ignored: mocker.settings.kv_transfer parses it (tests/settings/test_kv_transfer.py).
    assert values["kv_transfer_config"] == '{"kv_connector": "NixlConnector"}'


def test_scale_out_flag_is_accepted_and_hash_algo_is_read() -> None:
    """--enable-scale-out gates vLLM's render and generate routes; mocker always serves them.
    --prefix-caching-hash-algo is read: it picks the block hash."""
    ns = parse_flags(["--enable-scale-out", "--prefix-caching-hash-algo", "sha256_cbor"])
    values, warnings = resolve(ns, ALL, environ={})
    assert warnings == ["ignoring --enable-scale-out: no meaning for a mock engine"]
    assert values["prefix_caching_hash_algo"] == "sha256_cbor"


# `vllm serve` flags from deployment manifests and launch scripts (llm-d, production-stack,
# benchmark recipes): each must be accepted, so that the same command line starts the mock.
MANIFEST_FLAGS = [
    ["--async-scheduling"], ["--no-async-scheduling"], ["--max-cudagraph-capture-size", "2048"],
    ["-O3"], ["--compilation-config", '{"level": 3}'],
    ["--data-parallel-size-local", "2"], ["--data-parallel-address", "10.0.0.1"],
    ["--data-parallel-rpc-port", "5555"], ["--data-parallel-start-rank", "0"], ["--headless"],
    ["--speculative-config", '{"method": "ngram"}'], ["--limit-mm-per-prompt", '{"image": 0}'],
    ["--enable-sleep-mode"], ["--disable-fastapi-docs"], ["--enable-request-id-headers"],
    ["--otlp-traces-endpoint", "http://x:4317"], ["--allowed-origins", '["*"]'],
    ["--max-num-partial-prefills", "1"],
    ["--trust-remote-code"], ["--enforce-eager"],
]  # fmt: skip


def test_manifest_flags_are_accepted_and_warned_about() -> None:
    for argv in MANIFEST_FLAGS:
        values, warnings = resolve(parse_flags(argv), ALL, environ={})
        assert len(warnings) == 1 and warnings[0].startswith("ignoring --"), argv
        server_settings_from(values)  # and nothing else changes


def test_the_vllm_flags_mocker_models_are_read() -> None:
    """vLLM flags whose effect the mock models: read without a warning, each changing what
    the mock does."""
    argv = ["--stream-interval", "4", "--enable-force-include-usage", "--root-path", "/p",
            "--scheduling-policy", "priority", "--long-prefill-token-threshold", "256",
            "--kv-cache-memory-bytes", str(2**33), "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--max-logprobs", "5"]  # fmt: skip
    values, warnings = resolve(parse_flags(argv), ALL, environ={})
    assert warnings == []
    server = server_settings_from(values)
    assert (server.stream_interval, server.force_include_usage, server.root_path) == (4, True, "/p")
    assert server.max_logprobs == 5
    assert (values["scheduling_policy"], values["long_prefill_token_threshold"]) == (
        "priority",
        256,
    )
    assert values["kv_cache_memory_bytes"] == 2**33
    assert (server.enable_auto_tool_choice, server.tool_call_parser) == (True, "hermes")
