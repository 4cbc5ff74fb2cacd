"""EngineConfig's settings by area, as vLLM's VllmConfig groups them; each area checked alone
(EngineConfig checks what spans areas)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

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
from mocker.storage_spec import StorageTierSpec
from mocker.validation import fail, finite, int_in

__all__ = [
    "CacheConfig",
    "KVTransferConfig",
    "LoRAConfig",
    "OffloadConfig",
    "OutputConfig",
    "SchedulerConfig",
]

_HASH_ALGOS = tuple(a.value for a in HashAlgo)
_E = TypeVar("_E", bound=StrEnum)


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(name, value, "must be true or false")


def _set_enum(area: Any, name: str, enum: type[_E]) -> None:
    # The field may be given as its value (a string from a flag or file): it becomes the enum.
    value = getattr(area, name)
    try:
        object.__setattr__(area, name, enum(value))
    except ValueError:
        fail(name, value, "must be one of " + ", ".join(m.value for m in enum))


def _positive(name: str, value: Any) -> None:
    finite(name, value, minimum=0.0)
    if value <= 0:
        fail(name, value, "must be > 0")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The device KV cache: its blocks, prefix caching, eviction and KV events."""

    # As given: a model with Mamba layers enlarges it (EngineConfig.block_size is the one
    # the engine uses).
    block_size: int = 16
    num_gpu_blocks: int = 16384
    enable_prefix_caching: bool = True
    # Block hashes: mocker's fast chain, or one of vLLM's algorithms (bit-identical with
    # vLLM's for the same $PYTHONHASHSEED).
    prefix_caching_hash_algo: str = "fast"
    eviction_policy: EvictionPolicyName = EvictionPolicyName.LRU
    enable_kv_cache_events: bool = False
    # vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: events name a block by its hash's low 64
    # bits (an int); False: by the full digest (bytes).
    int_block_hashes: bool = True
    # vLLM's --disable-hybrid-kv-cache-manager: every layer's KV is kept as full attention's
    # (a sliding window saves compute, not memory); a model with Mamba layers cannot start.
    disable_hybrid_kv_cache_manager: bool = False

    def __post_init__(self) -> None:
        int_in("num_gpu_blocks", self.num_gpu_blocks, 1, 1 << 26)
        for name in ("enable_prefix_caching", "enable_kv_cache_events", "int_block_hashes",
                     "disable_hybrid_kv_cache_manager"):  # fmt: skip
            _flag(name, getattr(self, name))
        if self.prefix_caching_hash_algo not in _HASH_ALGOS:
            fail("prefix_caching_hash_algo", self.prefix_caching_hash_algo,
                 "must be one of " + ", ".join(_HASH_ALGOS))  # fmt: skip
        _set_enum(self, "eviction_policy", EvictionPolicyName)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """What a pass may hold: sequences, tokens, the model length, chunking and priorities."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 131072
    enable_chunked_prefill: bool = True
    preemption_victim: PreemptionVictim = PreemptionVictim.NEWEST
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS
    # vLLM's: a prefill chunk is at most this many tokens (0: only the budget caps it).
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        int_in("max_num_seqs", self.max_num_seqs, 1, 1 << 20)
        int_in("max_num_batched_tokens", self.max_num_batched_tokens, 1, 1 << 24)
        int_in("long_prefill_token_threshold", self.long_prefill_token_threshold, 0, 1 << 24)
        int_in("max_model_len", self.max_model_len, 1, 1 << 24)
        _flag("enable_chunked_prefill", self.enable_chunked_prefill)
        _set_enum(self, "preemption_victim", PreemptionVictim)
        _set_enum(self, "scheduling_policy", SchedulingPolicy)
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


@dataclass(frozen=True, slots=True)
class OutputConfig:
    """The generated tokens: the vocabulary, EOS and the output-length model."""

    # The probability that each token after min_tokens is EOS (0: run to max_tokens unless
    # a stop applies).
    eos_probability: float = 0.0
    vocab_size: int = 129280
    eos_token_id: int = 1

    def __post_init__(self) -> None:
        int_in("vocab_size", self.vocab_size, 2, 1 << 31)
        int_in("eos_token_id", self.eos_token_id, 0, self.vocab_size - 1)
        ep = self.eos_probability
        if isinstance(ep, bool) or not isinstance(ep, int | float) or not (0.0 <= ep <= 1.0):
            fail("eos_probability", ep, "must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """The tiers below the device: the CPU tier (KVBM's G2, vLLM's CPU offloading), its
    links and policy, and the secondary tiers under it. The flags keep vLLM's and KVBM's
    names (--num-host-blocks, --host-d2h-bandwidth-gbps, ...)."""

    num_cpu_blocks: int = 0  # 0: no CPU tier
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
    # Device blocks a tier stores and finds as one chunk (LMCache's chunk_size): a prompt's
    # partial last chunk is not stored, and a hit ends at a chunk boundary.
    chunk_blocks: int = 1
    # LMCache's synchronous retrieval: a request's CPU-tier hit is copied inside the pass
    # that admits it, which waits for it (False: the request waits, as vLLM's own loads).
    # Every hit is loaded, whatever recomputing it would cost.
    sync_loads: bool = False
    # What the CPU tier stands for: vLLM's OffloadingConnector (or mocker's evict-policy
    # host tier), "native"; or LMCache (LMCacheConnectorV1), "lmcache", whose metrics are
    # LMCache's own, not vLLM's kv_offload families.
    offload_backend: str = "native"
    # LMCache's internal API server (host, first port), which serves its metrics: set by its
    # internal_api_server_enabled (None: off, LMCache's default).
    lmcache_api: tuple[str, int] | None = None
    load_timeout: float = 10.0  # a longer load is cancelled and the request recomputes
    # Write-through stores only prompt blocks (vLLM's offload_prompt_only, default true).
    offload_prompt_only: bool = True
    # vLLM 0.34's self_describing_kv_events: an offload tier's BlockStored describes its
    # blocks in full (else it names a chunk's hash only).
    self_describing_kv_events: bool = False
    # Tiers below the CPU tier, in lookup order (vLLM's tiering secondary_tiers).
    storage_tiers: tuple[StorageTierSpec, ...] = ()
    # Hybrid offload (vLLM PR #38261): the unit a tier stores, in tokens, holding every
    # group's data for that chunk (None: one block).
    hybrid_chunk_size: int | None = None

    def __post_init__(self) -> None:
        int_in("num_cpu_blocks", self.num_cpu_blocks, 0, 1 << 30)
        _set_enum(self, "offload_policy", OffloadPolicy)
        _flag("offload_prompt_only", self.offload_prompt_only)
        _flag("sync_loads", self.sync_loads)
        if self.offload_backend not in ("native", "lmcache"):
            fail("offload_backend", self.offload_backend, "must be native or lmcache")
        _flag("self_describing_kv_events", self.self_describing_kv_events)
        int_in("offload_batch_size", self.offload_batch_size, 1, 1 << 20)
        int_in("min_load_blocks", self.min_load_blocks, 1, 1 << 30)
        int_in("chunk_blocks", self.chunk_blocks, 1, 1 << 20)
        for name in ("cpu_write_gbps", "cpu_read_gbps"):
            finite(name, getattr(self, name))
        finite("transfer_latency_ms", self.transfer_latency_ms, minimum=0.0)
        if self.kv_offloading_size is not None:
            finite("kv_offloading_size", self.kv_offloading_size, minimum=0.0)
        _positive("load_timeout", self.load_timeout)
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

    @property
    def has_cpu_tier(self) -> bool:
        return self.num_cpu_blocks > 0


@dataclass(frozen=True, slots=True)
class LoRAConfig:
    """LoRA (vLLM's --enable-lora): adapter slots in a batch, the CPU cache, load times."""

    enable_lora: bool = False
    max_loras: int = 1  # distinct adapters in a batch (GPU slots)
    max_cpu_loras: int | None = None  # adapters cached on the CPU (None: max_loras)
    max_lora_rank: int = 16
    # The time a batch waits to bring an adapter into a GPU slot (mocker: vLLM publishes no
    # figure): from the CPU cache, and from disk into the CPU cache first (both simulated:
    # divided by the speedup ratio). ~20-40 MB for a rank-16 adapter of an 8B model.
    lora_load_ms: float = 2.0
    lora_disk_load_ms: float = 30.0

    def __post_init__(self) -> None:
        _flag("enable_lora", self.enable_lora)
        int_in("max_loras", self.max_loras, 1, 1 << 16)
        if self.max_cpu_loras is not None:
            int_in("max_cpu_loras", self.max_cpu_loras, 1, 1 << 16)
            if self.max_cpu_loras < self.max_loras:
                raise ConfigError(
                    f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
                )
        finite("lora_load_ms", self.lora_load_ms, minimum=0.0)
        finite("lora_disk_load_ms", self.lora_disk_load_ms, minimum=0.0)
        if self.max_lora_rank not in LORA_RANKS:
            fail("max_lora_rank", self.max_lora_rank,
                 "must be one of " + ", ".join(map(str, LORA_RANKS)))  # fmt: skip


@dataclass(frozen=True, slots=True)
class KVTransferConfig:
    """P/D (vLLM's NixlConnector): the role, this engine's id in kv_transfer_params, the
    decode side's pull link (GB/s = 10^9 bytes/s, processor-shared by its pulls; latency per
    pull), how long a pull may take before the request recomputes, and how long a prefill
    engine holds KV nobody pulls (vLLM 0.34's kv_lease_duration). All simulated: divided
    by the speedup ratio."""

    kv_role: KVRole = KVRole.NONE
    kv_engine_id: str = ""
    # "pull" (NixlConnector: the decode engine reads) or "push" (vLLM 0.34's
    # NixlPushConnector: the prefill engine writes); the two never complete a handshake.
    kv_transfer_mode: str = "pull"
    pull_gbps: float = 25.0
    pull_latency_ms: float = 0.5
    pull_timeout: float = 30.0
    hold_timeout: float = 30.0

    def __post_init__(self) -> None:
        _set_enum(self, "kv_role", KVRole)
        if self.kv_transfer_mode not in ("pull", "push"):
            fail("kv_transfer_mode", self.kv_transfer_mode, "must be pull or push")
        if not isinstance(self.kv_engine_id, str):
            fail("kv_engine_id", self.kv_engine_id, "must be a string")
        finite("pull_gbps", self.pull_gbps)
        finite("pull_latency_ms", self.pull_latency_ms, minimum=0.0)
        _positive("pull_timeout", self.pull_timeout)
        _positive("hold_timeout", self.hold_timeout)
