"""The CPU tier and the tiers below it, from the offloading flags or an OffloadingConnector
`--kv-transfer-config` (resolved option values in, EngineConfig fields out)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from mocker.config import ConfigError
from mocker.config_choices import OffloadPolicy
from mocker.kv.spec import kv_layout
from mocker.settings.kv_transfer import NO_HMA, parse_kv_transfer_config

__all__ = ["offload_settings"]

logger = logging.getLogger("mocker.settings.engine")


def _num_host_blocks(values: Mapping[str, Any]) -> int:
    """CPU-tier blocks from --num-host-blocks or --kv-offloading-size GiB (not both)."""
    blocks, gib = values["num_host_blocks"], values["kv_offloading_size"]
    if blocks is not None and gib is not None:
        raise ConfigError(
            "set either --num-host-blocks or --kv-offloading-size, not both: they size the same "
            "CPU tier"
        )
    if gib is not None:
        if gib < 0:
            raise ConfigError(f"invalid kv_offloading_size={gib!r}: must be >= 0 GiB")
        # One device block's bytes (a hybrid's: a page per layer slot of a group).
        block_bytes = kv_layout(values["_shape"], values["block_size"]).block_bytes
        blocks = int(gib * 2**30 // block_bytes)
        if gib > 0 and blocks == 0:
            raise ConfigError(
                f"kv_offloading_size={gib!r} GiB holds no block of {block_bytes} bytes: raise it"
            )
        return blocks
    if blocks is not None and blocks < 0:
        raise ConfigError(f"invalid num_host_blocks={blocks!r}: must be >= 0")
    return blocks or 0


def offload_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """Tier settings: from an OffloadingConnector --kv-transfer-config, or the flags."""
    # The engine's block (a Mamba hybrid's is enlarged) and its bytes: a tier's capacity is
    # counted in those.
    layout = kv_layout(values["_shape"], values["block_size"])
    offload = parse_kv_transfer_config(
        values["kv_transfer_config"],
        layout.block_size,
        layout.block_bytes // layout.block_size,
        needs_hma=layout.has_mamba,
    )
    no_hma = offload.pop(NO_HMA, None)
    if no_hma is not None and layout.is_hybrid:
        logger.warning(
            "Turning off hybrid kv cache manager because `--kv-transfer-config` selects a KV "
            "connector that does not support it (%s): models with sliding window attention "
            "run with every layer's KV kept.",
            no_hma,
        )
        offload["disable_hybrid_kv_cache_manager"] = True
    chunk = offload.get("hybrid_chunk_size")
    if chunk is not None and not layout.is_hybrid:
        logger.warning("hybrid_chunk_size %d is ignored: the model has one KV cache group", chunk)
        del offload["hybrid_chunk_size"]
    elif chunk is not None and chunk % layout.block_size:
        # vLLM's planner warns when a group's block size does not divide the chunk.
        rounded = max(chunk // layout.block_size, 1) * layout.block_size
        logger.warning(
            "hybrid_chunk_size %d is not a multiple of the KV cache groups' block size %d: "
            "using %d",
            chunk,
            layout.block_size,
            rounded,
        )
        offload["hybrid_chunk_size"] = rounded
    if "num_cpu_blocks" not in offload:  # no OffloadingConnector (none, or P/D alone)
        if values["kv_offloading_backend"] == "lmcache" and values["kv_offloading_size"]:
            raise ConfigError(
                "--kv-offloading-backend lmcache (vLLM's LMCacheMPConnector) is not modelled "
                "by mocker: use native, vLLM's OffloadingConnector"
            )
        policy = values["offload_policy"]
        if policy == "auto":  # vLLM turns --kv-offloading-size into an OffloadingConnector
            sized = values["kv_offloading_size"] is not None
            policy = (OffloadPolicy.WRITE_THROUGH if sized else OffloadPolicy.EVICT).value
        return {"num_cpu_blocks": _num_host_blocks(values), "offload_policy": policy,
                "min_load_blocks": values["min_load_blocks"], **offload}  # fmt: skip
    for flag in ("num_host_blocks", "kv_offloading_size"):
        if values[flag] is not None:
            raise ConfigError(
                f"set either --{flag.replace('_', '-')} or an OffloadingConnector "
                "--kv-transfer-config (cpu_bytes_to_use), not both: they size the same CPU tier"
            )
    offload["min_load_blocks"] = max(offload.get("min_load_blocks", 1), values["min_load_blocks"])
    return dict(offload)
