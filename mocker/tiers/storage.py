"""A secondary tier below the CPU tier (vLLM's tiering `fs` and `obj`): its residency, its
links to and from the CPU tier, its failure draws and its KV events, per subscriber."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from mocker.kv.events import BlockRemoved, BlockStored, KVEvent
from mocker.storage_spec import StorageKind, StorageTierSpec
from mocker.tiers.channel import open_channel
from mocker.tiers.link import Link
from mocker.tiers.lru import LruTier
from mocker.tiers.tier import BlockBatch, BlockKey, Locality, Medium, StorePlan

__all__ = ["StorageTier"]


class StorageTier:
    """One secondary tier: an LRU residency (medium STORAGE) and two links, CPU → tier
    (cascaded stores) and tier → CPU (promotions). `fs` belongs to one engine; `obj` is built
    once per process and every engine's connector attaches to it, so they share its
    residency and its bandwidth (each transfer calls back the engine that started it).

    Every attached engine publishes every change of the tier, with `locality` relative to
    itself: LOCAL for what it stored, REMOTE for what another engine stored (an `fs` tier
    has one subscriber, so all its blocks are LOCAL). A router that applies every engine's
    stream then knows, for each engine, every block it could load from this tier. A key can
    be in `fs` and `obj` at once (stores cascade to both): STORAGE events count copies, so
    an index keeps a count per (key, locality).
    """

    def __init__(
        self,
        spec: StorageTierSpec,
        block_size: int,
        block_bytes: int,
        *,
        speedup: float = 1.0,
        record_events: bool = False,
        seed: int = 0,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.shared = spec.kind is StorageKind.OBJ
        self.block_bytes = block_bytes
        self.tier = LruTier(
            spec.capacity_blocks, block_size, name=spec.name, medium=Medium.STORAGE,
            record_events=record_events,
        )  # fmt: skip
        latency = spec.latency_ms / 1000.0
        # An unscaled model answers "does a promotion pay off"; the channels carry transfers.
        self.read_model = Link(spec.read_gbps * 1e9, latency)
        write = Link(spec.write_gbps * 1e9 * speedup, latency / speedup)
        read = Link(spec.read_gbps * 1e9 * speedup, latency / speedup)
        self.write = open_channel(write, "cpu", spec.name)
        self.read = open_channel(read, spec.name, "cpu")
        self._rng = random.Random(f"{seed}:{spec.name}")  # str seeds are deterministic
        # Who stored each resident or incoming key (kept only when the tier publishes events).
        self._storer: dict[BlockKey, int] = {}
        self._queues: dict[int, list[KVEvent]] = {}  # per subscriber

    def subscribe(self, engine: int) -> None:
        """An engine's connector attaches (it receives the tier's events from now on)."""
        self._queues.setdefault(engine, [])

    def fails(self) -> bool:
        """Draw whether the copy that ends now failed (the tier's failure rate)."""
        rate = self.spec.failure_rate
        return rate > 0 and self._rng.random() < rate

    # -- residency, with the storer remembered ------------------------------------------------

    def prepare_store(self, blocks: BlockBatch, engine: int) -> StorePlan:
        plan = self.tier.prepare_store(blocks)
        if not self.tier.record_events:
            return plan  # (whose block it is matters to events only)
        self._fan_out()  # the evictions, while their storers are known
        storer = self._storer
        for key in plan.evicted:
            storer.pop(key, None)
        storer.update(dict.fromkeys(plan.keys, engine))
        return plan

    def complete_store(self, keys: Sequence[BlockKey], success: bool) -> None:
        self.tier.complete_store(keys, success)
        if not success:
            for key in keys:
                self._storer.pop(key, None)
        if self.tier.record_events:
            self._fan_out()

    def has_events(self, engine: int) -> bool:
        """Events waiting for `engine` (`take_events`)."""
        return bool(self._queues.get(engine))

    def take_events(self, engine: int) -> list[KVEvent]:
        queue = self._queues.get(engine)
        if not queue:
            return []
        self._queues[engine] = []
        return queue

    def announce(self) -> None:
        self.tier.announce()
        self._fan_out()

    def _fan_out(self) -> None:
        events = self.tier.take_events()
        if not events:
            return
        queues, storer = self._queues, self._storer
        for engine, queue in queues.items():
            for event in events:
                if isinstance(event, BlockStored | BlockRemoved):
                    # A run is stored (or an eviction made) for one engine's copy: its
                    # first key tells whose.
                    mine = storer.get(event.block_hashes[0]) == engine
                    queue.append(replace(event, locality=_locality(mine)))
                else:
                    queue.append(event)


def _locality(mine: bool) -> str:
    return (Locality.LOCAL if mine else Locality.REMOTE).value
