"""Engine settings: host-tier flags and the start-up checks of their combinations."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from mocker.config import ConfigError, EngineConfig
from mocker.model_shape import MODEL_PRESETS
from mocker.settings import engine_config_from, resolve
from tests.support.settings import ALL, parse_flags, serve_config


def test_host_tier_flags() -> None:
    small = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096", "--timing-model",
             "polynomial"]  # fmt: skip
    values, _ = resolve(parse_flags([*small, "--kv-offloading-size", "4"]), ALL, environ={})
    config = engine_config_from(values)
    # 4 GiB of 2 MiB blocks (block_size 16 × Llama-3-8B's 128 KiB per token), stored
    # write-through: vLLM 0.34 turns --kv-offloading-size into an OffloadingConnector.
    assert (
        config.offload.num_cpu_blocks == 2048 and config.offload.offload_policy == "write-through"
    )
    assert config.offload.kv_offloading_size == 4.0  # reported in vllm:cache_config_info
    for flags, policy in (
        (["--num-host-blocks", "8"], "evict"),  # (KVBM's, mocker's default)
        (["--kv-offloading-size", "4", "--offload-policy", "evict"], "evict"),
    ):
        values, _ = resolve(parse_flags([*small, *flags]), ALL, environ={})
        assert engine_config_from(values).offload.offload_policy == policy
    lmcache = [*small, "--kv-offloading-size", "4", "--kv-offloading-backend", "lmcache"]
    values, _ = resolve(parse_flags(lmcache), ALL, environ={})
    with pytest.raises(ConfigError, match=r"lmcache .* is not modelled"):
        engine_config_from(values)
    # A hybrid model's CPU tier from the flag: write-through whole chunks, as vLLM's.
    hybrid = ["--model-shape", "qwen3-next-80b-a3b", "--num-gpu-blocks-override", "200",
              "--max-model-len", "8192", "--timing-model", "polynomial",
              "--kv-offloading-size", "4"]  # fmt: skip
    values, _ = resolve(parse_flags(hybrid), ALL, environ={})
    assert engine_config_from(values).offload.offload_policy == "write-through"
    argv = [*small, "--num-host-blocks", "100", "--offload-policy", "write-through",
            "--host-d2h-bandwidth-gbps", "8", "--host-h2d-bandwidth-gbps", "0",
            "--offload-batch-size", "4", "--transfer-latency-ms", "0.5",
            "--min-load-blocks", "2", "--load-timeout", "3"]  # fmt: skip
    values, _ = resolve(parse_flags(argv), ALL, environ={})
    config = engine_config_from(values)
    assert (config.offload.num_cpu_blocks, config.offload.offload_policy) == (100, "write-through")
    assert (config.offload.cpu_write_gbps, config.offload.cpu_read_gbps) == (8.0, 0.0)
    assert (config.offload.offload_batch_size, config.offload.transfer_latency_ms) == (4, 0.5)
    assert (config.offload.min_load_blocks, config.offload.load_timeout) == (2, 3.0)
    values, _ = resolve(parse_flags(small), ALL, environ={"MOCKER_NUM_HOST_BLOCKS": "7"})
    assert engine_config_from(values).offload.num_cpu_blocks == 7
    assert serve_config(*small).offload.num_cpu_blocks == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-host-blocks", "8", "--kv-offloading-size", "1"], "not both"),
        (["--kv-offloading-size", "-1"], "kv_offloading_size"),
        (["--kv-offloading-size", "0.0001"], "holds no block"),
        (["--num-host-blocks", "-3"], "num_host_blocks"),
        (["--num-host-blocks", "8", "--no-enable-prefix-caching"], "needs prefix caching"),
        (["--num-host-blocks", "8", "--min-load-blocks", "0"], "min_load_blocks"),
    ],
)
def test_host_tier_mistakes_fail_at_start_up(argv: list[str], message: str) -> None:
    small = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096", "--timing-model",
             "polynomial"]  # fmt: skip
    values, _ = resolve(parse_flags([*small, *argv]), ALL, environ={})
    with pytest.raises(ConfigError, match=message):
        engine_config_from(values)


def test_polynomial_flags_give_the_config_defaults() -> None:
    """--timing-model polynomial is Dynamo's engine: EngineConfig's own defaults."""
    assert serve_config("--timing-model", "polynomial") == EngineConfig()


def _config(*argv: str) -> EngineConfig:
    """The engine of these flags under the polynomial (these tests are about the KV cache's
    shape and tiers; tests/settings/test_deployment.py has the GPU's)."""
    return serve_config("--timing-model", "polynomial", *argv)


def test_model_shape_preset_inline_json_and_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="mocker.settings.engine"):
        qwen = _config("--model-shape", "qwen3-next-80b-a3b", "--max-model-len", "8192")
    assert qwen.block_size == 544 and qwen.model == MODEL_PRESETS["qwen3-next-80b-a3b"]
    assert "Setting attention block size to 544 tokens" in caplog.text
    custom = {"num_layers": 4, "num_kv_heads": 2, "head_dim": 64,
              "layer_types": ["sliding_attention", "full_attention"] * 2,
              "sliding_window": 64}  # fmt: skip
    inline = _config("--model-shape", json.dumps(custom), "--max-model-len", "4096")
    assert [g.kind.value for g in inline.layout.groups] == ["sliding_window", "full_attention"]
    path = tmp_path / "shape.yaml"
    path.write_text(yaml.safe_dump(custom))
    assert _config("--model-shape", str(path), "--max-model-len", "4096").model == inline.model


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-shape", "llama-9"], "one of the presets llama-3-8b"),
        (["--model-shape", "{not json"], "not valid JSON"),
        (["--model-shape", "/nonexistent/shape.json"], "cannot read"),
        (["--model-shape", '{"num_layers": 2, "heads": 3}'], "unknown model shape key"),
        (["--model-shape", '{"num_layers": 1, "layer_types": ["mamba"], "mamba2": {'
          '"intermediate": 64, "n_groups": 1, "d_state": 8, "d_conv": 1, "n_heads": 2, '
          '"head_dim": 8}}'], "mamba2.d_conv"),
        (["--model-shape", "gpt-oss-20b", "--max-model-len", "4096",
          "--eviction-policy", "lineage"], "lineage"),
        # Full attention ceil(131072 / 16) = 8192 blocks alone exceed 1000.
        (["--model-shape", "gpt-oss-20b", "--num-gpu-blocks-override", "1000"],
         "across the model's 2 KV cache groups"),
    ],
)  # fmt: skip
def test_model_shape_mistakes_name_the_setting(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(*argv)


def test_model_shape_file_not_text_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="cannot read"):
        _config("--model-shape", str(path))


