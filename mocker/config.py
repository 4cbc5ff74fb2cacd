"""Validated engine configuration: vLLM-compatible names, defaults and start-up checks."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from mocker.errors import ConfigError
from mocker.kv.hashing import HashAlgo
from mocker.kv.spec import (
    KVLayout,
    SpecKind,
    gated_delta_net_state_bytes,
    kv_layout,
    layer_kind,
    mamba2_state_bytes,
)
from mocker.timing.spec import TimingSpec

__all__ = [
    "LORA_RANKS",
    "MODEL_PRESETS",
    "VLLM_RELEASES",
    "ConfigError",
    "EngineConfig",
    "EvictionPolicyName",
    "ModelShape",
    "OffloadPolicy",
    "PreemptionVictim",
    "SchedulingPolicy",
    "StorageKind",
    "StorageTierSpec",
]

# The vLLM releases whose names and formats mocker serves (--vllm-compat): the current one
# last, the default.
VLLM_RELEASES = ("0.33", "0.34")


class PreemptionVictim(StrEnum):
    """Which running request is preempted when a block cannot be allocated."""

    NEWEST = "newest"  # vLLM's default: the most recently admitted running request
    OLDEST = "oldest"


class SchedulingPolicy(StrEnum):
    """vLLM's --scheduling-policy: the order of waiting requests and the preemption victim."""

    FCFS = "fcfs"  # arrival order; a request's priority must be 0
    PRIORITY = "priority"  # (priority, arrival time), lower first; the highest is preempted


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
# Below a thousandth of real speed a pass would hold its requests for hours (a tiny ratio
# wedges a server); above 10^12 every pass takes no time at all.
SPEEDUP_RANGE = (1e-3, 1e12)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The model dimensions that size the KV cache (no weights are ever loaded).

    A hybrid model lists each layer's type (`layer_types`, as its config.json does):
    full attention, sliding-window attention (`sliding_window` tokens), or Mamba / linear
    attention, whose per-request state is `mamba_state_bytes` per layer whatever the
    context. Only layers that hold KV are listed (an MLP-only layer has none).
    """

    num_layers: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    dtype_bytes: int = 2
    layer_types: tuple[str, ...] = ()  # empty: every layer is full attention
    sliding_window: int | None = None
    mamba_state_bytes: int = 0

    def __post_init__(self) -> None:
        _int_in("num_layers", self.num_layers, 1, 1024)
        _int_in("num_kv_heads", self.num_kv_heads, 1, 1024)
        _int_in("head_dim", self.head_dim, 1, 4096)
        if self.dtype_bytes not in (1, 2, 4):
            _fail("dtype_bytes", self.dtype_bytes, "must be 1 (fp8), 2 (fp16/bf16) or 4 (fp32)")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types and len(self.layer_types) != self.num_layers:
            _fail("layer_types", list(self.layer_types),
                  f"must list one type per layer (num_layers={self.num_layers})")  # fmt: skip
        try:
            kinds = {layer_kind(t) for t in self.layer_types} or {SpecKind.FULL}
        except ValueError as exc:
            raise ConfigError(f"invalid layer_types: {exc}") from None
        if SpecKind.SLIDING in kinds:
            _int_in("sliding_window", self.sliding_window, 1, 1 << 24)
        elif self.sliding_window is not None:
            _fail("sliding_window", self.sliding_window, "set without a sliding_attention layer")
        if SpecKind.MAMBA in kinds:
            _int_in("mamba_state_bytes", self.mamba_state_bytes, 1, 1 << 40)
        elif self.mamba_state_bytes:
            _fail("mamba_state_bytes", self.mamba_state_bytes, "set without a mamba layer")

    @property
    def num_attention_layers(self) -> int:
        if not self.layer_types:
            return self.num_layers
        return sum(1 for t in self.layer_types if layer_kind(t) is not SpecKind.MAMBA)

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V per attention layer per KV head: layers × 2 × kv_heads × head_dim × bytes.
        return self.num_attention_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def is_hybrid(self) -> bool:
        return any(layer_kind(t) is not SpecKind.FULL for t in self.layer_types)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ModelShape:
        """A custom shape from JSON/YAML (docs/hybrid.md): ModelShape's
        fields, and instead of mamba_state_bytes either `mamba2` (intermediate, n_groups,
        d_state, d_conv, n_heads, head_dim[, conv_bytes, ssm_bytes]) or `gated_delta_net`
        (num_k_heads, num_v_heads, head_k_dim, head_v_dim, conv_kernel[, dtype_bytes]),
        from which the state's bytes are computed as vLLM sizes it."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"a model shape must be an object, got {raw!r}")
        values = dict(raw)
        known = {f.name for f in fields(cls)} | {"mamba2", "gated_delta_net"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown model shape key(s) {', '.join(unknown)}: known are "
                + ", ".join(sorted(known))
            )
        for key, state_fn in (("mamba2", mamba2_state_bytes),
                              ("gated_delta_net", gated_delta_net_state_bytes)):  # fmt: skip
            if key in values:
                params = values.pop(key)
                if "mamba_state_bytes" in values or not isinstance(params, Mapping):
                    raise ConfigError(
                        f"model shape: {key} must be an object, and comes instead of "
                        "mamba_state_bytes"
                    )
                for name, value in params.items():
                    # A convolution of width k keeps k − 1 inputs: at least 2.
                    low = 2 if name in ("d_conv", "conv_kernel") else 1
                    _int_in(f"{key}.{name}", value, low, 1 << 24)
                try:
                    values["mamba_state_bytes"] = state_fn(**params)
                except TypeError as exc:
                    raise ConfigError(f"model shape: {key}: {exc}") from None
        if "layer_types" in values:
            types = values["layer_types"]
            if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
                raise ConfigError("model shape: layer_types must be a list of strings")
            values["layer_types"] = tuple(types)
        return cls(**values)


