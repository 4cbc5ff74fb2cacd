"""Server settings of `mocker serve`: the dataclass (defaults declared here once), validated."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mocker.config import ConfigError
from mocker.faults import FaultConfig, parse_fault_types
from mocker.kvevents.config import EventFormat, KVEventsConfig
from mocker.settings.lora import LoraModule, parse_lora_modules

__all__ = ["MAX_REPLICAS", "ServerSettings", "server_settings_from"]

# `--replicas`: each is a whole server (engine, pool, metrics) in this one process.
MAX_REPLICAS = 4096


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP-side settings of `mocker serve`; the defaults of their flags."""

    model: str = "mocker"  # (the CLI's default is --model's, mocker.settings.deployment)
    served_model_names: tuple[str, ...] = ("mocker",)
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    tokenizer: str | None = None
    chat_template: str | None = None
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    api_key: str | None = None
    log_requests: bool = False
    access_log: bool = True
    log_level: str = "info"
    legacy_metric_names: bool = False
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    kv_events_format: EventFormat = EventFormat.MAP
    # The vLLM release served where 0.34 changed what a 0.33-era client reads.
    vllm_compat: str = "0.34"
    shutdown_timeout: float = 30.0
    data_parallel_size: int = 1
    startup_delay: float = 0.0
    # Passes whose tokens a lagging server streams as one chunk (mocker.engine.live).
    max_merged_passes: int = 1
    # vLLM's --stream-interval: tokens a streamed chunk waits for (mocker.api.stream).
    stream_interval: int = 1
    # vLLM's --enable-force-include-usage: every stream carries usage, on every chunk.
    force_include_usage: bool = False
    # vLLM's --max-logprobs: the most top alternatives a request may ask for per token (-1:
    # the vocabulary); the mock's logprobs are synthetic (mocker.api.logprobs).
    max_logprobs: int = 20
    # uvicorn's root_path (vLLM's --root-path): the app behind a path-based proxy.
    root_path: str = ""
    # vLLM's gate on tool_choice "auto": both set, or such a chat is a 400 (the mock calls no
    # tool either way).
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    # TLS, as vLLM's flags hand them to uvicorn (none: plain HTTP).
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE: clients show no certificate

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    faults: FaultConfig = field(default_factory=FaultConfig)
    admin_token: str | None = None
    # GET /get_load's body: vllm-router's {"load": n} or the SGLang server's per-rank list
    # (sglang-router's); the two routers send the same request, so a flag picks.
    get_load_format: str = "vllm-router"
    # --lora-modules: adapters served as models (with --enable-lora)
    lora_modules: tuple[LoraModule, ...] = ()

    @property
    def model_name(self) -> str:
        """The name in metrics labels: the first served name."""
        return self.served_model_names[0]


_S = ServerSettings()


def _check(values: Mapping[str, Any]) -> None:
    """Range checks of the plain numbers (ConfigError naming the setting)."""
    port = values["port"]
    if not 0 <= port <= 65535:
        raise ConfigError(f"invalid port={port!r}: must be in [0, 65535]")
    for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
        queued = values[name]
        if queued is not None and queued < 0:
            raise ConfigError(f"invalid {name}={queued!r}: must be >= 0 (or unset)")
    shutdown = values["shutdown_timeout"]
    if not shutdown >= 0:
        raise ConfigError(f"invalid shutdown_timeout={shutdown!r}: must be >= 0")
    replicas = values["replicas"]
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"invalid replicas={replicas!r}: must be in [1, {MAX_REPLICAS}]")
    if port and port + replicas - 1 > 65535:
        raise ConfigError(f"invalid replicas={replicas!r}: from port {port} past port 65535")
    dp = values["data_parallel_size"]
    if not 1 <= dp <= 64:
        raise ConfigError(f"invalid data_parallel_size={dp!r}: must be in [1, 64]")
    delay = values["startup_delay"]
    if not delay >= 0:
        raise ConfigError(f"invalid startup_delay={delay!r}: must be >= 0")
    merged = values["max_merged_passes"]
    if not 1 <= merged <= 1024:
        raise ConfigError(f"invalid max_merged_passes={merged!r}: must be in [1, 1024]")
    interval = values["stream_interval"]
    if interval < 1:
        raise ConfigError(f"invalid stream_interval={interval!r}: must be >= 1")
    if values["max_logprobs"] < -1:
        raise ConfigError(f"invalid max_logprobs={values['max_logprobs']!r}: must be >= -1")
    _check_tls(values)


