"""Server settings: faults, data parallelism and KV events from flags, env and YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocker.config import ConfigError
from mocker.settings import ServerSettings, resolve, server_settings_from
from tests.support.settings import ALL, parse_flags


def test_fault_settings_from_flags_and_env() -> None:
    argv = ["--failure-rate", "0.25", "--failure-types", "429,abort", "503", "--ttft-jitter", "0.5"]
    settings = server_settings_from(resolve(parse_flags(argv), ALL, environ={})[0])
    assert settings.faults.failure_rate == 0.25
    assert [t.value for t in settings.faults.failure_types] == ["rate_limit", "abort", "overloaded"]
    assert settings.faults.ttft_jitter == 0.5 and settings.faults.itl_jitter == 0.0
    env = {"MOCKER_FAILURE_TYPES": "server_error, 400", "MOCKER_STARTUP_DELAY": "2.5"}
    settings = server_settings_from(resolve(parse_flags([]), ALL, environ=env)[0])
    assert [t.value for t in settings.faults.failure_types] == ["server_error", "context_length"]
    assert settings.startup_delay == 2.5
    # Unset: every type, no failures, no admin route.
    default = server_settings_from(resolve(parse_flags([]), ALL, environ={})[0])
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
        (["--stream-interval", "0"], r"stream_interval=0: must be >= 1"),
        (["--max-logprobs", "-2"], r"max_logprobs=-2: must be >= -1"),
    ],
)
def test_fault_and_data_parallel_mistakes_fail_at_start_up(argv: list[str], message: str) -> None:
    values, _ = resolve(parse_flags(argv), ALL, environ={})
    with pytest.raises(ConfigError, match=message):
        server_settings_from(values)


def test_kv_events_config_from_flag_env_and_yaml(tmp_path: Path) -> None:
    text = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000"}'
    values, warnings = resolve(parse_flags(["--kv-events-config", text]), ALL, environ={})
    assert warnings == []
    settings = server_settings_from(values)
    assert settings.kv_events.active and settings.kv_events.endpoint == "tcp://*:6000"
    assert settings.kv_events_format == "map"
    env = {"MOCKER_KV_EVENTS_CONFIG": text, "MOCKER_KV_EVENTS_FORMAT": "array"}
    settings = server_settings_from(resolve(parse_flags([]), ALL, environ=env)[0])
    assert settings.kv_events.endpoint == "tcp://*:6000" and settings.kv_events_format == "array"
    cfg = tmp_path / "m.yaml"
    cfg.write_text("kv-events-config:\n  enable_kv_cache_events: true\n  topic: kv\n")
    values, _ = resolve(parse_flags([]), ALL, config_file=str(cfg), environ={})
    assert server_settings_from(values).kv_events.topic == "kv"
    assert not server_settings_from(resolve(parse_flags([]), ALL, environ={})[0]).kv_events.active


def test_unset_flags_give_the_dataclass_defaults() -> None:
    # The defaults are declared once, on ServerSettings; the flags read them from there.
    # (But the model: the flag's default is a real model's id, mocker.settings.deployment.)
    values = resolve(parse_flags(["--model", "mocker"]), ALL, environ={})[0]
    assert server_settings_from(values) == ServerSettings()
