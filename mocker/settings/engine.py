"""Engine settings (shared by `mocker serve` and `mocker replay`): options and the config."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from mocker.config import ConfigError, EngineConfig
from mocker.config_choices import LORA_RANKS, OffloadPolicy
from mocker.kv.hashing import HashAlgo
from mocker.kvevents.config import int_block_hashes
from mocker.model_shape import MODEL_PRESETS
from mocker.settings.deployment import DEPLOYMENT_OPTIONS, deployment_of
from mocker.settings.model_shape import model_shape_from
from mocker.settings.offload import offload_settings
from mocker.settings.option import Option
from mocker.settings.sizing import derived_values, num_gpu_blocks
from mocker.timing.spec import TimingSpec

__all__ = ["ENGINE_OPTIONS", "engine_config_from", "model_shape_from"]

logger = logging.getLogger(__name__)

_D = EngineConfig()

ENGINE_OPTIONS: tuple[Option, ...] = (
    *DEPLOYMENT_OPTIONS,
    Option("block_size", "tokens per KV block (power of two)", _D.block_size, "int"),
    Option(
        "num_gpu_blocks_override",
        "KV blocks in the device cache, instead of what the model leaves on the GPUs (as "
        "vLLM computes it; under --timing-model polynomial: "
        f"{_D.cache.num_gpu_blocks}, or what --kv-cache-memory-bytes holds)",
        None,
        "int",
    ),
    Option(
        "max_num_seqs",
        "most requests running in one pass (default: vLLM's for the GPU, 1024 on one with "
        f"70 GiB or more; {_D.scheduler.max_num_seqs} under --timing-model polynomial)",
        None,
        "int",
    ),
    Option(
        "max_num_batched_tokens",
        "token budget of one pass, shared by prefill chunks and decodes (default: vLLM's for "
        f"the GPU, 8192 on an H100, 16384 on a B200; {_D.scheduler.max_num_batched_tokens} under "
        "--timing-model polynomial)",
        None,
        "int",
    ),
    Option(
        "max_model_len",
        "context length: prompt + output tokens (default: the model's "
        f"max_position_embeddings; {_D.scheduler.max_model_len} without a model config)",
        None,
        "int",
    ),
    Option(
        "enable_prefix_caching",
        "reuse cached KV blocks of shared prompt prefixes",
        _D.cache.enable_prefix_caching,
        "bool",
    ),
    Option(
        "disable_hybrid_kv_cache_manager",
        "keep every layer's KV as full attention's (vLLM's; a Mamba model cannot start)",
        _D.cache.disable_hybrid_kv_cache_manager,
        "flag",
    ),
    Option(
        "enable_chunked_prefill",
        "split long prompts across passes (off: a prompt must fit one pass)",
        _D.scheduler.enable_chunked_prefill,
        "bool",
    ),
    Option("seed", "seed for block hashes and generated tokens", _D.seed, "int"),
    Option(
        "prefix_caching_hash_algo",
        "block hash: fast (mocker's, seeded by --seed) or vLLM's sha256, sha256_cbor, xxhash, "
        "xxhash_cbor (identical to vLLM's for the same $PYTHONHASHSEED)",
        _D.cache.prefix_caching_hash_algo,
        "str",
        choices=tuple(a.value for a in HashAlgo),
    ),
    Option(
        "speedup_ratio",
        "divide every simulated duration by this (mocker)",
        _D.speedup_ratio,
        "float",
    ),
    Option(
        "timing_profile",
        "a correction profile written by `mocker calibrate` (.json), applied to every pass; or "
        "a measured latency profile in Dynamo's NPZ layout (.npz), which replaces the timing "
        "model (mocker)",
        None,
        "str",
        metavar="FILE",
    ),
    Option(
        "model_shape",
        "model dimensions that size KV blocks, instead of --model's: a preset ("
        + ", ".join(MODEL_PRESETS)
        + "), or a custom shape as a JSON object or a .json/.yaml file (docs/hybrid.md); "
        "default: --model's config (llama-3-8b under --timing-model polynomial) (mocker)",
        None,
        "json",
        metavar="NAME|JSON|FILE",
    ),
    Option(
        "kv_cache_memory_bytes",
        "bytes of device KV cache (vLLM's, instead of --gpu-memory-utilization): as many "
        "blocks as that holds at the model shape's bytes a block; "
        "--num-gpu-blocks-override wins if both are given",
        None,
        "int",
        metavar="BYTES",
    ),
    Option(
        "long_prefill_token_threshold",
        "a prompt computes at most this many tokens a pass (0: as many as the budget allows), "
        "so long prompts take more, shorter passes beside the decodes",
        _D.scheduler.long_prefill_token_threshold,
        "int",
    ),
    Option(
        "scheduling_policy",
        "fcfs: requests run in arrival order, and one with a priority other than 0 is "
        "refused (400); priority: waiting requests run by (priority, arrival), lower first, "
        "and the running request with the highest (priority, arrival) is preempted",
        _D.scheduler.scheduling_policy.value,
        "str",
        choices=("fcfs", "priority"),
    ),
    Option(
        "preemption_victim",
        "running request preempted when a block cannot be allocated under fcfs (mocker)",
        _D.scheduler.preemption_victim.value,
        "str",
        choices=("newest", "oldest"),
    ),
    Option(
        "eviction_policy",
        "which free cached block is reused first (mocker)",
        _D.cache.eviction_policy.value,
        "str",
        choices=("lru", "lineage"),
    ),
    Option(
        "eos_probability",
        "chance that each generated token after min_tokens is EOS; 0 runs every request to "
        "max_tokens (mocker)",
        _D.output.eos_probability,
        "float",
    ),
    # CPU tier (KVBM G2; vLLM CPU offloading). The flag names are vLLM's and KVBM's.
    Option(
        "kv_offloading_size",
        "GiB of CPU memory for offloaded KV blocks (the CPU tier; blocks = bytes / block bytes)",
        None,
        "float",
        metavar="GIB",
    ),
    Option(
        "kv_offloading_backend",
        "what --kv-offloading-size sizes: native, vLLM's OffloadingConnector (write-through "
        "stores); lmcache is not modelled",
        "native",
        "str",
        choices=("native", "lmcache"),
    ),
    Option(
        "num_host_blocks",
        "KV blocks in the CPU tier, instead of --kv-offloading-size (mocker)",
        None,
        "int",
    ),
    Option(
        "offload_policy",
        "evict: copy a cached block to the CPU tier when the device evicts it (KVBM); "
        "write-through: copy new full prompt blocks after their pass (vLLM "
        "OffloadingConnector); auto: write-through for --kv-offloading-size (as vLLM), evict "
        "for --num-host-blocks (mocker)",
        "auto",
        "str",
        choices=("auto", *(p.value for p in OffloadPolicy)),
    ),
    Option(
        "host_d2h_bandwidth_gbps",
        "device-to-CPU bandwidth, GB/s (10^9 bytes/s); <= 0: instant (mocker)",
        _D.offload.cpu_write_gbps,
        "float",
    ),
    Option(
        "host_h2d_bandwidth_gbps",
        "CPU-to-device bandwidth, GB/s (10^9 bytes/s); <= 0: instant (mocker)",
        _D.offload.cpu_read_gbps,
        "float",
    ),
    Option(
        "offload_batch_size",
        "most blocks per device-to-CPU transfer (mocker)",
        _D.offload.offload_batch_size,
        "int",
    ),
    Option(
        "transfer_latency_ms",
        "fixed latency added to every device <-> CPU transfer, ms (mocker)",
        _D.offload.transfer_latency_ms,
        "float",
    ),
    Option(
        "min_load_blocks",
        "shortest tier hit worth loading; shorter ones are recomputed (mocker)",
        _D.offload.min_load_blocks,
        "int",
    ),
    Option(
        "load_timeout",
        "seconds a load from the tiers may take before the request recomputes instead "
        "(simulated: divided by the speedup ratio) (mocker)",
        _D.offload.load_timeout,
        "float",
        metavar="SECONDS",
    ),
    Option(
        "enable_lora",
        "serve LoRA adapters (--lora-modules, runtime loading)",
        _D.lora.enable_lora,
        "bool",
    ),
    Option("max_loras", "most distinct LoRA adapters in one batch", _D.lora.max_loras, "int"),
    Option("max_cpu_loras", "LoRA adapters cached on the CPU (default: --max-loras)", None, "int"),
    Option(
        "max_lora_rank",
        "highest LoRA rank served: " + ", ".join(map(str, LORA_RANKS)),
        _D.lora.max_lora_rank,
        "int",
    ),
    Option(
        "lora_load_ms",
        "ms a batch waits to copy a cold LoRA adapter from the CPU cache to a GPU slot (mocker)",
        _D.lora.lora_load_ms,
        "float",
    ),
    Option(
        "lora_disk_load_ms",
        "ms more when the adapter is not in the CPU cache either (read from disk) (mocker)",
        _D.lora.lora_disk_load_ms,
        "float",
    ),
    Option(
        "kv_transfer_config",
        "vLLM's KV connector config as JSON; OffloadingConnector builds the CPU tier "
        "(cpu_bytes_to_use) and its secondary_tiers (fs, obj); NixlConnector with kv_role "
        "kv_producer / kv_consumer / kv_both makes a P/D prefill or decode engine; see "
        "docs/offload.md and docs/disaggregation.md",
        None,
        "str",
        metavar="JSON",
    ),
)


def engine_config_from(values: Mapping[str, Any], **extra: Any) -> EngineConfig:
    """The engine configuration from resolved option values (validated)."""
    dep = deployment_of(values)
    values = derived_values(values, dep)
    offload = offload_settings(values)
    config = EngineConfig.of(
        block_size=values["block_size"],
        num_gpu_blocks=num_gpu_blocks(values, dep),
        max_num_seqs=values["max_num_seqs"],
        max_num_batched_tokens=values["max_num_batched_tokens"],
        max_model_len=values["max_model_len"],
        enable_prefix_caching=values["enable_prefix_caching"],
        enable_chunked_prefill=values["enable_chunked_prefill"],
        disable_hybrid_kv_cache_manager=values["disable_hybrid_kv_cache_manager"]
        or offload.pop("disable_hybrid_kv_cache_manager", False),
        seed=values["seed"],
        prefix_caching_hash_algo=values["prefix_caching_hash_algo"],
        int_block_hashes=int_block_hashes(os.environ),
        enable_lora=values["enable_lora"],
        max_loras=values["max_loras"],
        max_cpu_loras=values["max_cpu_loras"] if (values["max_cpu_loras"] or 0) > 0 else None,
        max_lora_rank=values["max_lora_rank"],
        lora_load_ms=values["lora_load_ms"],
        lora_disk_load_ms=values["lora_disk_load_ms"],
        speedup_ratio=values["speedup_ratio"],
        timing=TimingSpec.with_profile(values["timing_model"], dep, values["timing_profile"]),
        model=values["_shape"],
        preemption_victim=values["preemption_victim"],
        scheduling_policy=values["scheduling_policy"],
        long_prefill_token_threshold=values["long_prefill_token_threshold"],
        eviction_policy=values["eviction_policy"],
        eos_probability=values["eos_probability"],
        kv_offloading_size=values["kv_offloading_size"],
        cpu_write_gbps=values["host_d2h_bandwidth_gbps"],
        cpu_read_gbps=values["host_h2d_bandwidth_gbps"],
        offload_batch_size=values["offload_batch_size"],
        transfer_latency_ms=values["transfer_latency_ms"],
        load_timeout=values["load_timeout"],
        **offload,
        **extra,
    )
    if config.cache.disable_hybrid_kv_cache_manager and values["_shape"].layer_types:
        logger.warning(
            "Hybrid KV cache manager is disabled for this hybrid model, This means we do not "
            "enable any optimizations for saving KV cache memory (e.g., dropping the KV cache "
            "outside the sliding window). The compute of layers like sliding window is still "
            "saved."
        )
    if config.block_size != values["block_size"]:
        logger.info(
            "Setting attention block size to %d tokens to ensure that attention page size is "
            ">= mamba page size (the model's Mamba state is %d bytes per layer).",
            config.block_size,
            config.model.mamba_state_bytes,
        )
    if config.is_hybrid:
        # vLLM sums every group's max_memory_usage: a request at max_model_len must fit.
        need = config.layout.max_blocks_per_request(
            config.scheduler.max_model_len,
            config.scheduler.max_num_batched_tokens,
            config.cache.enable_prefix_caching,
        )
        if need > config.cache.num_gpu_blocks:
            raise ConfigError(
                f"max_model_len ({config.scheduler.max_model_len}) needs {need} KV blocks of "
                f"{config.block_size} tokens across the model's {len(config.layout.groups)} "
                f"KV cache groups, but num_gpu_blocks_override is {config.cache.num_gpu_blocks}: "
                "lower --max-model-len or raise --num-gpu-blocks-override"
            )
        return config
    kv_tokens = config.cache.num_gpu_blocks * config.block_size
    if kv_tokens < config.scheduler.max_model_len:
        # As vLLM refuses to start: a request using the whole context could never run.
        raise ConfigError(
            f"max_model_len ({config.scheduler.max_model_len}) is larger than the KV cache holds "
            f"({kv_tokens} tokens = num_gpu_blocks_override {config.cache.num_gpu_blocks} × "
            f"block_size {config.block_size}): lower --max-model-len or raise "
            "--num-gpu-blocks-override"
        )
    return config
