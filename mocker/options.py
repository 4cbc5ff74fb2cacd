"""Command-line options with vLLM's names, layered: defaults < YAML file < MOCKER_* env < flags."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mocker.api.faults import FaultConfig, parse_fault_types
from mocker.config import MODEL_PRESETS, ConfigError, EngineConfig, OffloadPolicy
from mocker.kvevents.config import EventFormat, KVEventsConfig

__all__ = [
    "ENGINE_OPTIONS",
    "IGNORED_VLLM_FLAGS",
    "SERVER_OPTIONS",
    "Option",
    "ServerSettings",
    "add_options",
    "engine_config_from",
    "resolve",
    "server_settings_from",
]

ENV_PREFIX = "MOCKER_"


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("must be an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be finite")
    return value


def _names(text: str) -> list[str]:
    return [part for part in text.replace(",", " ").split() if part]


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its flag, its type, default and help, and its env / YAML spellings."""

    dest: str
    help: str
    default: Any = None
    kind: str = "str"  # str | int | float | bool | flag | names | json
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()

    def parse_text(self, text: str) -> Any:
        """Convert an env var / YAML scalar given as text."""
        converter: dict[str, Callable[[str], Any]] = {
            "str": str,
            "int": _int,
            "float": _float,
            "bool": _bool,
            "flag": _bool,
            "names": _names,
            "json": str,  # parsed (with errors naming its keys) by whoever owns the setting
        }
        value = converter[self.kind](text)
        self._check_choice(value)
        return value

    def parse_yaml(self, value: Any) -> Any:
        if value is None:
            if self.default is not None:
                raise ValueError("must not be null")
            return None
        if isinstance(value, str):
            return self.parse_text(value)
        if self.kind == "json" and isinstance(value, dict):
            return value
        if self.kind == "names" and isinstance(value, list):
            return [str(v) for v in value]
        if self.kind in ("bool", "flag") and isinstance(value, bool):
            return value
        if self.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if self.kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return self.parse_text(str(value))
        return self.parse_text(str(value))

    def _check_choice(self, value: Any) -> None:
        if self.choices is not None and value not in self.choices:
            raise ValueError("must be one of " + ", ".join(self.choices))


_D = EngineConfig()

