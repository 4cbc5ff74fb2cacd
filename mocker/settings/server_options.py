"""The flags of `mocker serve`'s server settings; their defaults are ServerSettings'."""

from __future__ import annotations

from mocker.config import VLLM_RELEASES
from mocker.kvevents.config import EventFormat
from mocker.settings.option import Option
from mocker.settings.server import ServerSettings

__all__ = ["SERVER_OPTIONS"]

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
        "replicas",
        "servers in this one process, replica i on port --port + i (with --port 0, each on a "
        "free one), each its own engine, KV cache, metrics, KV events, health and faults",
        _S.replicas,
        "int",
        metavar="N",
    ),
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
