"""Validated engine configuration: vLLM-compatible names, defaults and start-up checks, by
area (mocker.config_areas) as vLLM's VllmConfig composes its configs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from mocker import config_checks
from mocker.config_areas import (
    CacheConfig,
    KVTransferConfig,
    LoRAConfig,
    OffloadConfig,
    OutputConfig,
    SchedulerConfig,
)
from mocker.errors import ConfigError
from mocker.kv.spec import KVLayout
from mocker.model_shape import ModelShape
from mocker.timing.spec import TimingSpec

__all__ = [
    "VLLM_RELEASES",
    "CacheConfig",
    "ConfigError",
    "EngineConfig",
    "KVTransferConfig",
    "LoRAConfig",
    "OffloadConfig",
    "OutputConfig",
    "SchedulerConfig",
]

# The vLLM releases whose names and formats mocker serves (--vllm-compat): the current one
# last, the default.
VLLM_RELEASES = ("0.33", "0.34")

# Each area's field and the settings it holds, by setting name (the names are unique across
# areas: `EngineConfig.of` and `with_changes` take them flat, as the flags and files do).
_AREAS: dict[str, type] = {
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "output": OutputConfig,
    "offload": OffloadConfig,
    "lora": LoRAConfig,
    "transfer": KVTransferConfig,
}
_AREA_OF = {f.name: area for area, cls in _AREAS.items() for f in fields(cls)}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine core needs, by area; frozen, each area checked at construction
    and the combinations here."""

    model: ModelShape = field(default_factory=ModelShape)
    # The pass-time model: Dynamo's polynomial unless set (`mocker serve` and `mocker
    # replay` default to the GPU data of their --model and --gpu).
    timing: TimingSpec = field(default_factory=TimingSpec)
    speedup_ratio: float = 1.0
    seed: int = 0
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    # The KV cache groups and the block size they use, derived from the model and the
    # cache settings (not set).
    layout: KVLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, cls in _AREAS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}")
        model, layout = config_checks.model_and_layout(self.cache, self.model)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "layout", layout)
        config_checks.check_engine(self.speedup_ratio, self.seed)
        config_checks.check_combinations(self)

    @classmethod
    def of(cls, **settings: Any) -> EngineConfig:
        """A config from settings named flat, as the flags and files name them
        (`num_gpu_blocks=...`, `kv_role=...`); the rest at their defaults."""
        return cls().with_changes(**settings)

    @property
    def block_size(self) -> int:
        """The block size the engine uses: the one given, or a Mamba hybrid's aligned one."""
        return self.layout.block_size

    @property
    def unit_blocks(self) -> int:
        """Device blocks per position a tier stores as one unit (1 for a dense model)."""
        chunk = self.offload.hybrid_chunk_size
        if not self.layout.is_hybrid or chunk is None:
            return 1
        return chunk // self.block_size

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
        return self.offload.num_cpu_blocks > 0

    def with_changes(self, **changes: Any) -> EngineConfig:
        """A copy with some settings changed (validated again): an area's settings named
        flat, or this config's own fields (`model`, `timing`, `cache`, ...)."""
        own = {f.name for f in fields(self) if f.init}
        unknown = sorted(set(changes) - own - set(_AREA_OF))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        by_area: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if name not in own:
                by_area.setdefault(_AREA_OF[name], {})[name] = value
        top = {name: value for name, value in changes.items() if name in own}
        for area, its in by_area.items():
            top[area] = replace(top.get(area, getattr(self, area)), **its)
        return replace(self, **top)
