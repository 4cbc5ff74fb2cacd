"""An engine's KV storage, assembled from its config: device pool, host tier, offload, manager."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mocker.config import EngineConfig, OffloadPolicy
from mocker.kv.block_pool import BlockPool
from mocker.kv.manager import KVCacheManager
from mocker.tiers.host import HostTier
from mocker.tiers.offload import OffloadManager

__all__ = ["KVStack", "build_kv_stack"]


@dataclass(frozen=True, slots=True)
class KVStack:
    """The parts, and the offload policy's two knobs the engine applies after a pass."""

    pool: BlockPool
    host: HostTier | None
    offload: OffloadManager | None
    kv: KVCacheManager
    write_through: bool  # copy new full prompt blocks to host after their pass
    # Offload on eviction: keep this many device blocks reusable (or on their way) by
    # copying dirty ones in the background; 0 for none.
    evict_ahead: int


def build_kv_stack(config: EngineConfig, prefill_ms: Callable[[int], float]) -> KVStack:
    """`prefill_ms` (the timing model's) decides whether a host hit is worth loading."""
    host = None
    if config.has_host_tier:
        host = HostTier(
            config.num_host_blocks, config.block_size, record_events=config.enable_kv_cache_events
        )
    evict = host is not None and config.offload_policy is OffloadPolicy.EVICT
    pool = BlockPool(
        config.num_gpu_blocks,
        config.block_size,
        enable_caching=config.enable_prefix_caching,
        eviction_policy=config.eviction_policy,
        record_events=config.enable_kv_cache_events,
        keep_tokens=host is not None,
        host_holds=host.holds if evict and host is not None else None,
    )
    offload = OffloadManager(config, pool, host, prefill_ms) if host is not None else None
    # Offload on eviction copies in the background, as KVBM does, to keep about one
    # pass's worth of blocks reusable (or on their way): admissions then rarely wait
    # for a copy. Capped at 1/8 of the pool, so the device cache stays mostly intact.
    evict_ahead = 0
    if evict:
        pass_blocks = -(-config.max_num_batched_tokens // config.block_size)
        evict_ahead = min(pass_blocks, config.num_gpu_blocks // 8)
    return KVStack(
        pool=pool,
        host=host,
        offload=offload,
        kv=KVCacheManager(pool, offload),
        write_through=offload is not None and not evict,
        evict_ahead=evict_ahead,
    )
