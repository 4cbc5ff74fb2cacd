"""EngineConfig's start-up checks that span areas: the model's KV layout from the cache
settings, the engine-wide settings, and combinations refused as vLLM refuses them."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from mocker.config_areas import CacheConfig, KVTransferConfig, OffloadConfig, SchedulerConfig
from mocker.config_choices import EvictionPolicyName, KVRole, OffloadPolicy
from mocker.errors import ConfigError
from mocker.kv.spec import KVLayout, SpecKind, kv_layout, layer_kind
from mocker.model_shape import ModelShape
from mocker.validation import fail, int_in

__all__ = [
    "SPEEDUP_RANGE",
    "CheckedConfig",
    "check_combinations",
    "check_engine",
    "model_and_layout",
]

# Below a thousandth of real speed a pass would hold its requests for hours (a tiny ratio
# wedges a server); above 10^12 every pass takes no time at all.
SPEEDUP_RANGE = (1e-3, 1e12)


class CheckedConfig(Protocol):
    """What the checks across areas read of an EngineConfig (mocker.config imports this
    module, not back)."""

    @property
    def layout(self) -> KVLayout: ...
    @property
    def cache(self) -> CacheConfig: ...
    @property
    def scheduler(self) -> SchedulerConfig: ...
    @property
    def offload(self) -> OffloadConfig: ...
    @property
    def transfer(self) -> KVTransferConfig: ...
    @property
    def unit_bytes(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...


def model_and_layout(cache: CacheConfig, model: ModelShape) -> tuple[ModelShape, KVLayout]:
    """The model the engine keeps and its KV layout, the given block size checked."""
    bs = cache.block_size
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        fail("block_size", bs, "must be a power of two in [1, 1024]")
    if not isinstance(model, ModelShape):
        fail("model", model, "must be a ModelShape")
    if cache.disable_hybrid_kv_cache_manager and model.layer_types:
        if any(layer_kind(t) is SpecKind.MAMBA for t in model.layer_types):
            fail("disable_hybrid_kv_cache_manager", True,
                 "a model with Mamba layers needs the hybrid KV cache manager (vLLM's "
                 "hybrid SSM models fail at start-up without it)")  # fmt: skip
        model = replace(model, layer_types=(), sliding_window=None)
    layout = kv_layout(model, bs)
    # A hybrid model with Mamba layers enlarges the block (vLLM's "Setting attention
    # block size to N tokens ..."): the given size is then replaced by the aligned one,
    # and the given one kept (`with_changes` starts from it again). An aligned size
    # given as such stands.
    if (bs & (bs - 1) or bs > 1024) and not (
        layout.has_mamba and any(kv_layout(model, 1 << k).block_size == bs for k in range(11))
    ):
        fail("block_size", bs, "must be a power of two in [1, 1024]")
    return model, layout


def check_engine(speedup_ratio: float, seed: int) -> None:
    """The engine-wide settings: the speedup ratio and the seed."""
    lo, hi = SPEEDUP_RANGE
    sr = speedup_ratio
    if isinstance(sr, bool) or not isinstance(sr, int | float) or not (lo <= sr <= hi):
        fail("speedup_ratio", sr, f"must be in [{lo:g}, {hi:g}]")
    int_in("seed", seed, 0, 1 << 63)


def check_combinations(cfg: CheckedConfig) -> None:
    """Settings valid alone that do not go together, refused as vLLM does at start-up."""
    layout, offload = cfg.layout, cfg.offload
    max_model_len = cfg.scheduler.max_model_len
    if layout.is_hybrid and cfg.transfer.kv_role is not KVRole.NONE:
        raise ConfigError(
            "a hybrid model shape (KV cache groups of several kinds) with P/D "
            "(NixlConnector) is not supported yet: use a dense --model-shape, or drop the "
            "connector"
        )
    if layout.is_hybrid and offload.num_cpu_blocks:
        _check_hybrid_offload(cfg)
    if layout.is_hybrid and cfg.cache.eviction_policy is EvictionPolicyName.LINEAGE:
        # Lineage counts a block's cached children along one prefix chain; a window's and
        # a Mamba group's blocks are cached out of chain order.
        raise ConfigError(
            "eviction_policy lineage follows one prefix chain per block and is not "
            "modelled for a hybrid model's KV cache groups: use lru (vLLM's)"
        )
    if layout.block_size > max_model_len:
        raise ConfigError(
            f"the model's Mamba state needs blocks of {layout.block_size} tokens, more than "
            f"max_model_len ({max_model_len}): no block would ever fill; raise "
            "max_model_len or check mamba_state_bytes"
        )
    if offload.num_cpu_blocks and not cfg.cache.enable_prefix_caching:
        raise ConfigError(
            f"a CPU tier (num_cpu_blocks={offload.num_cpu_blocks}) needs prefix caching: "
            "offloaded blocks are found again by their prefix hashes; drop "
            "--no-enable-prefix-caching or the CPU tier"
        )


def _check_hybrid_offload(cfg: CheckedConfig) -> None:
    offload, max_model_len = cfg.offload, cfg.scheduler.max_model_len
    if offload.offload_policy is not OffloadPolicy.WRITE_THROUGH:
        raise ConfigError(
            "a hybrid model's KV is offloaded as vLLM's OffloadingConnector does it "
            "(write-through, whole chunks of every group): use --offload-policy "
            "write-through or an OffloadingConnector --kv-transfer-config"
        )
    bs = cfg.layout.block_size
    chunk = offload.hybrid_chunk_size if offload.hybrid_chunk_size is not None else bs
    int_in("hybrid_chunk_size", chunk, 1, 1 << 24)
    if chunk % bs:
        fail("hybrid_chunk_size", chunk, f"must be a multiple of the block size ({bs})")
    if chunk >= max_model_len:
        # A chunk is stored once a prompt has computed all of it, and a prompt's last
        # token is never cached: no prompt within max_model_len could fill one.
        best = (max_model_len - 1) // bs * bs
        hint = f"use hybrid_chunk_size {best}" if best else f"raise max_model_len above {bs}"
        raise ConfigError(
            f"hybrid_chunk_size ({chunk}) leaves no chunk that can ever be stored with "
            f"max_model_len {max_model_len} (the first chunk needs {chunk + 1} "
            f"tokens): {hint}"
        )
    need = cfg.unit_bytes // cfg.block_bytes
    for name, blocks in (("the CPU tier", offload.num_cpu_blocks),
                         *((f"secondary tier {t.name}", t.capacity_blocks)
                           for t in offload.storage_tiers)):  # fmt: skip
        if blocks < need:
            raise ConfigError(
                f"{name} ({blocks} blocks) holds no chunk: one needs {need} blocks' worth "
                f"(every KV cache group's share of {chunk} tokens): raise it"
            )
