"""EngineConfig's start-up checks, by area, in the order its __post_init__ runs them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum
from typing import Protocol

from mocker.config_choices import (
    LORA_RANKS,
    EvictionPolicyName,
    KVRole,
    OffloadPolicy,
    PreemptionVictim,
    SchedulingPolicy,
)
from mocker.errors import ConfigError
from mocker.kv.hashing import HashAlgo
from mocker.kv.spec import KVLayout, SpecKind, kv_layout, layer_kind
from mocker.model_shape import ModelShape
from mocker.storage_spec import StorageTierSpec
from mocker.validation import fail, finite, int_in

__all__ = [
    "SPEEDUP_RANGE",
    "CheckedConfig",
    "check_choices",
    "check_combinations",
    "check_lora",
    "check_offload",
    "check_sizes",
    "check_speed_and_eos",
    "check_transfer",
    "model_and_layout",
]

_HASH_ALGOS = tuple(a.value for a in HashAlgo)
# Below a thousandth of real speed a pass would hold its requests for hours (a tiny ratio
# wedges a server); above 10^12 every pass takes no time at all.
SPEEDUP_RANGE = (1e-3, 1e12)


class CheckedConfig(Protocol):
    """The EngineConfig fields the checks read (mocker.config imports this module, not back)."""

    @property
    def block_size(self) -> int: ...
    @property
    def model(self) -> ModelShape: ...
    @property
    def disable_hybrid_kv_cache_manager(self) -> bool: ...
    @property
    def layout(self) -> KVLayout: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def long_prefill_token_threshold(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> int: ...
    @property
    def enable_prefix_caching(self) -> bool: ...
    @property
    def enable_chunked_prefill(self) -> bool: ...
    @property
    def prefix_caching_hash_algo(self) -> str: ...
    @property
    def eviction_policy(self) -> EvictionPolicyName: ...
    @property
    def enable_lora(self) -> bool: ...
    @property
    def max_loras(self) -> int: ...
    @property
    def max_cpu_loras(self) -> int | None: ...
    @property
    def max_lora_rank(self) -> int: ...
    @property
    def lora_load_ms(self) -> float: ...
    @property
    def lora_disk_load_ms(self) -> float: ...
    @property
    def num_cpu_blocks(self) -> int: ...
    @property
    def offload_policy(self) -> OffloadPolicy: ...
    @property
    def offload_batch_size(self) -> int: ...
    @property
    def min_load_blocks(self) -> int: ...
    @property
    def transfer_latency_ms(self) -> float: ...
    @property
    def kv_offloading_size(self) -> float | None: ...
    @property
    def load_timeout(self) -> float: ...
    @property
    def storage_tiers(self) -> Sequence[StorageTierSpec]: ...
    @property
    def hybrid_chunk_size(self) -> int | None: ...
    @property
    def unit_bytes(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def kv_role(self) -> KVRole: ...
    @property
    def kv_transfer_mode(self) -> str: ...
    @property
    def kv_engine_id(self) -> str: ...
    @property
    def pull_gbps(self) -> float: ...
    @property
    def pull_latency_ms(self) -> float: ...
    @property
    def speedup_ratio(self) -> float: ...
    @property
    def eos_probability(self) -> float: ...


def model_and_layout(cfg: CheckedConfig) -> tuple[ModelShape, KVLayout]:
    """The model the engine keeps and its KV layout, the given block size checked."""
    bs = cfg.block_size
    if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
        fail("block_size", bs, "must be a power of two in [1, 1024]")
    model = cfg.model
    if not isinstance(model, ModelShape):
        fail("model", model, "must be a ModelShape")
    if cfg.disable_hybrid_kv_cache_manager and model.layer_types:
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


def check_sizes(cfg: CheckedConfig) -> None:
    """The pool, the batch, the sequence and the vocabulary."""
    int_in("num_gpu_blocks", cfg.num_gpu_blocks, 1, 1 << 26)
    int_in("max_num_seqs", cfg.max_num_seqs, 1, 1 << 20)
    int_in("max_num_batched_tokens", cfg.max_num_batched_tokens, 1, 1 << 24)
    int_in("long_prefill_token_threshold", cfg.long_prefill_token_threshold, 0, 1 << 24)
    int_in("max_model_len", cfg.max_model_len, 1, 1 << 24)
    int_in("seed", cfg.seed, 0, 1 << 63)
    int_in("vocab_size", cfg.vocab_size, 2, 1 << 31)
    int_in("eos_token_id", cfg.eos_token_id, 0, cfg.vocab_size - 1)


def check_choices(cfg: CheckedConfig) -> None:
    """The switches, the hash algorithm, and the policies (made their enums in place)."""
    for name in ("enable_prefix_caching", "enable_chunked_prefill", "enable_kv_cache_events",
                 "offload_prompt_only", "self_describing_kv_events"):  # fmt: skip
        if not isinstance(getattr(cfg, name), bool):
            fail(name, getattr(cfg, name), "must be true or false")
    if cfg.prefix_caching_hash_algo not in _HASH_ALGOS:
        fail("prefix_caching_hash_algo", cfg.prefix_caching_hash_algo,
             "must be one of " + ", ".join(_HASH_ALGOS))  # fmt: skip
    _coerce_enum(cfg, "preemption_victim", PreemptionVictim)
    _coerce_enum(cfg, "scheduling_policy", SchedulingPolicy)
    _coerce_enum(cfg, "eviction_policy", EvictionPolicyName)
    _coerce_enum(cfg, "offload_policy", OffloadPolicy)


def check_lora(cfg: CheckedConfig) -> None:
    """The adapter slots, the CPU cache of adapters, their load times, the rank."""
    if not isinstance(cfg.enable_lora, bool):
        fail("enable_lora", cfg.enable_lora, "must be true or false")
    int_in("max_loras", cfg.max_loras, 1, 1 << 16)
    if cfg.max_cpu_loras is not None:
        int_in("max_cpu_loras", cfg.max_cpu_loras, 1, 1 << 16)
        if cfg.max_cpu_loras < cfg.max_loras:
            raise ConfigError(
                f"max_cpu_loras ({cfg.max_cpu_loras}) must be >= max_loras ({cfg.max_loras})"
            )
    finite("lora_load_ms", cfg.lora_load_ms, minimum=0.0)
    finite("lora_disk_load_ms", cfg.lora_disk_load_ms, minimum=0.0)
    if cfg.max_lora_rank not in LORA_RANKS:
        fail("max_lora_rank", cfg.max_lora_rank,
             "must be one of " + ", ".join(map(str, LORA_RANKS)))  # fmt: skip


def check_offload(cfg: CheckedConfig) -> None:
    """The CPU tier's transfers: batches, links, latency, size in GiB, the load timeout."""
    int_in("offload_batch_size", cfg.offload_batch_size, 1, 1 << 20)
    int_in("min_load_blocks", cfg.min_load_blocks, 1, 1 << 30)
    for name in ("cpu_write_gbps", "cpu_read_gbps"):
        finite(name, getattr(cfg, name))
    finite("transfer_latency_ms", cfg.transfer_latency_ms, minimum=0.0)
    if cfg.kv_offloading_size is not None:
        finite("kv_offloading_size", cfg.kv_offloading_size, minimum=0.0)
    finite("load_timeout", cfg.load_timeout, minimum=0.0)
    if cfg.load_timeout <= 0:
        fail("load_timeout", cfg.load_timeout, "must be > 0")


