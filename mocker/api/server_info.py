"""What routers read to discover a worker: KV-event sources, server and model info, load.

Each body is the shape its readers parse (vLLM's, and the SGLang server's that vllm-router and
sglang-router also probe), filled in from the running engines and their settings.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from mocker import __version__
from mocker.api.state import ServerState
from mocker.config_choices import KVRole
from mocker.kvevents.config import BIND_PREFIX, advertised_host, connectable
from mocker.model_shape import MODEL_PRESETS

__all__ = ["kv_event_sources", "model_info", "server_info", "sglang_load", "total_load"]

# What an SGLang server's /model_info says of each preset's architecture.
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
}
# The hybrid presets' model_type (their config.json's).
_HYBRID_TYPES = {
    "gpt-oss-20b": "gpt_oss",
    "gemma-3-12b": "gemma3",
    "qwen3-next-80b-a3b": "qwen3_next",
    "granite-4.0-h-micro": "granitemoehybrid",
}


def kv_event_sources(state: ServerState) -> dict[str, dict[str, Any]]:
    """GET /kv_event_sources: vLLM's map of data-parallel rank → its publisher's KVEventsConfig
    (`{}` when events are off), plus the wire declarations vllm-router's discovery requires
    (`encoding`, `schema_version`) and mocker's own fields (where to connect, next sequence)."""
    settings, publishers = state.settings, state.publishers
    config = settings.kv_events
    host = advertised_host(settings.host)
    sources: dict[str, dict[str, Any]] = {}
    for publisher in publishers:
        replay = publisher.replay_endpoint
        sources[str(publisher.rank)] = {
            # vLLM's KVEventsConfig, as the publisher resolved it (port + rank, bound port)
            **asdict(config),
            "endpoint": publisher.endpoint,
            "replay_endpoint": replay,
            "topic": publisher.topic,
            # vllm-router skips a rank without these (vLLM's own reader needs no such check)
            "encoding": "msgpack",
            "schema_version": 1,
            # mocker: bind (subscribe by connecting to `connect`) or connect (the engine dials
            # the consumer's own bound socket at `endpoint`)
            "data_parallel_rank": publisher.rank,
            "mode": "bind" if publisher.binds else "connect",
            "connect": connectable(publisher.endpoint, host) if publisher.binds else None,
            "replay_connect": connectable(replay, host) if replay is not None else None,
            "next_seq": publisher.next_seq,
            "format": settings.kv_events_format.value,
            "model": settings.model_name,
            "block_size": state.config.block_size,
            # mocker: the KV cache groups a hybrid model's events carry in group_idx
            "kv_cache_groups": state.config.layout.describe(),
        }
    return sources


def _model_type(state: ServerState) -> str:
    """The preset's family ("llama", "qwen2", "mistral", a hybrid's model_type), or "llama"
    for a custom shape."""
    for name, shape in MODEL_PRESETS.items():
        if shape == state.config.model:
            if name in _HYBRID_TYPES:
                return _HYBRID_TYPES[name]
            family = name.split("-")[0].replace(".", "").rstrip("0123456789")
            return {"qwen": "qwen2"}.get(family, family)
    return "llama"


