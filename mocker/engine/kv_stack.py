"""An engine's KV storage, assembled from its config: device pool, CPU tier, connector, manager."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mocker.config import EngineConfig, OffloadPolicy
from mocker.kv.block_pool import BlockPool
from mocker.kv.manager import KVCacheManager
from mocker.tiers.connector import TierConnector
from mocker.tiers.lru import LruTier

__all__ = ["KVStack", "build_kv_stack"]


@dataclass(frozen=True, slots=True)
class KVStack:
    """The parts: the device pool, its manager, and (with tiers) the CPU tier and connector."""

    pool: BlockPool
    kv: KVCacheManager
    cpu: LruTier | None = None
    connector: TierConnector | None = None


def build_kv_stack(
    config: EngineConfig, prefill_ms: Callable[[int], float], *, cpu: LruTier | None = None
) -> KVStack:
    """`prefill_ms` (the timing model's) decides whether a tier hit is worth loading. A `cpu`
    tier given from outside is used instead of one built from the config."""
    pool = BlockPool(
        config.num_gpu_blocks,
        config.block_size,
        enable_caching=config.enable_prefix_caching,
        eviction_policy=config.eviction_policy,
        record_events=config.enable_kv_cache_events,
        keep_tokens=config.has_host_tier or cpu is not None,
    )
    if cpu is None and config.has_host_tier:
        cpu = LruTier(
            config.num_host_blocks, config.block_size, record_events=config.enable_kv_cache_events
        )
    if cpu is None:
        return KVStack(pool, KVCacheManager(pool))
    write_back = config.offload_policy is OffloadPolicy.EVICT
    # Write-back copies in the background, as KVBM does, to keep about one pass's worth
    # of blocks reusable (or on their way): admissions then rarely wait for a copy.
    # Capped at 1/8 of the pool, so the device cache stays mostly intact.
    evict_ahead = 0
    if write_back:
        pass_blocks = -(-config.max_num_batched_tokens // config.block_size)
        evict_ahead = min(pass_blocks, config.num_gpu_blocks // 8)
    connector = TierConnector(
        config, pool, cpu, prefill_ms, write_back=write_back, evict_ahead=evict_ahead
    )
    kv = KVCacheManager(pool, make_room=connector.policy.make_room)
    return KVStack(pool, kv, cpu, connector)
