"""An engine's KV storage, assembled from its config: device pool, CPU tier, secondary tiers,
connector, manager. Tiers built outside (a shared `obj`, a CPU tier a test inspects) are
plugged in instead of built."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from mocker.compiled import use_compiled
from mocker.config import EngineConfig
from mocker.config_choices import OffloadPolicy
from mocker.kv.block_pool import BlockPool
from mocker.kv.compiled_pool import CompiledBlockPool, CompiledEventPool, serves
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.manager import KVCacheManager, KVManager
from mocker.storage_spec import StorageKind
from mocker.tiers.connector import TierConnector
from mocker.tiers.hybrid_store import HybridWriteThrough
from mocker.tiers.lru import LruTier
from mocker.tiers.storage import StorageTier

__all__ = ["KVStack", "build_kv_stack", "build_shared_tiers"]


@dataclass(frozen=True, slots=True)
class KVStack:
    """The parts: the device pool, its manager, and (with tiers) the CPU tier and connector."""

    pool: BlockPool | CompiledBlockPool
    kv: KVManager
    cpu: LruTier | None = None
    connector: TierConnector | None = None


def build_shared_tiers(config: EngineConfig) -> dict[str, StorageTier]:
    """The tiers one process builds once and every engine shares: `obj` (by name)."""
    return {
        spec.name: _storage_tier(config, spec.name)
        for spec in config.offload.storage_tiers
        if spec.kind is StorageKind.OBJ
    }


def _blocks_per_unit(config: EngineConfig) -> int:
    """Device blocks' worth of bytes in one tier unit (1, or a hybrid chunk's)."""
    return config.unit_bytes // config.block_bytes


def _storage_tier(config: EngineConfig, name: str) -> StorageTier:
    spec = next(t for t in config.offload.storage_tiers if t.name == name)
    per_unit = _blocks_per_unit(config)
    if per_unit > 1:  # capacities are given in device blocks' bytes: count chunks
        spec = replace(spec, capacity_blocks=max(spec.capacity_blocks // per_unit, 1))
    return StorageTier(
        spec, config.block_size * config.unit_blocks, config.unit_bytes,
        speedup=config.speedup_ratio,
        record_events=config.cache.enable_kv_cache_events and spec.enable_kv_events,
        seed=config.seed,
    )  # fmt: skip


def _storage(config: EngineConfig, shared: Mapping[str, StorageTier] | None) -> list[StorageTier]:
    """The engine's secondary tiers: the shared ones given, the others its own."""
    shared = shared or {}
    return [
        shared[spec.name] if spec.name in shared else _storage_tier(config, spec.name)
        for spec in config.offload.storage_tiers
    ]


def _compiled_pool_serves(config: EngineConfig, cpu: LruTier | None) -> bool:
    """The compiled device pool (mocker.kv.compiled_pool) where it is built, chosen, and
    models everything this engine needs (with `cpu`, a CPU tier given from outside); the
    Python pool otherwise."""
    if not use_compiled("mocker.kv._cpool"):
        return False
    return serves(config, given_cpu=cpu is not None)


def build_kv_stack(
    config: EngineConfig,
    prefill_ms: Callable[[int], float],
    *,
    cpu: LruTier | None = None,
    shared: Mapping[str, StorageTier] | None = None,
    engine_id: int = 0,
) -> KVStack:
    """`prefill_ms` (the timing model's) decides whether a tier hit is worth loading. A `cpu`
    tier given from outside is used instead of one built from the config; so are the
    `shared` secondary tiers (by name: the process's one `obj`). Without them an `obj`
    tier is built for this engine alone. `engine_id` tells a shared tier's subscribers
    apart (the data-parallel rank, or the replay engine's index)."""
    pool: BlockPool | CompiledBlockPool
    if _compiled_pool_serves(config, cpu):
        # (With events it keeps each cached block's tokens: the tiers' events name them.)
        kind = CompiledEventPool if config.cache.enable_kv_cache_events else CompiledBlockPool
        pool = kind(
            config.cache.num_gpu_blocks,
            config.block_size,
            enable_caching=config.cache.enable_prefix_caching,
        )
    else:
        pool = _python_pool(config, cpu)
    if cpu is None and config.has_cpu_tier:
        cpu = LruTier(
            config.offload.num_cpu_blocks // _blocks_per_unit(config),
            config.block_size * config.unit_blocks,
            record_events=config.cache.enable_kv_cache_events,
        )
    if config.is_hybrid:
        assert isinstance(pool, BlockPool)  # (the compiled pool serves no hybrid model)
        hybrid = HybridKVCacheManager(pool, config.layout)
        if cpu is None:
            return KVStack(pool, hybrid)
        connector = TierConnector(
            config, pool, cpu, prefill_ms, storage=_storage(config, shared), engine_id=engine_id
        )
        # Whole chunks of every group, stored write-through (EngineConfig refuses write-back).
        connector.policy = HybridWriteThrough(
            connector, connector.stores, hybrid, prompt_only=config.offload.offload_prompt_only
        )
        return KVStack(pool, hybrid, cpu, connector)
    if cpu is None:
        return KVStack(pool, KVCacheManager(pool))
    write_back = config.offload.offload_policy is OffloadPolicy.EVICT
    # Write-back copies in the background, as KVBM does, to keep about one pass's worth
    # of blocks reusable (or on their way): admissions then rarely wait for a copy.
    # Capped at 1/8 of the pool, so the device cache stays mostly intact.
    evict_ahead = 0
    if write_back:
        pass_blocks = -(-config.scheduler.max_num_batched_tokens // config.block_size)
        evict_ahead = min(pass_blocks, config.cache.num_gpu_blocks // 8)
    connector = TierConnector(
        config, pool, cpu, prefill_ms, write_back=write_back, evict_ahead=evict_ahead,
        storage=_storage(config, shared), engine_id=engine_id,
    )  # fmt: skip
    kv = KVCacheManager(pool, make_room=connector.policy.make_room)
    return KVStack(pool, kv, cpu, connector)


def _python_pool(config: EngineConfig, cpu: LruTier | None) -> BlockPool:
    return BlockPool(
        config.cache.num_gpu_blocks,
        config.block_size,
        enable_caching=config.cache.enable_prefix_caching,
        eviction_policy=config.cache.eviction_policy,
        record_events=config.cache.enable_kv_cache_events,
        # A tier's copy records its tokens only for its BlockStored events.
        keep_tokens=cpu is not None and cpu.record_events,
        groups=config.layout.groups,
    )
