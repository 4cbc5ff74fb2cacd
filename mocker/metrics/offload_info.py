"""vLLM 0.34's vllm:kv_offload_config_info: the CPU tier's static facts, one series a tier."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import GaugeMetricFamily

from mocker.config import EngineConfig
from mocker.kv.spec import SpecKind

__all__ = ["INFO_KEYS", "cpu_tier_facts", "offload_config_info"]

# CPUOffloadingInfo's fields (vllm/v1/kv_offload/cpu/common.py), in order.
INFO_KEYS = ("cpu_num_chunks", "cpu_blocks_per_chunk", "cpu_kv_cache_size_bytes",
             "cpu_kv_cache_size_tokens")  # fmt: skip
_HELP = (
    "Static configuration of the KV offload managers of this engine instance. The configured "
    "offloading spec declares the label names, and each manager fills the values, so a series "
    "appears from the first scheduler step of its engine. A manager reports one series for "
    "each configuration it holds, and a label of its own tells the series apart. Each engine "
    "reports its own configuration, not the instance total."
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cpu_tier_facts(config: EngineConfig) -> dict[str, str]:
    """The CPU tier's chunks, device blocks a chunk, bytes, and the tokens it holds of
    requests of max_model_len (each group's chunks a request, a window's capped)."""
    per_chunk = max(config.offload.chunk_blocks, config.unit_blocks)
    chunks = config.offload.num_cpu_blocks // per_chunk
    chunk_bytes = config.unit_bytes if config.is_hybrid else per_chunk * config.block_bytes
    chunk_tokens = per_chunk * config.block_size
    per_request = 0
    for group in config.layout.groups:
        n = _cdiv(config.scheduler.max_model_len, chunk_tokens)
        if group.kind is SpecKind.MAMBA:
            n = 1
        elif group.sliding_window is not None:
            window = group.sliding_window
            n = min(n, max(_cdiv(window, chunk_tokens), _cdiv(window - 1, chunk_tokens)))
        per_request += n
    return {
        "cpu_num_chunks": str(chunks),
        "cpu_blocks_per_chunk": str(per_chunk),
        "cpu_kv_cache_size_bytes": str(chunks * chunk_bytes),
        "cpu_kv_cache_size_tokens": str(chunks * config.scheduler.max_model_len // per_request),
    }


def offload_config_info(
    configs: Sequence[tuple[str, EngineConfig]], model_name: str
) -> GaugeMetricFamily:
    """One series an engine for the CPU tier (and, tiering, one a secondary tier, whose
    facts are empty: vLLM's fs and obj tiers declare none), labelled with its tier."""
    tiered = any(config.offload.storage_tiers for _, config in configs)
    keys = [*INFO_KEYS, "tier"] if tiered else list(INFO_KEYS)
    family = GaugeMetricFamily("vllm:kv_offload_config_info", _HELP,
                               labels=["model_name", "engine", *keys])  # fmt: skip
    for engine, config in configs:
        facts = cpu_tier_facts(config)
        if not tiered:
            family.add_metric([model_name, engine, *facts.values()], 1.0)
            continue
        family.add_metric([model_name, engine, *facts.values(), "0:primary"], 1.0)
        for i, tier in enumerate(config.offload.storage_tiers):
            family.add_metric([model_name, engine, *([""] * len(INFO_KEYS)),
                               f"{i + 1}:{tier.name}"], 1.0)  # fmt: skip
    return family