def check_transfer(cfg: CheckedConfig) -> None:
    """P/D: the role (made its enum in place), the mode, the engine id, the pull link."""
    _coerce_enum(cfg, "kv_role", KVRole)
    if cfg.kv_transfer_mode not in ("pull", "push"):
        fail("kv_transfer_mode", cfg.kv_transfer_mode, "must be pull or push")
    if not isinstance(cfg.kv_engine_id, str):
        fail("kv_engine_id", cfg.kv_engine_id, "must be a string")
    finite("pull_gbps", cfg.pull_gbps)
    finite("pull_latency_ms", cfg.pull_latency_ms, minimum=0.0)
    for name in ("pull_timeout", "hold_timeout"):
        finite(name, getattr(cfg, name), minimum=0.0)
        if getattr(cfg, name) <= 0:
            fail(name, getattr(cfg, name), "must be > 0")


def check_speed_and_eos(cfg: CheckedConfig) -> None:
    """The speedup ratio and the EOS probability."""
    sr = cfg.speedup_ratio
    lo, hi = SPEEDUP_RANGE
    if isinstance(sr, bool) or not isinstance(sr, int | float) or not (lo <= sr <= hi):
        fail("speedup_ratio", sr, f"must be in [{lo:g}, {hi:g}]")
    ep = cfg.eos_probability
    if isinstance(ep, bool) or not isinstance(ep, int | float) or not (0.0 <= ep <= 1.0):
        fail("eos_probability", ep, "must be in [0, 1]")