ENGINE_OPTIONS: tuple[Option, ...] = (
    Option("block_size", "tokens per KV block (power of two)", _D.block_size, "int"),
    Option(
        "num_gpu_blocks_override",
        "KV blocks in the device cache (a real engine sizes this from GPU memory)",
        _D.num_gpu_blocks,
        "int",
    ),
    Option("max_num_seqs", "most requests running in one pass", _D.max_num_seqs, "int"),
    Option(
        "max_num_batched_tokens",
        "token budget of one pass, shared by prefill chunks and decodes",
        _D.max_num_batched_tokens,
        "int",
    ),
    Option("max_model_len", "context length: prompt + output tokens", _D.max_model_len, "int"),
    Option(
        "enable_prefix_caching",
        "reuse cached KV blocks of shared prompt prefixes",
        _D.enable_prefix_caching,
        "bool",
    ),
    Option(
        "enable_chunked_prefill",
        "split long prompts across passes (off: a prompt must fit one pass)",
        _D.enable_chunked_prefill,
        "bool",
    ),
    Option("seed", "seed for block hashes and generated tokens", _D.seed, "int"),
    Option(
        "speedup_ratio",
        "divide every simulated duration by this (mocker)",
        _D.speedup_ratio,
        "float",
    ),
    Option(
        "timing_profile",
        "NPZ latency profile in Dynamo's layout; default: the published polynomial (mocker)",
        None,
        "str",
        metavar="FILE",
    ),
    Option(
        "model_shape",
        "model dimensions that size KV blocks (mocker)",
        "llama-3-8b",
        "str",
        choices=tuple(MODEL_PRESETS),
    ),
    Option(
        "preemption_victim",
        "running request preempted when a block cannot be allocated (mocker)",
        _D.preemption_victim.value,
        "str",
        choices=("newest", "oldest"),
    ),
    Option(
        "eviction_policy",
        "which free cached block is reused first (mocker)",
        _D.eviction_policy.value,
        "str",
        choices=("lru", "lineage"),
    ),
    Option(
        "eos_probability",
        "chance that each generated token after min_tokens is EOS; 0 runs every request to "
        "max_tokens (mocker)",
        _D.eos_probability,
        "float",
    ),
    # Host (G2) tier.
    Option(
        "kv_offloading_size",
        "GiB of host memory for offloaded KV blocks (host tier; blocks = bytes / block bytes)",
        None,
        "float",
        metavar="GIB",
    ),
    Option(
        "num_host_blocks",
        "KV blocks in the host tier, instead of --kv-offloading-size (mocker)",
        None,
        "int",
    ),
    Option(
        "offload_policy",
        "evict: copy a cached block to host when the device evicts it (KVBM); write-through: "
        "copy new full prompt blocks after their pass (vLLM OffloadingConnector) (mocker)",
        _D.offload_policy.value,
        "str",
        choices=tuple(p.value for p in OffloadPolicy),
    ),
    Option(
        "host_d2h_bandwidth_gbps",
        "device-to-host bandwidth, GB/s (10^9 bytes/s); <= 0: instant (mocker)",
        _D.host_d2h_bandwidth_gbps,
        "float",
    ),
    Option(
        "host_h2d_bandwidth_gbps",
        "host-to-device bandwidth, GB/s (10^9 bytes/s); <= 0: instant (mocker)",
        _D.host_h2d_bandwidth_gbps,
        "float",
    ),
    Option(
        "offload_batch_size",
        "most blocks per device-to-host transfer (mocker)",
        _D.offload_batch_size,
        "int",
    ),
    Option(
        "transfer_latency_ms",
        "fixed latency added to every host-tier transfer, ms (mocker)",
        _D.transfer_latency_ms,
        "float",
    ),
    Option(
        "min_load_blocks",
        "shortest host hit worth loading; shorter ones are recomputed (mocker)",
        _D.min_load_blocks,
        "int",
    ),
    Option(
        "load_timeout",
        "seconds a host-to-device load may take before the request recomputes instead "
        "(simulated: divided by the speedup ratio) (mocker)",
        _D.load_timeout,
        "float",
        metavar="SECONDS",
    ),
)

SERVER_OPTIONS: tuple[Option, ...] = (
    Option("model", "model name (also the first positional argument)", "mocker", "str"),
    Option(
        "served_model_name",
        "name(s) the API answers to; the first labels the metrics (default: --model)",
        None,
        "names",
        metavar="NAME",
    ),
    Option("host", "address to bind", "127.0.0.1", "str"),
    Option("port", "HTTP port (0: a free one, named in the start-up line)", 8000, "int"),
    Option(
        "tokenizer",
        "Hugging Face tokenizer folder or tokenizer.json (default: the bundled DeepSeek-V3 one)",
        None,
        "str",
        metavar="PATH",
    ),
    Option(
        "chat_template",
        "Jinja2 chat template file or text (default: the tokenizer's, else plain joining)",
        None,
        "str",
        metavar="FILE",
    ),
    Option(
        "max_num_queued_reqs",
        "reject new requests with 503 while this many wait (default: unlimited)",
        None,
        "int",
    ),
    Option("api_key", "require 'Authorization: Bearer KEY' on /v1/*", None, "str", metavar="KEY"),
    Option(
        "shutdown_timeout",
        "seconds in-flight requests get to finish after SIGTERM (new ones and /health get "
        "503 meanwhile); then they are aborted",
        30.0,
        "float",
        metavar="SECONDS",
    ),
    Option(
        "data_parallel_size",
        "engine cores in this server, each with its own KV cache, `engine` metric label and "
        "KV-event port (port + rank); a request goes to the least loaded unless it names one "
        "(header X-data-parallel-rank or field data_parallel_rank)",
        1,
        "int",
    ),
    Option(
        "startup_delay",
        "seconds after start during which /health and completions answer 503 (a model "
        "loading) (mocker)",
        0.0,
        "float",
        metavar="SECONDS",
    ),
    Option(
        "failure_rate",
        "share of completion requests (0-1) that fail on purpose, with one of "
        "--failure-types (mocker)",
        0.0,
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
        0.0,
        "float",
    ),
    Option(
        "itl_jitter",
        "hold each later token back by a random share, up to this fraction, of its "
        "inter-token gap (mocker)",
        0.0,
        "float",
    ),
    Option(
        "admin_token",
        "enable POST /admin/config (runtime fault settings), which then requires "
        "'Authorization: Bearer TOKEN' (mocker)",
        None,
        "str",
        metavar="TOKEN",
    ),
    Option("enable_log_requests", "log one line per request", False, "flag"),
    Option("disable_log_requests", "do not log requests (the default)", False, "flag"),
    Option("disable_uvicorn_access_log", "turn off the HTTP access log", False, "flag"),
    Option(
        "uvicorn_log_level",
        "server log level",
        "info",
        "str",
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
        "server's address, {port} its HTTP port, {model} the served model name",
        None,
        "json",
        metavar="JSON",
    ),
    Option(
        "kv_events_format",
        'KV events as msgpack maps with a "type" key (vLLM >= mid-2026) or as the older '
        "positional arrays (mocker)",
        "map",
        "str",
        choices=tuple(f.value for f in EventFormat),
    ),
    Option(
        "legacy_metric_names",
        "also export V0-era metric names (vllm:gpu_cache_usage_perc, …) for older routers",
        False,
        "flag",
    ),
)

