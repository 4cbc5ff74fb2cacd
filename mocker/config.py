"""Validated engine configuration: vLLM-compatible names, defaults and start-up checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from mocker.kv.hashing import HashAlgo

__all__ = [
    "LORA_RANKS",
    "MODEL_PRESETS",
    "ConfigError",
    "EngineConfig",
    "EvictionPolicyName",
    "ModelShape",
    "OffloadPolicy",
    "PreemptionVictim",
    "StorageKind",
    "StorageTierSpec",
]


class ConfigError(ValueError):
    """A setting or a combination of settings that cannot work; the message names the setting."""


class PreemptionVictim(StrEnum):
    """Which running request is preempted when a block cannot be allocated."""

    NEWEST = "newest"  # vLLM's default: the most recently admitted running request
    OLDEST = "oldest"


class EvictionPolicyName(StrEnum):
    """Which free cached block the device pool reuses first."""

    LRU = "lru"  # vLLM's order
    LINEAGE = "lineage"  # leaves first; never a block whose cached child remains


class OffloadPolicy(StrEnum):
    """When device KV blocks are copied to the CPU tier."""

    EVICT = "evict"  # KVBM: a cached device block is copied when it is evicted
    # vLLM's OffloadingConnector: new full prompt blocks are copied after their pass.
    WRITE_THROUGH = "write-through"


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"invalid {name}={value!r}: {allowed}")


def _int_in(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(name, value, "must be an integer")
    if value < lo or (hi is not None and value > hi):
        _fail(name, value, f"must be in [{lo}, {hi if hi is not None else '∞'})")


def _finite(name: str, value: Any, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        _fail(name, value, "must be a finite number")
    if minimum is not None and value < minimum:
        _fail(name, value, f"must be >= {minimum:g}")


_HASH_ALGOS = tuple(a.value for a in HashAlgo)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's --max-lora-rank choices


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The model dimensions that size the KV cache (no weights are ever loaded)."""

    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        _int_in("num_layers", self.num_layers, 1, 1024)
        _int_in("num_kv_heads", self.num_kv_heads, 1, 1024)
        _int_in("head_dim", self.head_dim, 1, 4096)
        if self.dtype_bytes not in (1, 2, 4):
            _fail("dtype_bytes", self.dtype_bytes, "must be 1 (fp8), 2 (fp16/bf16) or 4 (fp32)")

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V per layer per KV head: layers × 2 × kv_heads × head_dim × dtype bytes.
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes


MODEL_PRESETS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "llama-3-70b": ModelShape(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "qwen2.5-7b": ModelShape(num_layers=28, num_kv_heads=4, head_dim=128, dtype_bytes=2),
    "mistral-7b": ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
}


class KVRole(StrEnum):
    """P/D role, as vLLM's kv_transfer_config kv_role for NixlConnector (NONE: no P/D)."""

    NONE = "none"
    PRODUCER = "kv_producer"  # prefill: holds a finished request's KV for a pull
    CONSUMER = "kv_consumer"  # decode: pulls a prompt's KV from a prefill engine
    BOTH = "kv_both"  # either, as each request's kv_transfer_params say

    @property
    def produces(self) -> bool:
        return self in (KVRole.PRODUCER, KVRole.BOTH)

    @property
    def consumes(self) -> bool:
        return self in (KVRole.CONSUMER, KVRole.BOTH)


class StorageKind(StrEnum):
    """vLLM's secondary tier types (tiering): local files, or an object store shared by every
    engine of the process."""

    FS = "fs"
    OBJ = "obj"