def _check_tls(values: Mapping[str, Any]) -> None:
    """Both TLS files or neither, every file given readable, a known client-certificate mode:
    a mistake stops start-up naming the setting (uvicorn's own error comes later, unnamed)."""
    key, cert = values["ssl_keyfile"], values["ssl_certfile"]
    if bool(key) != bool(cert):
        raise ConfigError("set both --ssl-keyfile and --ssl-certfile (TLS), or neither")
    for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
        path = values[name]
        if path and not os.access(path, os.R_OK):
            raise ConfigError(f"invalid {name}={path!r}: not a readable file")
    if values["ssl_cert_reqs"] not in (0, 1, 2):
        raise ConfigError(f"invalid ssl_cert_reqs={values['ssl_cert_reqs']!r}: must be 0, 1 or 2")


def _faults(values: Mapping[str, Any]) -> FaultConfig:
    try:
        types = values["failure_types"]
        return FaultConfig(
            failure_rate=values["failure_rate"],
            failure_types=parse_fault_types(types) if types else _S.faults.failure_types,
            ttft_jitter=values["ttft_jitter"],
            itl_jitter=values["itl_jitter"],
        )
    except ValueError as exc:
        raise ConfigError(f"invalid fault injection setting: {exc}") from None


def server_settings_from(values: Mapping[str, Any]) -> ServerSettings:
    """The server settings from resolved option values (validated)."""
    _check(values)
    names = tuple(values["served_model_name"] or (values["model"],))
    if not names or any(not n for n in names):
        raise ConfigError("invalid served_model_name: names must be non-empty")
    return ServerSettings(
        model=values["model"],
        served_model_names=names,
        host=values["host"],
        port=values["port"],
        replicas=values["replicas"],
        tokenizer=values["tokenizer"],
        chat_template=values["chat_template"],
        max_num_queued_reqs=values["max_num_queued_reqs"],
        max_num_queued_tokens=values["max_num_queued_tokens"],
        api_key=values["api_key"] or None,
        log_requests=values["enable_log_requests"] and not values["disable_log_requests"],
        access_log=not values["disable_uvicorn_access_log"],
        log_level=values["uvicorn_log_level"],
        legacy_metric_names=values["legacy_metric_names"],
        kv_events=KVEventsConfig.parse(values["kv_events_config"]),
        kv_events_format=EventFormat(values["kv_events_format"]),
        vllm_compat=values["vllm_compat"],
        shutdown_timeout=values["shutdown_timeout"],
        data_parallel_size=values["data_parallel_size"],
        startup_delay=values["startup_delay"],
        max_merged_passes=values["max_merged_passes"],
        stream_interval=values["stream_interval"],
        force_include_usage=values["enable_force_include_usage"],
        max_logprobs=values["max_logprobs"],
        root_path=values["root_path"] or "",
        enable_auto_tool_choice=values["enable_auto_tool_choice"],
        ssl_keyfile=values["ssl_keyfile"] or None,
        ssl_certfile=values["ssl_certfile"] or None,
        ssl_ca_certs=values["ssl_ca_certs"] or None,
        ssl_cert_reqs=values["ssl_cert_reqs"],
        tool_call_parser=values["tool_call_parser"] or None,
        faults=_faults(values),
        admin_token=values["admin_token"] or None,
        get_load_format=values["get_load_format"],
        lora_modules=parse_lora_modules(values["lora_modules"]),
    )
