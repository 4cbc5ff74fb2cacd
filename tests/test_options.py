"""Option layering: default < YAML < MOCKER_* env < flag; ignored vLLM flags; clear errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mocker.config import ConfigError
from mocker.options import (
    ENGINE_OPTIONS,
    IGNORED_VLLM_FLAGS,
    SERVER_OPTIONS,
    add_ignored_vllm_flags,
    add_options,
    engine_config_from,
    resolve,
    server_settings_from,
)

ALL = ENGINE_OPTIONS + SERVER_OPTIONS


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, SERVER_OPTIONS, "server")
    add_options(parser, ENGINE_OPTIONS, "engine")
    add_ignored_vllm_flags(parser)
    return parser.parse_args(argv)


def test_defaults_match_the_engine_and_vllm() -> None:
    values, warnings = resolve(_parse([]), ALL, environ={})
    config = engine_config_from(values)
    assert (config.block_size, config.num_gpu_blocks, config.max_num_seqs) == (16, 16384, 256)
    assert (config.max_num_batched_tokens, config.max_model_len) == (8192, 131072)
    settings = server_settings_from(values)
    assert settings.port == 8000 and settings.max_num_queued_reqs is None
    assert settings.served_model_names == ("mocker",) and settings.access_log
    assert warnings == []


def test_flag_beats_env_beats_yaml_beats_default(tmp_path: Path) -> None:
    cfg = tmp_path / "mocker.yaml"
    cfg.write_text("max-num-seqs: 10\nblock_size: 32\nport: 9001\nenable-prefix-caching: false\n")
    env = {"MOCKER_MAX_NUM_SEQS": "20", "MOCKER_PORT": "9002"}
    values, _ = resolve(_parse(["--port", "9003"]), ALL, config_file=str(cfg), environ=env)
    assert values["port"] == 9003  # flag
    assert values["max_num_seqs"] == 20  # env over file
    assert values["block_size"] == 32  # file over default
    assert values["enable_prefix_caching"] is False
    assert values["max_num_batched_tokens"] == 8192  # default


def test_boolean_pairs_and_lists() -> None:
    ns = _parse(["--no-enable-prefix-caching", "--served-model-name", "a", "b"])
    values, _ = resolve(ns, ALL, environ={"MOCKER_ENABLE_CHUNKED_PREFILL": "false"})
    assert values["enable_prefix_caching"] is False
    assert values["enable_chunked_prefill"] is False
    assert server_settings_from(values).served_model_names == ("a", "b")
    values, _ = resolve(_parse([]), ALL, environ={"MOCKER_SERVED_MODEL_NAME": "x,y"})
    assert values["served_model_name"] == ["x", "y"]


def test_ignored_vllm_flags_warn_once_each() -> None:
    ns = _parse(["--tensor-parallel-size", "8", "--trust-remote-code", "--dtype", "bfloat16"])
    _, warnings = resolve(ns, ALL, environ={})
    assert warnings == [
        "ignoring --dtype: no meaning for a mock engine",
        "ignoring --tensor-parallel-size: no meaning for a mock engine",
        "ignoring --trust-remote-code: no meaning for a mock engine",
    ]
    assert "gpu_memory_utilization" in IGNORED_VLLM_FLAGS


def test_bad_values_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MOCKER_MAX_NUM_SEQS='lots': must be an integer"):
        resolve(_parse([]), ALL, environ={"MOCKER_MAX_NUM_SEQS": "lots"})
    with pytest.raises(ConfigError, match="MOCKER_ENABLE_PREFIX_CACHING"):
        resolve(_parse([]), ALL, environ={"MOCKER_ENABLE_PREFIX_CACHING": "maybe"})
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seqs: [1]\n")
    with pytest.raises(ConfigError, match="'max_num_seqs' in"):
        resolve(_parse([]), ALL, config_file=str(cfg), environ={})
    cfg.write_text("no_such_setting: 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'no_such_setting'"):
        resolve(_parse([]), ALL, config_file=str(cfg), environ={})
    cfg.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        resolve(_parse([]), ALL, config_file=str(cfg), environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        resolve(_parse([]), ALL, config_file=str(tmp_path / "missing.yaml"), environ={})


def test_engine_and_server_checks() -> None:
    values, _ = resolve(_parse(["--max-num-seqs", "0"]), ALL, environ={})
    with pytest.raises(ConfigError, match="max_num_seqs"):
        engine_config_from(values)
    values, _ = resolve(_parse(["--max-num-queued-reqs", "0"]), ALL, environ={})
    with pytest.raises(ConfigError, match="max_num_queued_reqs"):
        server_settings_from(values)
    with pytest.raises(SystemExit):
        _parse(["--max-num-seqs", "x"])


def test_every_option_has_help_env_and_flag() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, ALL, "all")
    text = parser.format_help()
    for opt in ALL:
        assert opt.help
        assert opt.flag in text and opt.env in text


def test_yaml_null_and_small_kv_cache_are_start_up_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: null\n")
    with pytest.raises(ConfigError, match=r"'port' in .*must not be null"):
        resolve(_parse([]), ALL, config_file=str(cfg), environ={})
    cfg.write_text("api_key: null\n")  # settings without a default may be null
    values, _ = resolve(_parse([]), ALL, config_file=str(cfg), environ={})
    assert values["api_key"] is None
    values, _ = resolve(_parse(["--num-gpu-blocks-override", "100"]), ALL, environ={})
    with pytest.raises(ConfigError, match=r"max_model_len \(131072\) is larger than the KV"):
        engine_config_from(values)


def test_host_tier_flags() -> None:
    small = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096"]
    values, _ = resolve(_parse([*small, "--kv-offloading-size", "4"]), ALL, environ={})
    config = engine_config_from(values)
    # 4 GiB of 2 MiB blocks (block_size 16 × Llama-3-8B's 128 KiB per token).
    assert config.num_host_blocks == 2048 and config.offload_policy == "evict"
    assert config.kv_offloading_size == 4.0  # reported in vllm:cache_config_info
    argv = [*small, "--num-host-blocks", "100", "--offload-policy", "write-through",
            "--host-d2h-bandwidth-gbps", "8", "--host-h2d-bandwidth-gbps", "0",
            "--offload-batch-size", "4", "--transfer-latency-ms", "0.5",
            "--min-load-blocks", "2", "--load-timeout", "3"]  # fmt: skip
    values, _ = resolve(_parse(argv), ALL, environ={})
    config = engine_config_from(values)
    assert (config.num_host_blocks, config.offload_policy) == (100, "write-through")
    assert (config.host_d2h_bandwidth_gbps, config.host_h2d_bandwidth_gbps) == (8.0, 0.0)
    assert (config.offload_batch_size, config.transfer_latency_ms) == (4, 0.5)
    assert (config.min_load_blocks, config.load_timeout) == (2, 3.0)
    values, _ = resolve(_parse(small), ALL, environ={"MOCKER_NUM_HOST_BLOCKS": "7"})
    assert engine_config_from(values).num_host_blocks == 7
    assert engine_config_from(resolve(_parse(small), ALL, environ={})[0]).num_host_blocks == 0


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
    small = ["--num-gpu-blocks-override", "1024", "--max-model-len", "4096"]
    values, _ = resolve(_parse([*small, *argv]), ALL, environ={})
    with pytest.raises(ConfigError, match=message):
        engine_config_from(values)


def test_deployment_vllm_flags_are_accepted_and_data_parallel_is_read() -> None:
    ns = _parse(["--kv-transfer-config", "{}", "--data-parallel-size", "2"])
    values, warnings = resolve(ns, ALL, environ={})
    assert warnings == ["ignoring --kv-transfer-config: no meaning for a mock engine"]
    assert server_settings_from(values).data_parallel_size == 2


def test_fault_settings_from_flags_and_env() -> None:
    argv = ["--failure-rate", "0.25", "--failure-types", "429,abort", "503", "--ttft-jitter", "0.5"]
    settings = server_settings_from(resolve(_parse(argv), ALL, environ={})[0])
    assert settings.faults.failure_rate == 0.25
    assert [t.value for t in settings.faults.failure_types] == ["rate_limit", "abort", "overloaded"]
    assert settings.faults.ttft_jitter == 0.5 and settings.faults.itl_jitter == 0.0
    env = {"MOCKER_FAILURE_TYPES": "server_error, 400", "MOCKER_STARTUP_DELAY": "2.5"}
    settings = server_settings_from(resolve(_parse([]), ALL, environ=env)[0])
    assert [t.value for t in settings.faults.failure_types] == ["server_error", "context_length"]
    assert settings.startup_delay == 2.5
    # Unset: every type, no failures, no admin route.
    default = server_settings_from(resolve(_parse([]), ALL, environ={})[0])
    assert len(default.faults.failure_types) == 5 and default.faults.failure_rate == 0.0
    assert default.admin_token is None and default.data_parallel_size == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--failure-rate", "1.5"], r"failure_rate=1\.5 must be \[0, 1\]"),
        (["--failure-rate", "-0.1"], "failure_rate"),
        (["--failure-types", "418"], "unknown failure type '418'"),
        (["--ttft-jitter", "-1"], "ttft_jitter"),
        (["--data-parallel-size", "0"], "data_parallel_size"),
        (["--startup-delay", "-1"], "startup_delay"),
    ],
)
def test_fault_and_data_parallel_mistakes_fail_at_start_up(argv: list[str], message: str) -> None:
    values, _ = resolve(_parse(argv), ALL, environ={})
    with pytest.raises(ConfigError, match=message):
        server_settings_from(values)


def test_kv_events_config_from_flag_env_and_yaml(tmp_path) -> None:
    text = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000"}'
    values, warnings = resolve(_parse(["--kv-events-config", text]), ALL, environ={})
    assert warnings == []
    settings = server_settings_from(values)
    assert settings.kv_events.active and settings.kv_events.endpoint == "tcp://*:6000"
    assert settings.kv_events_format == "map"
    env = {"MOCKER_KV_EVENTS_CONFIG": text, "MOCKER_KV_EVENTS_FORMAT": "array"}
    settings = server_settings_from(resolve(_parse([]), ALL, environ=env)[0])
    assert settings.kv_events.endpoint == "tcp://*:6000" and settings.kv_events_format == "array"
    cfg = tmp_path / "m.yaml"
    cfg.write_text("kv-events-config:\n  enable_kv_cache_events: true\n  topic: kv\n")
    values, _ = resolve(_parse([]), ALL, config_file=str(cfg), environ={})
    assert server_settings_from(values).kv_events.topic == "kv"
    assert not server_settings_from(resolve(_parse([]), ALL, environ={})[0]).kv_events.active