def _vllm_config(state: ServerState) -> dict[str, Any]:
    """The parts of vLLM's VllmConfig (as /server_info?config_format=json dumps it) that
    routers and tools read."""
    settings, config = state.settings, state.config
    events = settings.kv_events
    transfer = None
    if config.offload.num_cpu_blocks:
        transfer = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "num_cpu_blocks": config.offload.num_cpu_blocks,
                "secondary_tiers": [
                    {"type": t.name, "capacity_blocks": t.capacity_blocks}
                    for t in config.offload.storage_tiers
                ],
            },
        }
    if config.transfer.kv_role is not KVRole.NONE:
        nixl = {
            "kv_connector": "NixlConnector",
            "kv_role": config.transfer.kv_role.value,
            "engine_id": config.transfer.kv_engine_id,
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {
                "kv_lease_duration": config.transfer.hold_timeout,
                "pull_gbps": config.transfer.pull_gbps,
                "pull_latency_ms": config.transfer.pull_latency_ms,
                "pull_timeout_s": config.transfer.pull_timeout,
            },
        }
        # Both: vLLM composes them with its MultiConnector.
        transfer = nixl if transfer is None else {
            "kv_connector": "MultiConnector",
            "kv_role": config.transfer.kv_role.value,
            "kv_connector_extra_config": {"connectors": [nixl, transfer]},
        }  # fmt: skip
    return {
        "model_config": {
            "model": settings.model,
            "served_model_name": list(settings.served_model_names),
            "tokenizer": settings.tokenizer or settings.model,
            "max_model_len": config.scheduler.max_model_len,
            "seed": config.seed,
        },
        "instance_id": state.instance_id,
        "cache_config": {
            "block_size": config.block_size,
            "num_gpu_blocks": config.cache.num_gpu_blocks,
            "num_gpu_blocks_override": config.cache.num_gpu_blocks,
            "num_cpu_blocks": config.offload.num_cpu_blocks or None,
            "enable_prefix_caching": config.cache.enable_prefix_caching,
            "prefix_caching_hash_algo": config.cache.prefix_caching_hash_algo,
        },
        "parallel_config": {
            "data_parallel_size": settings.data_parallel_size,
            "tensor_parallel_size": 1,
            "pipeline_parallel_size": 1,
        },
        "scheduler_config": {
            "max_num_seqs": config.scheduler.max_num_seqs,
            "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
            "max_model_len": config.scheduler.max_model_len,
            "enable_chunked_prefill": config.scheduler.enable_chunked_prefill,
        },
        "kv_events_config": {
            **asdict(events),
            "publisher": events.publisher if events.enable_kv_cache_events else "null",
            "endpoint": events.endpoint.removeprefix(BIND_PREFIX),
        },
        "kv_transfer_config": transfer,
    }


def server_info(state: ServerState, config_format: str = "text") -> dict[str, Any]:
    """GET /server_info and /get_server_info: vLLM's body (`vllm_config`, a string unless
    `config_format=json`, `vllm_env`, `system_env`) merged with the SGLang server's fields
    sglang-router reads at registration and the ones vllm-router's kv_aware discovery reads
    (`model_id`, `model_path`, `instance_id`, `kv_block_size`)."""
    settings, config = state.settings, state.config
    vllm_config = _vllm_config(state)
    name = settings.model_name
    return {
        "vllm_config": vllm_config if config_format == "json" else str(vllm_config),
        "vllm_env": {},
        "system_env": {"mocker_version": __version__},
        # SGLang's server args and scheduler info
        "model_path": settings.model,
        "tokenizer_path": settings.tokenizer or settings.model,
        "served_model_name": name,
        "tp_size": 1,
        "dp_size": settings.data_parallel_size,
        "load_balance_method": "round_robin",
        "disaggregation_mode": "null",
        "page_size": config.block_size,
        "max_running_requests": config.scheduler.max_num_seqs,
        "max_total_num_tokens": config.cache.num_gpu_blocks * config.block_size,
        "max_prefill_tokens": config.scheduler.max_num_batched_tokens,
        "max_req_input_len": config.scheduler.max_model_len - 1,
        "status": "ready",
        "version": __version__,
        # vllm-router's ServerInfo
        "model_id": name,
        "instance_id": state.instance_id,
        "kv_block_size": config.block_size,
    }


def model_info(state: ServerState) -> dict[str, Any]:
    """GET /model_info and /get_model_info: the SGLang server's body."""
    settings = state.settings
    model_type = _model_type(state)
    return {
        "model_path": settings.model,
        "tokenizer_path": settings.tokenizer or settings.model,
        "served_model_name": settings.model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": model_type,
        "architectures": [_ARCHITECTURES.get(model_type, "LlamaForCausalLM")],
    }


def sglang_load(state: ServerState) -> list[dict[str, Any]]:
    """GET /get_load as the SGLang server answers it (sglang-router sums `num_tokens`): one
    entry per data-parallel rank; `num_tokens` is the KV tokens its requests hold."""
    block_size = state.config.block_size
    now = time.perf_counter()
    loads = []
    for rank, engine in enumerate(state.engines):
        snap = engine.snapshot()
        loads.append(
            {
                "rid": None,
                "http_worker_ipc": None,
                "dp_rank": rank,
                "num_reqs": snap.num_running + snap.num_waiting,
                "num_waiting_reqs": snap.num_waiting,
                "num_tokens": snap.num_used_blocks * block_size,
                "ts_tic": now,
            }
        )
    return loads


def total_load(state: ServerState) -> int:
    """Running + waiting requests over every rank (vllm-router's `{"load": n}`)."""
    total = 0
    for engine in state.engines:
        snap = engine.snapshot()
        total += snap.num_running + snap.num_waiting
    return total