def check_combinations(cfg: CheckedConfig) -> None:
    """Settings valid alone that do not go together, refused as vLLM does at start-up."""
    layout = cfg.layout
    if layout.is_hybrid and cfg.kv_role is not KVRole.NONE:
        raise ConfigError(
            "a hybrid model shape (KV cache groups of several kinds) with P/D "
            "(NixlConnector) is not supported yet: use a dense --model-shape, or drop the "
            "connector"
        )
    if layout.is_hybrid and cfg.num_cpu_blocks:
        _check_hybrid_offload(cfg)
    if layout.is_hybrid and cfg.eviction_policy is EvictionPolicyName.LINEAGE:
        # Lineage counts a block's cached children along one prefix chain; a window's and
        # a Mamba group's blocks are cached out of chain order.
        raise ConfigError(
            "eviction_policy lineage follows one prefix chain per block and is not "
            "modelled for a hybrid model's KV cache groups: use lru (vLLM's)"
        )
    if layout.block_size > cfg.max_model_len:
        raise ConfigError(
            f"the model's Mamba state needs blocks of {layout.block_size} tokens, more than "
            f"max_model_len ({cfg.max_model_len}): no block would ever fill; raise "
            "max_model_len or check mamba_state_bytes"
        )
    if cfg.num_cpu_blocks and not cfg.enable_prefix_caching:
        raise ConfigError(
            f"a CPU tier (num_cpu_blocks={cfg.num_cpu_blocks}) needs prefix caching: "
            "offloaded blocks are found again by their prefix hashes; drop "
            "--no-enable-prefix-caching or the CPU tier"
        )
    if cfg.storage_tiers and not cfg.num_cpu_blocks:
        raise ConfigError(
            "secondary tiers need a CPU tier: every store cascades from it and every load "
            "is staged through it; set cpu_bytes_to_use (or --num-host-blocks)"
        )
    kinds = [t.kind for t in cfg.storage_tiers]
    if len(set(kinds)) != len(kinds):
        raise ConfigError(f"secondary_tiers: each type at most once, got {[str(k) for k in kinds]}")
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ConfigError(
            f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be >= "
            f"max_num_seqs ({cfg.max_num_seqs}): every running request needs one token "
            "of the per-pass budget"
        )
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ConfigError(
            f"max_num_batched_tokens ({cfg.max_num_batched_tokens}) is smaller than "
            f"max_model_len ({cfg.max_model_len}) with enable_chunked_prefill off: a long "
            "prompt could never be scheduled; raise max_num_batched_tokens, lower "
            "max_model_len, or enable chunked prefill"
        )


def _check_hybrid_offload(cfg: CheckedConfig) -> None:
    if cfg.offload_policy is not OffloadPolicy.WRITE_THROUGH:
        raise ConfigError(
            "a hybrid model's KV is offloaded as vLLM's OffloadingConnector does it "
            "(write-through, whole chunks of every group): use --offload-policy "
            "write-through or an OffloadingConnector --kv-transfer-config"
        )
    bs = cfg.layout.block_size
    chunk = cfg.hybrid_chunk_size if cfg.hybrid_chunk_size is not None else bs
    int_in("hybrid_chunk_size", chunk, 1, 1 << 24)
    if chunk % bs:
        fail("hybrid_chunk_size", chunk, f"must be a multiple of the block size ({bs})")
    if chunk >= cfg.max_model_len:
        # A chunk is stored once a prompt has computed all of it, and a prompt's last
        # token is never cached: no prompt within max_model_len could fill one.
        best = (cfg.max_model_len - 1) // bs * bs
        hint = f"use hybrid_chunk_size {best}" if best else f"raise max_model_len above {bs}"
        raise ConfigError(
            f"hybrid_chunk_size ({chunk}) leaves no chunk that can ever be stored with "
            f"max_model_len {cfg.max_model_len} (the first chunk needs {chunk + 1} "
            f"tokens): {hint}"
        )
    need = cfg.unit_bytes // cfg.block_bytes
    for name, blocks in (("the CPU tier", cfg.num_cpu_blocks),
                         *((f"secondary tier {t.name}", t.capacity_blocks)
                           for t in cfg.storage_tiers)):  # fmt: skip
        if blocks < need:
            raise ConfigError(
                f"{name} ({blocks} blocks) holds no chunk: one needs {need} blocks' worth "
                f"(every KV cache group's share of {chunk} tokens): raise it"
            )


def _coerce_enum(cfg: CheckedConfig, name: str, enum: type[StrEnum]) -> None:
    # The field was given as its value (a string from a flag or file): it becomes the enum.
    value = getattr(cfg, name)
    try:
        object.__setattr__(cfg, name, enum(value))
    except ValueError:
        fail(name, value, "must be one of " + ", ".join(m.value for m in enum))
