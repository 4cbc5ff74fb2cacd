"""Option layering: default < YAML < MOCKER_* env < flag; clear errors naming the source."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mocker.config import ConfigError
from mocker.settings import add_options, engine_config_from, resolve, server_settings_from
from tests.support.settings import ALL, parse_flags


def test_defaults_match_the_engine_and_vllm() -> None:
    """No flags: Llama-3.1-8B-Instruct on one H100, sized and limited as vLLM 0.34 sizes it
    (its default max_num_seqs 1024 and 8192 batched tokens on an 80 GiB GPU); under the
    polynomial, Dynamo's fixed defaults."""
    values, warnings = resolve(parse_flags([]), ALL, environ={})
    config = engine_config_from(values)
    limits = (
        config.block_size,
        config.scheduler.max_num_seqs,
        config.scheduler.max_num_batched_tokens,
    )
    assert limits == (16, 1024, 8192)
    assert config.scheduler.max_model_len == 131072  # Llama 3.1's max_position_embeddings
    # 80 GiB less 15 GiB of weights and the reserves: about half a million tokens.
    assert 450_000 < config.cache.num_gpu_blocks * 16 < 550_000
    settings = server_settings_from(values)
    assert settings.port == 8000 and settings.max_num_queued_reqs is None
    assert settings.served_model_names == ("meta-llama/Llama-3.1-8B-Instruct",)
    assert settings.access_log and warnings == []
    values, _ = resolve(parse_flags(["--timing-model", "polynomial"]), ALL, environ={})
    config = engine_config_from(values)
    scheduler = config.scheduler
    assert (config.cache.num_gpu_blocks, scheduler.max_num_seqs,
            scheduler.max_num_batched_tokens) == (16384, 256, 8192)  # fmt: skip


def test_flag_beats_env_beats_yaml_beats_default(tmp_path: Path) -> None:
    cfg = tmp_path / "mocker.yaml"
    cfg.write_text("max-num-seqs: 10\nblock_size: 32\nport: 9001\nenable-prefix-caching: false\n")
    env = {"MOCKER_MAX_NUM_SEQS": "20", "MOCKER_PORT": "9002"}
    values, _ = resolve(parse_flags(["--port", "9003"]), ALL, config_file=str(cfg), environ=env)
    assert values["port"] == 9003  # flag
    assert values["max_num_seqs"] == 20  # env over file
    assert values["block_size"] == 32  # file over default
    assert values["enable_prefix_caching"] is False
    assert values["max_num_batched_tokens"] is None  # default (the deployment decides)


def test_boolean_pairs_and_lists() -> None:
    ns = parse_flags(["--no-enable-prefix-caching", "--served-model-name", "a", "b"])
    values, _ = resolve(ns, ALL, environ={"MOCKER_ENABLE_CHUNKED_PREFILL": "false"})
    assert values["enable_prefix_caching"] is False
    assert values["enable_chunked_prefill"] is False
    assert server_settings_from(values).served_model_names == ("a", "b")
    values, _ = resolve(parse_flags([]), ALL, environ={"MOCKER_SERVED_MODEL_NAME": "x,y"})
    assert values["served_model_name"] == ["x", "y"]


def test_bad_values_name_their_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="MOCKER_MAX_NUM_SEQS='lots': must be an integer"):
        resolve(parse_flags([]), ALL, environ={"MOCKER_MAX_NUM_SEQS": "lots"})
    with pytest.raises(ConfigError, match="MOCKER_ENABLE_PREFIX_CACHING"):
        resolve(parse_flags([]), ALL, environ={"MOCKER_ENABLE_PREFIX_CACHING": "maybe"})
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_num_seqs: [1]\n")
    with pytest.raises(ConfigError, match="'max_num_seqs' in"):
        resolve(parse_flags([]), ALL, config_file=str(cfg), environ={})
    cfg.write_text("no_such_setting: 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'no_such_setting'"):
        resolve(parse_flags([]), ALL, config_file=str(cfg), environ={})
    cfg.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        resolve(parse_flags([]), ALL, config_file=str(cfg), environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        resolve(parse_flags([]), ALL, config_file=str(tmp_path / "missing.yaml"), environ={})


def test_engine_and_server_checks() -> None:
    values, _ = resolve(parse_flags(["--max-num-seqs", "0"]), ALL, environ={})
    with pytest.raises(ConfigError, match="max_num_seqs"):
        engine_config_from(values)
    for flag in ("--max-num-queued-reqs", "--max-num-queued-tokens"):  # (0: vLLM's, refuse all)
        values, _ = resolve(parse_flags([flag, "-1"]), ALL, environ={})
        with pytest.raises(ConfigError, match=flag[2:].replace("-", "_") + "=-1: must be >= 0"):
            server_settings_from(values)
    with pytest.raises(SystemExit):
        parse_flags(["--max-num-seqs", "x"])


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
        resolve(parse_flags([]), ALL, config_file=str(cfg), environ={})
    cfg.write_text("api_key: null\n")  # settings without a default may be null
    values, _ = resolve(parse_flags([]), ALL, config_file=str(cfg), environ={})
    assert values["api_key"] is None
    values, _ = resolve(parse_flags(["--num-gpu-blocks-override", "100"]), ALL, environ={})
    with pytest.raises(ConfigError, match=r"max_model_len \(131072\) is larger than the KV"):
        engine_config_from(values)