@dataclass(frozen=True, slots=True)
class StorageTierSpec:
    """A secondary tier below the CPU tier. Bandwidths in GB/s (10^9 bytes/s, <= 0: instant),
    a fixed latency per transfer, and the chance that a copy to or from it fails."""

    kind: StorageKind
    capacity_blocks: int
    read_gbps: float
    write_gbps: float
    latency_ms: float = 0.0
    failure_rate: float = 0.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "kind", StorageKind(self.kind))
        except ValueError:
            _fail("type", self.kind, "must be one of fs, obj")
        _int_in("capacity_blocks", self.capacity_blocks, 1, 1 << 40)
        for name in ("read_gbps", "write_gbps"):
            _finite(name, getattr(self, name))
        _finite("latency_ms", self.latency_ms, minimum=0.0)
        fr = self.failure_rate
        if isinstance(fr, bool) or not isinstance(fr, int | float) or not (0.0 <= fr <= 1.0):
            _fail("failure_rate", fr, "must be in [0, 1]")

    @property
    def name(self) -> str:
        return self.kind.value


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine core needs; frozen, checked once at construction."""

    block_size: int = 16
    num_gpu_blocks: int = 16384
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_victim: PreemptionVictim = PreemptionVictim.NEWEST
    eviction_policy: EvictionPolicyName = EvictionPolicyName.LRU
    speedup_ratio: float = 1.0
    seed: int = 0
    # Block hashes: mocker's fast chain, or one of vLLM's algorithms (bit-identical with
    # vLLM's for the same $PYTHONHASHSEED). A str: checked against HashAlgo below.
    prefix_caching_hash_algo: str = "fast"
    model: ModelShape = field(default_factory=ModelShape)
    timing_profile: str | None = None
    # Output-length model: probability that each token after min_tokens is EOS
    # (0 = run to max_tokens unless a stop applies).
    eos_probability: float = 0.0
    vocab_size: int = 129280
    eos_token_id: int = 1
    enable_kv_cache_events: bool = False
    # CPU tier (KVBM's G2, vLLM's CPU offloading): 0 blocks = none. The flags keep vLLM's and
    # KVBM's names (--num-host-blocks, --host-d2h-bandwidth-gbps, ...); the config speaks of
    # tiers by name, as the rest of the engine does.
    num_cpu_blocks: int = 0
    kv_offloading_size: float | None = None  # GiB, when the CPU tier was sized that way
    offload_policy: OffloadPolicy = OffloadPolicy.EVICT
    # Device -> CPU (write) and CPU -> device (read), GB/s = 10^9 bytes per second; <= 0
    # means instant. Transfer durations are divided by the speedup ratio like every
    # simulated duration.
    cpu_write_gbps: float = 32.0
    cpu_read_gbps: float = 32.0
    offload_batch_size: int = 32  # blocks per device-to-CPU transfer
    transfer_latency_ms: float = 0.0  # fixed cost added to every transfer
    min_load_blocks: int = 1  # shorter tier hits are recomputed
    load_timeout: float = 10.0  # a longer load is cancelled and the request recomputes
    # Write-through stores only prompt blocks (vLLM's offload_prompt_only, default true).
    offload_prompt_only: bool = True
    # Tiers below the CPU tier, in lookup order (vLLM's tiering secondary_tiers).
    storage_tiers: tuple[StorageTierSpec, ...] = ()
    # LoRA (vLLM's --enable-lora): at most max_loras distinct adapters in a batch (GPU slots);
    # max_cpu_loras adapters cached on the CPU (None: max_loras); max_lora_rank as vLLM's.
    enable_lora: bool = False
    max_loras: int = 1
    max_cpu_loras: int | None = None
    max_lora_rank: int = 16
    # The time a batch waits to bring an adapter into a GPU slot (mocker: vLLM publishes no
    # figure): from the CPU cache, and from disk into the CPU cache first (both simulated:
    # divided by the speedup ratio). ~20-40 MB for a rank-16 adapter of an 8B model.
    lora_load_ms: float = 2.0
    lora_disk_load_ms: float = 30.0
    # P/D (vLLM's NixlConnector): the role, this engine's id in kv_transfer_params, the
    # decode side's pull link (GB/s = 10^9 bytes/s, processor-shared by its pulls; latency
    # per pull), how long a pull may take before the request recomputes, and how long a
    # prefill engine holds KV nobody pulls (vLLM 0.33's kv_lease_duration, 30 s). All
    # simulated: divided by the speedup ratio.
    kv_role: KVRole = KVRole.NONE
    kv_engine_id: str = ""
    pull_gbps: float = 25.0
    pull_latency_ms: float = 0.5
    pull_timeout: float = 30.0
    hold_timeout: float = 30.0

    def __post_init__(self) -> None:
        bs = self.block_size
        _int_in("block_size", bs, 1, 1024)
        if bs & (bs - 1):
            _fail("block_size", bs, "must be a power of two in [1, 1024]")
        _int_in("num_gpu_blocks", self.num_gpu_blocks, 1, 1 << 26)
        _int_in("max_num_seqs", self.max_num_seqs, 1, 1 << 20)
        _int_in("max_num_batched_tokens", self.max_num_batched_tokens, 1, 1 << 24)
        _int_in("max_model_len", self.max_model_len, 1, 1 << 24)
        _int_in("seed", self.seed, 0, 1 << 63)
        _int_in("vocab_size", self.vocab_size, 2, 1 << 31)
        _int_in("eos_token_id", self.eos_token_id, 0, self.vocab_size - 1)
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enable_kv_cache_events",
                     "offload_prompt_only"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "must be true or false")
        if self.prefix_caching_hash_algo not in _HASH_ALGOS:
            _fail("prefix_caching_hash_algo", self.prefix_caching_hash_algo,
                  "must be one of " + ", ".join(_HASH_ALGOS))  # fmt: skip
        self._coerce_enum("preemption_victim", PreemptionVictim)
        self._coerce_enum("eviction_policy", EvictionPolicyName)
        self._coerce_enum("offload_policy", OffloadPolicy)
        _int_in("num_cpu_blocks", self.num_cpu_blocks, 0, 1 << 30)
        if not isinstance(self.enable_lora, bool):
            _fail("enable_lora", self.enable_lora, "must be true or false")
        _int_in("max_loras", self.max_loras, 1, 1 << 16)
        if self.max_cpu_loras is not None:
            _int_in("max_cpu_loras", self.max_cpu_loras, 1, 1 << 16)
            if self.max_cpu_loras < self.max_loras:
                raise ConfigError(
                    f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
                )
        _finite("lora_load_ms", self.lora_load_ms, minimum=0.0)
        _finite("lora_disk_load_ms", self.lora_disk_load_ms, minimum=0.0)
        if self.max_lora_rank not in LORA_RANKS:
            _fail("max_lora_rank", self.max_lora_rank,
                  "must be one of " + ", ".join(map(str, LORA_RANKS)))  # fmt: skip
        _int_in("offload_batch_size", self.offload_batch_size, 1, 1 << 20)
        _int_in("min_load_blocks", self.min_load_blocks, 1, 1 << 30)
        for name in ("cpu_write_gbps", "cpu_read_gbps"):
            _finite(name, getattr(self, name))
        _finite("transfer_latency_ms", self.transfer_latency_ms, minimum=0.0)
        if self.kv_offloading_size is not None:
            _finite("kv_offloading_size", self.kv_offloading_size, minimum=0.0)
        _finite("load_timeout", self.load_timeout, minimum=0.0)
        if self.load_timeout <= 0:
            _fail("load_timeout", self.load_timeout, "must be > 0")
        self._coerce_enum("kv_role", KVRole)
        if not isinstance(self.kv_engine_id, str):
            _fail("kv_engine_id", self.kv_engine_id, "must be a string")
        _finite("pull_gbps", self.pull_gbps)
        _finite("pull_latency_ms", self.pull_latency_ms, minimum=0.0)
        for name in ("pull_timeout", "hold_timeout"):
            _finite(name, getattr(self, name), minimum=0.0)
            if getattr(self, name) <= 0:
                _fail(name, getattr(self, name), "must be > 0")
        if not isinstance(self.model, ModelShape):
            _fail("model", self.model, "must be a ModelShape")
        sr = self.speedup_ratio
        if isinstance(sr, bool) or not isinstance(sr, int | float) or not (0 < sr < math.inf):
            _fail("speedup_ratio", sr, "must be a finite number > 0")
        ep = self.eos_probability
        if isinstance(ep, bool) or not isinstance(ep, int | float) or not (0.0 <= ep <= 1.0):
            _fail("eos_probability", ep, "must be in [0, 1]")
        # Combinations, checked as vLLM does at start-up.
        if self.num_cpu_blocks and not self.enable_prefix_caching:
            raise ConfigError(
                f"a CPU tier (num_cpu_blocks={self.num_cpu_blocks}) needs prefix caching: "
                "offloaded blocks are found again by their prefix hashes; drop "
                "--no-enable-prefix-caching or the CPU tier"
            )
        if self.storage_tiers and not self.num_cpu_blocks:
            raise ConfigError(
                "secondary tiers need a CPU tier: every store cascades from it and every load "
                "is staged through it; set cpu_bytes_to_use (or --num-host-blocks)"
            )
        kinds = [t.kind for t in self.storage_tiers]
        if len(set(kinds)) != len(kinds):
            raise ConfigError(
                f"secondary_tiers: each type at most once, got {[str(k) for k in kinds]}"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs}): every running request needs one token "
                "of the per-pass budget"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with enable_chunked_prefill off: a long "
                "prompt could never be scheduled; raise max_num_batched_tokens, lower "
                "max_model_len, or enable chunked prefill"
            )

    def _coerce_enum(self, name: str, enum: type[StrEnum]) -> None:
        value = getattr(self, name)
        try:
            object.__setattr__(self, name, enum(value))
        except ValueError:
            _fail(name, value, "must be one of " + ", ".join(m.value for m in enum))

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.model.kv_bytes_per_token

    @property
    def has_cpu_tier(self) -> bool:
        return self.num_cpu_blocks > 0

    def with_changes(self, **changes: Any) -> EngineConfig:
        """A copy with some settings changed (validated again)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        return replace(self, **changes)
