"""What the deployment decides when the flags do not: the KV layout, the context length, the
scheduler's limits (as vLLM derives them) and the device's blocks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mocker.config import EngineConfig
from mocker.deployment import Deployment, kv_capacity
from mocker.deployment.capacity import block_share
from mocker.errors import ConfigError
from mocker.kv.spec import kv_layout
from mocker.model_shape import MODEL_PRESETS
from mocker.settings.deployment import arch_shape, scheduler_defaults
from mocker.settings.model_shape import model_shape_from

__all__ = ["derived_values", "num_gpu_blocks"]

_D = EngineConfig()


def num_gpu_blocks(values: Mapping[str, Any], dep: Deployment | None) -> int:
    """Device blocks: --num-gpu-blocks-override, else what --kv-cache-memory-bytes holds (on
    each GPU, as vLLM's), else what the deployment leaves for the KV cache (as vLLM
    computes it), else the polynomial's fixed default."""
    blocks, nbytes = values["num_gpu_blocks_override"], values["kv_cache_memory_bytes"]
    layout = kv_layout(values["_shape"], values["block_size"])
    if blocks is not None:
        if dep is not None:
            # As vLLM, a deployment that leaves no memory for a KV cache is refused anyway.
            kv_capacity(dep, block_size=layout.block_size, block_bytes=layout.block_bytes,
                        max_num_batched_tokens=values["max_num_batched_tokens"],
                        max_num_seqs=values["max_num_seqs"], max_model_len=1)  # fmt: skip
        return int(blocks)
    if nbytes is not None:
        block_bytes = layout.block_bytes
        if dep is not None:
            block_bytes = max(1, int(block_bytes * block_share(dep)))
        if nbytes < block_bytes:
            raise ConfigError(
                f"invalid kv_cache_memory_bytes={nbytes!r}: holds no block of {block_bytes} bytes"
            )
        return int(nbytes // block_bytes)
    if dep is None:
        return _D.cache.num_gpu_blocks
    capacity = kv_capacity(
        dep,
        block_size=layout.block_size,
        block_bytes=layout.block_bytes,
        max_num_batched_tokens=values["max_num_batched_tokens"],
        max_num_seqs=values["max_num_seqs"],
        max_model_len=values["max_model_len"],
    )
    return capacity.num_gpu_blocks


def derived_values(values: Mapping[str, Any], dep: Deployment | None) -> dict[str, Any]:
    """The option values with what the deployment decides filled in (as vLLM fills them):
    the KV layout, the context length and the scheduler's limits."""
    out = dict(values)
    bs = values["block_size"]
    if isinstance(bs, bool) or not isinstance(bs, int) or not 1 <= bs <= 1 << 16:
        raise ConfigError(f"invalid block_size={bs!r}: must be a power of two in [1, 1024]")
    if values["model_shape"] is not None:
        out["_shape"] = model_shape_from(values["model_shape"])
    elif dep is not None:
        out["_shape"] = arch_shape(dep)
    else:
        out["_shape"] = MODEL_PRESETS["llama-3-8b"]
    tokens, seqs = (
        (_D.scheduler.max_num_batched_tokens, _D.scheduler.max_num_seqs)
        if dep is None
        else (scheduler_defaults(dep))
    )
    if out["max_num_batched_tokens"] is None:
        out["max_num_batched_tokens"] = tokens
    if out["max_num_seqs"] is None:
        out["max_num_seqs"] = seqs
    if out["max_model_len"] is None:
        out["max_model_len"] = (
            dep.model.max_position_embeddings if dep is not None else _D.scheduler.max_model_len
        )
    return out
