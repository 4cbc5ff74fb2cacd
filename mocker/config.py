"""Validated engine configuration: vLLM-compatible names, defaults and start-up checks."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from mocker import config_checks
from mocker.config_choices import (
    EvictionPolicyName,
    KVRole,
    OffloadPolicy,
    PreemptionVictim,
    SchedulingPolicy,
)
from mocker.errors import ConfigError
from mocker.kv.spec import KVLayout
from mocker.model_shape import ModelShape
from mocker.storage_spec import StorageTierSpec
from mocker.timing.spec import TimingSpec
from mocker.validation import int_in

__all__ = ["VLLM_RELEASES", "ConfigError", "EngineConfig"]

# The vLLM releases whose names and formats mocker serves (--vllm-compat): the current one
# last, the default.
VLLM_RELEASES = ("0.33", "0.34")


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
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FCFS
    # vLLM's: a prefill chunk is at most this many tokens (0: only the budget caps it).
    long_prefill_token_threshold: int = 0
    eviction_policy: EvictionPolicyName = EvictionPolicyName.LRU
    speedup_ratio: float = 1.0
    seed: int = 0
    # Block hashes: mocker's fast chain, or one of vLLM's algorithms (bit-identical with
    # vLLM's for the same $PYTHONHASHSEED). A str: checked against HashAlgo below.
    prefix_caching_hash_algo: str = "fast"
    model: ModelShape = field(default_factory=ModelShape)
    # The pass-time model: Dynamo's polynomial unless set (`mocker serve` and `mocker
    # replay` default to the GPU data of their --model and --gpu).
    timing: TimingSpec = field(default_factory=TimingSpec)
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
    # vLLM 0.34's self_describing_kv_events: an offload tier's BlockStored describes its
    # blocks in full (else it names a chunk's hash only).
    self_describing_kv_events: bool = False
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
    # prefill engine holds KV nobody pulls (vLLM 0.34's kv_lease_duration, 30 s). All
    # simulated: divided by the speedup ratio.
    kv_role: KVRole = KVRole.NONE
    kv_engine_id: str = ""
    # "pull" (NixlConnector: the decode engine reads) or "push" (vLLM 0.34's
    # NixlPushConnector: the prefill engine writes); the two never complete a handshake.
    kv_transfer_mode: str = "pull"
    pull_gbps: float = 25.0
    pull_latency_ms: float = 0.5
    pull_timeout: float = 30.0
    hold_timeout: float = 30.0
    # Hybrid offload (vLLM PR #38261): the unit a tier stores, in tokens, holding every
    # group's data for that chunk (None: one block).
    hybrid_chunk_size: int | None = None
    # The KV cache groups and the block size they use, derived from the model (not set),
    # and the block size given (before a Mamba hybrid's alignment).
    # vLLM's --disable-hybrid-kv-cache-manager: every layer's KV is kept as full attention's
    # (a sliding window saves compute, not memory); a model with Mamba layers cannot start.
    disable_hybrid_kv_cache_manager: bool = False
    layout: KVLayout = field(init=False, repr=False, compare=False)
    requested_block_size: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        model, layout = config_checks.model_and_layout(self)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "requested_block_size", self.block_size)
        object.__setattr__(self, "block_size", layout.block_size)
        object.__setattr__(self, "layout", layout)
        config_checks.check_sizes(self)
        config_checks.check_choices(self)
        int_in("num_cpu_blocks", self.num_cpu_blocks, 0, 1 << 30)
        config_checks.check_lora(self)
        config_checks.check_offload(self)
        config_checks.check_transfer(self)
        config_checks.check_speed_and_eos(self)
        config_checks.check_combinations(self)

    @property
    def unit_blocks(self) -> int:
        """Device blocks per position a tier stores as one unit (1 for a dense model)."""
        if not self.layout.is_hybrid or self.hybrid_chunk_size is None:
            return 1
        return self.hybrid_chunk_size // self.block_size

    @property
    def unit_bytes(self) -> int:
        """Bytes of one tier unit: a block, or a hybrid chunk (every attention group's
        blocks of the chunk and every Mamba group's state at its end)."""
        layout = self.layout
        if not layout.is_hybrid:
            return self.block_bytes
        n_attn = sum(1 for g in layout.groups if g.is_attention)
        n_mamba = len(layout.groups) - n_attn
        return (self.unit_blocks * n_attn + n_mamba) * self.block_bytes

    @property
    def block_bytes(self) -> int:
        """One block of the device pool: a page for each layer slot of a group (for a dense
        model, block_size tokens of every layer's KV)."""
        return self.layout.block_bytes

    @property
    def is_hybrid(self) -> bool:
        return self.layout.is_hybrid

    @property
    def has_cpu_tier(self) -> bool:
        return self.num_cpu_blocks > 0

    def with_changes(self, **changes: Any) -> EngineConfig:
        """A copy with some settings changed (validated again)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        changes.setdefault("block_size", self.requested_block_size)
        return replace(self, **changes)
