"""Settings of `mocker serve` and `mocker replay`: flags, MOCKER_* env and YAML, layered."""

from __future__ import annotations

from mocker.settings.engine import ENGINE_OPTIONS, engine_config_from
from mocker.settings.layers import add_options, resolve
from mocker.settings.option import ENV_PREFIX, Option
from mocker.settings.server import ServerSettings, server_settings_from
from mocker.settings.server_options import SERVER_OPTIONS
from mocker.settings.vllm_compat import IGNORED_VLLM_FLAGS, add_ignored_vllm_flags

__all__ = [
    "ALL_OPTIONS",
    "ENGINE_OPTIONS",
    "ENV_PREFIX",
    "IGNORED_VLLM_FLAGS",
    "SERVER_OPTIONS",
    "Option",
    "ServerSettings",
    "add_ignored_vllm_flags",
    "add_options",
    "engine_config_from",
    "resolve",
    "server_settings_from",
]

# Every option by name (deployment manifests are checked against it).
ALL_OPTIONS: dict[str, Option] = {o.dest: o for o in ENGINE_OPTIONS + SERVER_OPTIONS}