# Dense presets: every layer full attention. Hybrid ones from the models' config.json:
MODEL_PRESETS: dict[str, ModelShape] = {
    "llama-3-8b": ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "llama-3-70b": ModelShape(num_layers=80, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    "qwen2.5-7b": ModelShape(num_layers=28, num_kv_heads=4, head_dim=128, dtype_bytes=2),
    "mistral-7b": ModelShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2),
    # huggingface.co/openai/gpt-oss-20b/blob/main/config.json: num_hidden_layers 24,
    # num_key_value_heads 8, head_dim 64, sliding_window 128, layer_types alternating
    # sliding_attention / full_attention from layer 0; bf16 KV.
    "gpt-oss-20b": ModelShape(
        num_layers=24,
        num_kv_heads=8,
        head_dim=64,
        dtype_bytes=2,
        layer_types=("sliding_attention", "full_attention") * 12,
        sliding_window=128,
    ),
    # huggingface.co/google/gemma-3-12b-it/blob/main/config.json text_config (with
    # transformers' Gemma3TextConfig defaults): num_hidden_layers 48, num_key_value_heads 8,
    # head_dim 256, sliding_window 1024, sliding_window_pattern 6 (five sliding layers,
    # then one full).
    "gemma-3-12b": ModelShape(
        num_layers=48,
        num_kv_heads=8,
        head_dim=256,
        dtype_bytes=2,
        layer_types=(("sliding_attention",) * 5 + ("full_attention",)) * 8,
        sliding_window=1024,
    ),
    # huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json:
    # num_hidden_layers 48, full_attention_interval 4 (layers 3, 7, ... full attention, the
    # rest Gated DeltaNet), num_key_value_heads 2, head_dim 256, linear_num_key_heads 16,
    # linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128,
    # linear_conv_kernel_dim 4; bf16 state: 1,097,728 bytes per linear-attention layer.
    "qwen3-next-80b-a3b": ModelShape(
        num_layers=48,
        num_kv_heads=2,
        head_dim=256,
        dtype_bytes=2,
        layer_types=(("linear_attention",) * 3 + ("full_attention",)) * 12,
        mamba_state_bytes=gated_delta_net_state_bytes(
            num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=4
        ),
    ),
    # huggingface.co/ibm-granite/granite-4.0-h-micro/blob/main/config.json:
    # num_hidden_layers 40 (attention at 5, 15, 25, 35, Mamba2 elsewhere), hidden_size 2048,
    # num_attention_heads 32 (head_dim 64), num_key_value_heads 8, mamba_n_heads 64,
    # mamba_d_head 64, mamba_d_state 128, mamba_n_groups 1, mamba_d_conv 4, mamba_expand 2;
    # bf16 state: 1,074,688 bytes per Mamba layer.
    "granite-4.0-h-micro": ModelShape(
        num_layers=40,
        num_kv_heads=8,
        head_dim=64,
        dtype_bytes=2,
        layer_types=tuple("full_attention" if i % 10 == 5 else "mamba" for i in range(40)),
        mamba_state_bytes=mamba2_state_bytes(
            intermediate=4096, n_groups=1, d_state=128, d_conv=4, n_heads=64, head_dim=64
        ),
    ),
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
    # Its blocks in the KV events (vLLM 0.34's per-tier enable_kv_events, which a config
    # leaves false unless it says otherwise).
    enable_kv_events: bool = True

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
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            _fail("block_size", bs, "must be a power of two in [1, 1024]")
        if not isinstance(self.model, ModelShape):
            _fail("model", self.model, "must be a ModelShape")
        if self.disable_hybrid_kv_cache_manager and self.model.layer_types:
            if any(layer_kind(t) is SpecKind.MAMBA for t in self.model.layer_types):
                _fail("disable_hybrid_kv_cache_manager", True,
                      "a model with Mamba layers needs the hybrid KV cache manager (vLLM's "
                      "hybrid SSM models fail at start-up without it)")  # fmt: skip
            object.__setattr__(
                self, "model", replace(self.model, layer_types=(), sliding_window=None)
            )
        layout = kv_layout(self.model, bs)
        # A hybrid model with Mamba layers enlarges the block (vLLM's "Setting attention
        # block size to N tokens ..."): the given size is then replaced by the aligned one,
        # and the given one kept (`with_changes` starts from it again). An aligned size
        # given as such stands.
        if (bs & (bs - 1) or bs > 1024) and not (
            layout.has_mamba
            and any(kv_layout(self.model, 1 << k).block_size == bs for k in range(11))
        ):
            _fail("block_size", bs, "must be a power of two in [1, 1024]")
        object.__setattr__(self, "requested_block_size", bs)
        object.__setattr__(self, "block_size", layout.block_size)
        object.__setattr__(self, "layout", layout)
        _int_in("num_gpu_blocks", self.num_gpu_blocks, 1, 1 << 26)
        _int_in("max_num_seqs", self.max_num_seqs, 1, 1 << 20)
        _int_in("max_num_batched_tokens", self.max_num_batched_tokens, 1, 1 << 24)
        _int_in("long_prefill_token_threshold", self.long_prefill_token_threshold, 0, 1 << 24)
        _int_in("max_model_len", self.max_model_len, 1, 1 << 24)
        _int_in("seed", self.seed, 0, 1 << 63)
        _int_in("vocab_size", self.vocab_size, 2, 1 << 31)
        _int_in("eos_token_id", self.eos_token_id, 0, self.vocab_size - 1)
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enable_kv_cache_events",
                     "offload_prompt_only", "self_describing_kv_events"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "must be true or false")
        if self.prefix_caching_hash_algo not in _HASH_ALGOS:
            _fail("prefix_caching_hash_algo", self.prefix_caching_hash_algo,
                  "must be one of " + ", ".join(_HASH_ALGOS))  # fmt: skip
        self._coerce_enum("preemption_victim", PreemptionVictim)
        self._coerce_enum("scheduling_policy", SchedulingPolicy)
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
        if self.kv_transfer_mode not in ("pull", "push"):
            _fail("kv_transfer_mode", self.kv_transfer_mode, "must be pull or push")
        if not isinstance(self.kv_engine_id, str):
            _fail("kv_engine_id", self.kv_engine_id, "must be a string")
        _finite("pull_gbps", self.pull_gbps)
        _finite("pull_latency_ms", self.pull_latency_ms, minimum=0.0)
        for name in ("pull_timeout", "hold_timeout"):
            _finite(name, getattr(self, name), minimum=0.0)
            if getattr(self, name) <= 0:
                _fail(name, getattr(self, name), "must be > 0")
        sr = self.speedup_ratio
        lo, hi = SPEEDUP_RANGE
        if isinstance(sr, bool) or not isinstance(sr, int | float) or not (lo <= sr <= hi):
            _fail("speedup_ratio", sr, f"must be in [{lo:g}, {hi:g}]")
        ep = self.eos_probability
        if isinstance(ep, bool) or not isinstance(ep, int | float) or not (0.0 <= ep <= 1.0):
            _fail("eos_probability", ep, "must be in [0, 1]")
        # Combinations, checked as vLLM does at start-up.
        if layout.is_hybrid and self.kv_role is not KVRole.NONE:
            raise ConfigError(
                "a hybrid model shape (KV cache groups of several kinds) with P/D "
                "(NixlConnector) is not supported yet: use a dense --model-shape, or drop the "
                "connector"
            )
        if layout.is_hybrid and self.num_cpu_blocks:
            self._check_hybrid_offload(layout)
        if layout.is_hybrid and self.eviction_policy is EvictionPolicyName.LINEAGE:
            # Lineage counts a block's cached children along one prefix chain; a window's and
            # a Mamba group's blocks are cached out of chain order.
            raise ConfigError(
                "eviction_policy lineage follows one prefix chain per block and is not "
                "modelled for a hybrid model's KV cache groups: use lru (vLLM's)"
            )
        if layout.block_size > self.max_model_len:
            raise ConfigError(
                f"the model's Mamba state needs blocks of {layout.block_size} tokens, more than "
                f"max_model_len ({self.max_model_len}): no block would ever fill; raise "
                "max_model_len or check mamba_state_bytes"
            )
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

    def _check_hybrid_offload(self, layout: KVLayout) -> None:
        if self.offload_policy is not OffloadPolicy.WRITE_THROUGH:
            raise ConfigError(
                "a hybrid model's KV is offloaded as vLLM's OffloadingConnector does it "
                "(write-through, whole chunks of every group): use --offload-policy "
                "write-through or an OffloadingConnector --kv-transfer-config"
            )
        bs = layout.block_size
        chunk = self.hybrid_chunk_size if self.hybrid_chunk_size is not None else bs
        _int_in("hybrid_chunk_size", chunk, 1, 1 << 24)
        if chunk % bs:
            _fail("hybrid_chunk_size", chunk, f"must be a multiple of the block size ({bs})")
        if chunk >= self.max_model_len:
            # A chunk is stored once a prompt has computed all of it, and a prompt's last
            # token is never cached: no prompt within max_model_len could fill one.
            best = (self.max_model_len - 1) // bs * bs
            hint = f"use hybrid_chunk_size {best}" if best else f"raise max_model_len above {bs}"
            raise ConfigError(
                f"hybrid_chunk_size ({chunk}) leaves no chunk that can ever be stored with "
                f"max_model_len {self.max_model_len} (the first chunk needs {chunk + 1} "
                f"tokens): {hint}"
            )
        need = self.unit_bytes // self.block_bytes
        for name, blocks in (("the CPU tier", self.num_cpu_blocks),
                             *((f"secondary tier {t.name}", t.capacity_blocks)
                               for t in self.storage_tiers)):  # fmt: skip
            if blocks < need:
                raise ConfigError(
                    f"{name} ({blocks} blocks) holds no chunk: one needs {need} blocks' worth "
                    f"(every KV cache group's share of {chunk} tokens): raise it"
                )

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

    def _coerce_enum(self, name: str, enum: type[StrEnum]) -> None:
        value = getattr(self, name)
        try:
            object.__setattr__(self, name, enum(value))
        except ValueError:
            _fail(name, value, "must be one of " + ", ".join(m.value for m in enum))

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
