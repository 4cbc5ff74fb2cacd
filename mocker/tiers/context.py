"""What the connector's parts share: the tiers, the channels, the sizes, the time, the
transfer records and the timeouts (the connector is one; its parts take it as this)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Protocol

from mocker.config import EngineConfig
from mocker.kv.manager import DevicePool
from mocker.request import Request
from mocker.tiers.channel import TransferChannel, open_channel
from mocker.tiers.link import Link
from mocker.tiers.lmcache_stats import LMCacheStats
from mocker.tiers.lru import LruTier
from mocker.tiers.policy import StorePolicy
from mocker.tiers.storage import StorageTier
from mocker.tiers.transfers import DEVICE, TierCounters, TransferKind, TransferRecord

__all__ = ["TierContext", "TimedJob"]


class TimedJob(Protocol):
    """A load or a promotion: its timeout's heap entry is dead once it is not live."""

    request: Request
    live: bool


class TierContext:
    """The tiers this engine uses and the state every transfer touches."""

    device = DEVICE
    policy: StorePolicy  # (set by the connector once its stores exist)

    def __init__(
        self,
        config: EngineConfig,
        pool: DevicePool,
        cpu: LruTier,
        storage: Sequence[StorageTier],
        engine_id: int,
    ) -> None:
        self.config = config
        self.pool = pool
        self.cpu = cpu
        self.storage = list(storage)
        self.engine_id = engine_id
        # A tier's unit: a device block, or (hybrid models) a chunk of `unit` blocks of every
        # KV cache group (mocker.tiers.hybrid_store); sizes and lookups count in units.
        self.unit = config.unit_blocks
        self.block_bytes = config.unit_bytes
        self.batch_size = config.offload.offload_batch_size
        self.block_size = config.block_size * self.unit
        # Device blocks stored and found as one (a hybrid model's unit is its chunk already).
        self.chunk = config.offload.chunk_blocks if self.unit == 1 else 1
        speedup = config.speedup_ratio
        latency_s = config.offload.transfer_latency_ms / 1000.0
        # The channels carry transfers, keyed by (source tier, destination tier), at the
        # modelled bandwidths times the speedup.
        d2h_link = Link(config.offload.cpu_write_gbps * 1e9 * speedup, latency_s / speedup)
        h2d_link = Link(config.offload.cpu_read_gbps * 1e9 * speedup, latency_s / speedup)
        self.d2h = open_channel(d2h_link, DEVICE, cpu.name)
        self.h2d = open_channel(h2d_link, cpu.name, DEVICE)
        self.h2d_link = h2d_link
        # What LMCache's worker counts, when its metrics are served (None: not counted).
        self.lmcache = (
            LMCacheStats(config.offload.chunk_blocks * self.block_size)
            if config.offload.lmcache_api is not None
            else None
        )
        self.channels: list[TransferChannel] = [self.d2h, self.h2d]
        for tier in self.storage:
            if tier.tier.record_events and not cpu.record_events:
                # A cascade copies the CPU tier's event records: a tier publishes only with
                # the CPU tier (which may publish without it: vLLM's enable_kv_events).
                raise ValueError(f"only the {tier.name} tier records KV events: the CPU tier "
                                 "must too")  # fmt: skip
            tier.subscribe(engine_id)
            self.channels += [tier.write, tier.read]
        self.counters: dict[str, TierCounters] = {t.name: TierCounters() for t in self.storage}
        self.primary = TierCounters()  # the CPU tier's lookups (tiering's primary tier)
        self.time = -math.inf  # the latest time the connector was driven to
        self.load_timeout = config.offload.load_timeout / speedup
        # Bumped whenever a transfer starts, ends or is cancelled: the live driver re-arms
        # its transfer timer when it changes.
        self.version = 0
        self.timeouts: list[tuple[float, int, TimedJob]] = []  # a heap
        self._order = 0
        self.records: list[TransferRecord] = []

    def push_timeout(self, deadline: float, job: TimedJob) -> None:
        """A load's or a promotion's timeout, applied by the poll that reaches it."""
        heapq.heappush(self.timeouts, (deadline, self._order, job))
        self._order += 1

    def record(
        self,
        kind: TransferKind,
        src: str,
        dst: str,
        n: int,
        start: float,
        end: float,
        ok: bool = True,
    ) -> None:
        """A finished transfer's record, for metrics and reports."""
        # (tuple.__new__ directly: a named tuple's own __new__ is a Python function)
        record = (kind, n, n * self.block_bytes, start, end, src, dst, ok)
        self.records.append(tuple.__new__(TransferRecord, record))
