"""Server settings of `mocker serve`: the dataclass (defaults declared here once) and its flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mocker.config import VLLM_RELEASES, ConfigError
from mocker.faults import FaultConfig, parse_fault_types
from mocker.kvevents.config import EventFormat, KVEventsConfig
from mocker.settings.lora import LoraModule, parse_lora_modules
from mocker.settings.option import Option

__all__ = ["SERVER_OPTIONS", "ServerSettings", "server_settings_from"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP-side settings of `mocker serve`; the defaults of their flags."""

    model: str = "mocker"  # (the CLI's default is --model's, mocker.settings.deployment)
    served_model_names: tuple[str, ...] = ("mocker",)
    host: str = "127.0.0.1"
    port: int = 8000
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

SERVER_OPTIONS: tuple[Option, ...] = (
    Option(
        "served_model_name",
        "name(s) the API answers to; the first labels the metrics (default: --model)",
        None,
        "names",
        metavar="NAME",
    ),
    Option("host", "address to bind", _S.host),
    Option("port", "HTTP port (0: a free one, named in the start-up line)", _S.port, "int"),
    Option(
        "tokenizer",
        "Hugging Face tokenizer folder or tokenizer.json (default: the bundled DeepSeek-V3 one)",
        _S.tokenizer,
        metavar="PATH",
    ),
    Option(
        "chat_template",
        "Jinja2 chat template file or text (default: the tokenizer's, else plain joining)",
        _S.chat_template,
        metavar="FILE",
    ),
    Option(
        "max_num_queued_reqs",
        "reject a new request with 503 when it would put more than this many in flight "
        "(waiting or running, over every rank; default: unlimited)",
        _S.max_num_queued_reqs,
        "int",
    ),
    Option(
        "max_num_queued_tokens",
        "reject new requests with 503 while the prompts not past their first token hold this "
        "many tokens (default: unlimited)",
        _S.max_num_queued_tokens,
        "int",
    ),
    Option("api_key", "require 'Authorization: Bearer KEY' on /v1/*", _S.api_key, metavar="KEY"),
    Option(
        "root_path",
        "the path prefix a path-based proxy serves this server under, which the proxy strips "
        "(uvicorn's root_path, as vLLM's): the OpenAPI document and docs name it",
        _S.root_path,
        metavar="PATH",
    ),
    Option(
        "shutdown_timeout",
        "seconds in-flight requests get to finish after SIGTERM (new ones and /health get "
        "503 meanwhile); then they are aborted",
        _S.shutdown_timeout,
        "float",
        metavar="SECONDS",
    ),
    Option(
        "data_parallel_size",
        "engine cores in this server, each with its own KV cache, `engine` metric label and "
        "KV-event port (port + rank); a request goes to the least loaded unless it names one "
        "(header X-data-parallel-rank or field data_parallel_rank)",
        _S.data_parallel_size,
        "int",
    ),
    Option(
        "startup_delay",
        "seconds after start during which /health and completions answer 503 (a model "
        "loading) (mocker)",
        _S.startup_delay,
        "float",
        metavar="SECONDS",
    ),
    Option(
        "max_merged_passes",
        "when the server wakes a quarter of a pass or more after the modelled pass ended "
        "(too many streams for its CPU), run the due passes back to back and stream each "
        "request's tokens of up to N passes as one chunk, as a lagging vLLM API server "
        "merges a stream's deltas; the passes keep their modelled pace. 1: a chunk per "
        "pass, and the passes fall behind with the server (mocker)",
        _S.max_merged_passes,
        "int",
        metavar="N",
    ),
    Option(
        "stream_interval",
        "tokens a streamed choice's chunk waits for: its first token and its end go at once, "
        "the rest in chunks of N tokens (a request's own stream_interval may raise it, not "
        "lower it); the engine and its metrics still count every token as it is made",
        _S.stream_interval,
        "int",
        metavar="N",
    ),
    Option(
        "ssl_keyfile",
        "TLS private key file (with --ssl-certfile: serve HTTPS)",
        None,
        metavar="FILE",
    ),
    Option("ssl_certfile", "TLS certificate file (with --ssl-keyfile)", None, metavar="FILE"),
    Option(
        "ssl_ca_certs",
        "CA certificates that client certificates are checked against",
        None,
        metavar="FILE",
    ),
    Option(
        "ssl_cert_reqs",
        "whether clients must show a certificate: 0 no (default), 1 "
        "optional, 2 required (Python's ssl.CERT_*)",
        _S.ssl_cert_reqs,
        "int",
    ),
    Option(
        "enable_auto_tool_choice",
        "with --tool-call-parser, accept chats whose tool_choice is auto (the default when "
        "tools are given); without both, vLLM refuses them with a 400, and so does mocker "
        "(which renders tools into the prompt but never calls one)",
        _S.enable_auto_tool_choice,
        "flag",
    ),
    Option(
        "tool_call_parser",
        "vLLM's tool-call parser name (any name: mocker parses no tool calls)",
        _S.tool_call_parser,
        metavar="NAME",
    ),
    Option(
        "max_logprobs",
        "the most log-probabilities (top alternatives per token) a request may ask for; -1: "
        "the whole vocabulary (the mock's are synthetic: a valid, deterministic distribution "
        "with the sampled token first)",
        _S.max_logprobs,
        "int",
        metavar="N",
    ),
    Option(
        "enable_force_include_usage",
        "every streamed response carries usage, on each chunk and in a last chunk of its own, "
        "whatever its stream_options ask",
        _S.force_include_usage,
        "flag",
    ),
    Option(
        "failure_rate",
        "share of completion requests (0-1) that fail on purpose, with one of "
        "--failure-types (mocker)",
        _S.faults.failure_rate,
        "float",
    ),
    Option(
        "failure_types",
        "failures to inject, by status or name: 429 rate_limit, 503 overloaded, 500 "
        "server_error, 400 context_length, abort (the stream breaks off); default: all. "
        "A request header 'X-Mocker-Fail: TYPE' forces one ('none': none) (mocker)",
        None,
        "names",
        metavar="TYPE",
    ),
    Option(
        "ttft_jitter",
        "hold each first token back by a random share, up to this fraction, of its time to "
        "first token (mocker)",
        _S.faults.ttft_jitter,
        "float",
    ),
    Option(
        "itl_jitter",
        "hold each later token back by a random share, up to this fraction, of its "
        "inter-token gap (mocker)",
        _S.faults.itl_jitter,
        "float",
    ),
    Option(
        "admin_token",
        "enable POST /admin/config (runtime fault settings), which then requires "
        "'Authorization: Bearer TOKEN' (mocker)",
        _S.admin_token,
        metavar="TOKEN",
    ),
    Option(
        "get_load_format",
        "GET /get_load's body: vllm-router's {\"load\": n} or the SGLang server's per-rank "
        "list that sglang-router reads (mocker)",
        _S.get_load_format,
        "str",
        choices=("vllm-router", "sglang"),
    ),
    Option(
        "lora_modules",
        "LoRA adapters served as models (with --enable-lora): name=path, or JSON "
        '\'{"name": "sql", "path": "/adapters/sql", "base_model_name": "base"}\'',
        None,
        "names",
        metavar="MODULE",
    ),
    Option("enable_log_requests", "log one line per request", _S.log_requests, "flag"),
    Option("disable_log_requests", "do not log requests (the default)", False, "flag"),
    Option("disable_uvicorn_access_log", "turn off the HTTP access log", not _S.access_log, "flag"),
    Option(
        "uvicorn_log_level",
        "server log level",
        _S.log_level,
        choices=("critical", "error", "warning", "info", "debug", "trace"),
    ),
    Option(
        "enable_prompt_tokens_details",
        "accepted for vLLM compatibility: cached_tokens is always reported",
        False,
        "flag",
    ),
    Option(
        "kv_events_config",
        "vLLM's KV-event config as JSON, e.g. '{\"enable_kv_cache_events\": true, "
        '"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", '
        '"topic": "kv@{host}:{port}@{model}"}\'; the topic\'s {host} is $POD_IP or this '
        "server's address, {port} its HTTP port, {model} the served model name; a tcp port "
        "of * (tcp://*:* or tcp://127.0.0.1:*) binds a free port, named in GET "
        "/kv_event_sources (each data-parallel rank gets its own)",
        None,
        "json",
        metavar="JSON",
    ),
    Option(
        "kv_events_format",
        'KV events as msgpack maps with a "type" key (vLLM >= mid-2026) or as the older '
        "positional arrays (mocker)",
        _S.kv_events_format.value,
        choices=tuple(f.value for f in EventFormat),
    ),
    Option(
        "vllm_compat",
        "serve vLLM 0.33's forms where 0.34 changed them (tiering metric names, cache-source "
        "labels, KV-event group fields and offload payloads) for clients of that era",
        _S.vllm_compat,
        choices=VLLM_RELEASES,
    ),
    Option(
        "legacy_metric_names",
        "also export V0-era metric names (vllm:gpu_cache_usage_perc, …) for older routers",
        _S.legacy_metric_names,
        "flag",
    ),
)


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