def test_kv_offloading_size_counts_a_hybrid_block() -> None:
    # gpt-oss-20b: one device block is 12 layers × 16 tokens × 2 × 8 × 64 × 2 = 393,216 bytes.
    config = _config("--model-shape", "gpt-oss-20b", "--max-model-len", "4096",
                     "--offload-policy", "write-through", "--kv-offloading-size", "1")  # fmt: skip
    assert config.offload.num_cpu_blocks == 2**30 // 393_216


def test_start_up_counts_every_hybrid_group_together() -> None:
    # gpt-oss-20b at max_model_len 1024, 256-token passes: full attention holds 1024 / 16 =
    # 64 blocks and the sliding window (128) ceil((127 + 256) / 16) + 1 = 25, 89 together.
    # 80 blocks hold the full group alone but not both: refused, as vLLM's summed check.
    flags = ("--model-shape", "gpt-oss-20b", "--max-model-len", "1024",
             "--max-num-batched-tokens", "256")  # fmt: skip
    with pytest.raises(ConfigError, match="needs 89 KV blocks"):
        _config(*flags, "--num-gpu-blocks-override", "80")
    assert _config(*flags, "--num-gpu-blocks-override", "89").cache.num_gpu_blocks == 89


def test_scheduling_policy_is_read_not_ignored() -> None:
    """vLLM's --scheduling-policy is read, not ignored: it orders the waiting queue."""
    assert _config().scheduler.scheduling_policy == "fcfs"
    values, warnings = resolve(parse_flags(["--scheduling-policy", "priority"]), ALL, environ={})
    assert warnings == [] and engine_config_from(values).scheduler.scheduling_policy == "priority"
    with pytest.raises(SystemExit):  # argparse's own error: not a choice
        parse_flags(["--scheduling-policy", "lifo"])


def test_kv_cache_memory_bytes_sizes_the_device_pool() -> None:
    """vLLM's --kv-cache-memory-bytes: the blocks it holds at the model's 2 MiB a block
    (block_size 16 × Llama-3-8B's 128 KiB a token); --num-gpu-blocks-override wins."""
    gib4 = str(4 * 2**30)
    argv = ["--kv-cache-memory-bytes", gib4, "--max-model-len", "4096"]
    assert _config(*argv).cache.num_gpu_blocks == 2048
    assert _config(*argv, "--num-gpu-blocks-override", "1000").cache.num_gpu_blocks == 1000
    assert _config().cache.num_gpu_blocks == EngineConfig().cache.num_gpu_blocks
    with pytest.raises(ConfigError, match="kv_cache_memory_bytes=1000: holds no block"):
        _config("--kv-cache-memory-bytes", "1000")


def test_the_int_hash_env_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1); a value vLLM cannot read stops
    # start-up with one line naming it.
    small = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096"]
    values, _ = resolve(parse_flags(small), ALL, environ={})
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    assert engine_config_from(values).cache.int_block_hashes is True
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert engine_config_from(values).cache.int_block_hashes is False
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "false")
    with pytest.raises(ConfigError, match="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES='false'"):
        engine_config_from(values)