# vLLM flags that mean nothing without a GPU: accepted with a one-line warning so existing
# manifests run unchanged. True: takes a value; False: a bare switch.
IGNORED_VLLM_FLAGS: dict[str, bool] = {
    "tensor_parallel_size": True,
    "pipeline_parallel_size": True,
    "gpu_memory_utilization": True,
    "dtype": True,
    "kv_cache_dtype": True,
    "quantization": True,
    "swap_space": True,
    "cpu_offload_gb": True,
    "download_dir": True,
    "load_format": True,
    "revision": True,
    "tokenizer_mode": True,
    "max_logprobs": True,
    "distributed_executor_backend": True,
    "max_seq_len_to_capture": True,
    "compilation_config": True,
    "tool_call_parser": True,
    "generation_config": True,
    "trust_remote_code": False,
    "enforce_eager": False,
    "disable_custom_all_reduce": False,
    "enable_auto_tool_choice": False,
    "disable_frontend_multiprocessing": False,
    "disable_log_stats": False,
    # Flags of vLLM deployments (llm-d manifests) that change nothing here.
    "kv_offloading_backend": True,
    "kv_transfer_config": True,
    "prefix_caching_hash_algo": True,
    "api_server_count": True,
    "scheduling_policy": True,
    "max_log_len": True,
    "reasoning_parser": True,
}

ALL_OPTIONS: dict[str, Option] = {o.dest: o for o in ENGINE_OPTIONS + SERVER_OPTIONS}


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option], title: str) -> None:
    """Add options as flags whose absence is visible (default SUPPRESS), for layering."""
    group = parser.add_argument_group(title)
    for opt in options:
        env_note = f" [env {opt.env}]"
        shown = opt.default is not None and opt.kind != "flag"
        default_note = f" (default: {_show(opt.default)})" if shown else ""
        help_text = opt.help + default_note + env_note
        if opt.kind == "bool":
            group.add_argument(
                opt.flag,
                dest=opt.dest,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        elif opt.kind == "flag":
            group.add_argument(
                opt.flag, dest=opt.dest, action="store_true", default=argparse.SUPPRESS,
                help=help_text,
            )  # fmt: skip
        elif opt.kind == "names":
            group.add_argument(
                opt.flag, dest=opt.dest, nargs="+", default=argparse.SUPPRESS,
                metavar=opt.metavar or "NAME", help=help_text,
            )  # fmt: skip
        else:
            group.add_argument(
                opt.flag,
                dest=opt.dest,
                type=_argparse_type(opt),
                choices=opt.choices,
                default=argparse.SUPPRESS,
                metavar=opt.metavar or ({"int": "N", "float": "X"}.get(opt.kind)),
                help=help_text,
            )


def add_ignored_vllm_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "vLLM flags accepted and ignored (they mean nothing without a GPU)"
    )
    for dest, takes_value in IGNORED_VLLM_FLAGS.items():
        flag = "--" + dest.replace("_", "-")
        if takes_value:
            group.add_argument(
                flag, dest="ignored__" + dest, default=argparse.SUPPRESS, metavar="VALUE",
                help="ignored",
            )  # fmt: skip
        else:
            group.add_argument(
                flag, dest="ignored__" + dest, action="store_true", default=argparse.SUPPRESS,
                help="ignored",
            )  # fmt: skip


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _argparse_type(opt: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return {"int": _int, "float": _float}.get(opt.kind, str)(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def resolve(
    namespace: argparse.Namespace,
    options: Sequence[Option],
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Final values of `options` and the warnings to print (ignored flags or keys).

    Precedence: command-line flag > MOCKER_* environment variable > YAML file > default.
    Raises ConfigError naming the setting and where it came from.
    """
    environ = os.environ if environ is None else environ
    known = {o.dest: o for o in options}
    values = {o.dest: o.default for o in options}
    warnings: list[str] = []
    if config_file is not None:
        for dest, value in _read_yaml(config_file).items():
            if dest in IGNORED_VLLM_FLAGS:
                warnings.append(f"ignoring {dest!r} in {config_file}: no meaning for a mock engine")
                continue
            opt = known.get(dest)
            if opt is None:
                raise ConfigError(f"{config_file}: unknown setting {dest!r}")
            values[dest] = _convert(opt, value, f"{dest!r} in {config_file}", yaml_value=True)
    for opt in options:
        if opt.env in environ:
            values[opt.dest] = _convert(opt, environ[opt.env], opt.env)
    given = vars(namespace)
    for opt in options:
        if opt.dest in given:
            values[opt.dest] = given[opt.dest]
    for key in sorted(given):
        if key.startswith("ignored__"):
            flag = "--" + key.removeprefix("ignored__").replace("_", "-")
            warnings.append(f"ignoring {flag}: no meaning for a mock engine")
    return values, warnings


def _convert(opt: Option, value: Any, where: str, *, yaml_value: bool = False) -> Any:
    try:
        return opt.parse_yaml(value) if yaml_value else opt.parse_text(value)
    except ValueError as exc:
        raise ConfigError(f"invalid {where}={value!r}: {exc}") from None


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of setting: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _num_host_blocks(values: Mapping[str, Any]) -> int:
    """Host blocks from --num-host-blocks or --kv-offloading-size GiB (not both)."""
    blocks, gib = values["num_host_blocks"], values["kv_offloading_size"]
    if blocks is not None and gib is not None:
        raise ConfigError(
            "set either --num-host-blocks or --kv-offloading-size, not both: they size the same "
            "host tier"
        )
    if gib is not None:
        if gib < 0:
            raise ConfigError(f"invalid kv_offloading_size={gib!r}: must be >= 0 GiB")
        block_bytes = values["block_size"] * MODEL_PRESETS[values["model_shape"]].kv_bytes_per_token
        blocks = int(gib * 2**30 // block_bytes)
        if gib > 0 and blocks == 0:
            raise ConfigError(
                f"kv_offloading_size={gib!r} GiB holds no block of {block_bytes} bytes: raise it"
            )
        return blocks
    if blocks is not None and blocks < 0:
        raise ConfigError(f"invalid num_host_blocks={blocks!r}: must be >= 0")
    return blocks or 0


def engine_config_from(values: Mapping[str, Any], **extra: Any) -> EngineConfig:
    """The engine configuration from resolved option values (validated)."""
    config = EngineConfig(
        block_size=values["block_size"],
        num_gpu_blocks=values["num_gpu_blocks_override"],
        max_num_seqs=values["max_num_seqs"],
        max_num_batched_tokens=values["max_num_batched_tokens"],
        max_model_len=values["max_model_len"],
        enable_prefix_caching=values["enable_prefix_caching"],
        enable_chunked_prefill=values["enable_chunked_prefill"],
        seed=values["seed"],
        speedup_ratio=values["speedup_ratio"],
        timing_profile=values["timing_profile"],
        model=MODEL_PRESETS[values["model_shape"]],
        preemption_victim=values["preemption_victim"],
        eviction_policy=values["eviction_policy"],
        eos_probability=values["eos_probability"],
        num_host_blocks=_num_host_blocks(values),
        kv_offloading_size=values["kv_offloading_size"],
        offload_policy=values["offload_policy"],
        host_d2h_bandwidth_gbps=values["host_d2h_bandwidth_gbps"],
        host_h2d_bandwidth_gbps=values["host_h2d_bandwidth_gbps"],
        offload_batch_size=values["offload_batch_size"],
        transfer_latency_ms=values["transfer_latency_ms"],
        min_load_blocks=values["min_load_blocks"],
        load_timeout=values["load_timeout"],
        **extra,
    )
    kv_tokens = config.num_gpu_blocks * config.block_size
    if kv_tokens < config.max_model_len:
        # As vLLM refuses to start: a request using the whole context could never run.
        raise ConfigError(
            f"max_model_len ({config.max_model_len}) is larger than the KV cache holds "
            f"({kv_tokens} tokens = num_gpu_blocks_override {config.num_gpu_blocks} × "
            f"block_size {config.block_size}): lower --max-model-len or raise "
            "--num-gpu-blocks-override"
        )
    return config


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """HTTP-side settings of `mocker serve`."""

    model: str = "mocker"
    served_model_names: tuple[str, ...] = ("mocker",)
    host: str = "127.0.0.1"
    port: int = 8000
    tokenizer: str | None = None
    chat_template: str | None = None
    max_num_queued_reqs: int | None = None
    api_key: str | None = None
    log_requests: bool = False
    access_log: bool = True
    log_level: str = "info"
    legacy_metric_names: bool = False
    kv_events: KVEventsConfig = field(default_factory=KVEventsConfig)
    kv_events_format: EventFormat = EventFormat.MAP
    shutdown_timeout: float = 30.0
    data_parallel_size: int = 1
    startup_delay: float = 0.0
    faults: FaultConfig = field(default_factory=FaultConfig)
    admin_token: str | None = None

    @property
    def model_name(self) -> str:
        """The name in metrics labels: the first served name."""
        return self.served_model_names[0]


def server_settings_from(values: Mapping[str, Any]) -> ServerSettings:
    port = values["port"]
    if not 0 <= port <= 65535:
        raise ConfigError(f"invalid port={port!r}: must be in [0, 65535]")
    queued = values["max_num_queued_reqs"]
    if queued is not None and queued < 1:
        raise ConfigError(f"invalid max_num_queued_reqs={queued!r}: must be >= 1 (or unset)")
    shutdown = values["shutdown_timeout"]
    if not shutdown >= 0:
        raise ConfigError(f"invalid shutdown_timeout={shutdown!r}: must be >= 0")
    dp = values["data_parallel_size"]
    if not 1 <= dp <= 64:
        raise ConfigError(f"invalid data_parallel_size={dp!r}: must be in [1, 64]")
    delay = values["startup_delay"]
    if not delay >= 0:
        raise ConfigError(f"invalid startup_delay={delay!r}: must be >= 0")
    try:
        types = values["failure_types"]
        faults = FaultConfig(
            failure_rate=values["failure_rate"],
            failure_types=parse_fault_types(types) if types else FaultConfig().failure_types,
            ttft_jitter=values["ttft_jitter"],
            itl_jitter=values["itl_jitter"],
        )
    except ValueError as exc:
        raise ConfigError(f"invalid fault injection setting: {exc}") from None
    names = tuple(values["served_model_name"] or (values["model"],))
    if not names or any(not n for n in names):
        raise ConfigError("invalid served_model_name: names must be non-empty")
    return ServerSettings(
        model=values["model"],
        served_model_names=names,
        host=values["host"],
        port=port,
        tokenizer=values["tokenizer"],
        chat_template=values["chat_template"],
        max_num_queued_reqs=queued,
        api_key=values["api_key"] or None,
        log_requests=values["enable_log_requests"] and not values["disable_log_requests"],
        access_log=not values["disable_uvicorn_access_log"],
        log_level=values["uvicorn_log_level"],
        legacy_metric_names=values["legacy_metric_names"],
        kv_events=KVEventsConfig.parse(values["kv_events_config"]),
        kv_events_format=EventFormat(values["kv_events_format"]),
        shutdown_timeout=shutdown,
        data_parallel_size=dp,
        startup_delay=delay,
        faults=faults,
        admin_token=values["admin_token"] or None,
    )
