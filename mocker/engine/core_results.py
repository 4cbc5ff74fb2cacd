"""Results without a pass: transfers polled, KV events, stats, the snapshot and P/D holds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mocker.disagg.params import RemotePrefill, handoff_params
from mocker.disagg.pulls import PullRecord
from mocker.engine.core_state import CoreState
from mocker.engine.outputs import StepResult
from mocker.engine.stats import EngineSnapshot, SchedulerStats, TierSnapshot
from mocker.kv.events import KVEvent
from mocker.kv.hashing import BlockHash
from mocker.request import Request, RequestStatus
from mocker.scheduler.output import SchedulerOutput
from mocker.tiers.transfers import TransferRecord

__all__ = ["CoreResults"]


class CoreResults(CoreState):
    """EngineCore's read-only views, and what it hands out between passes (transfers, holds)."""

    # -- read-only views ----------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def snapshot(self) -> EngineSnapshot:
        """The engine's state now, as gauges and routers read it."""
        return EngineSnapshot(
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            kv_usage=self.pool.usage,
            cpu_usage=self.cpu.usage if self.cpu is not None else 0.0,
            num_unfinished=len(self.requests),
            num_used_blocks=self.pool.num_used,
            lora_adapters=self._lora_adapters() if self.config.lora.enable_lora else (),
            kv_expired=self.holds.num_expired if self.holds is not None else 0,
            kv_fetch=self._kv_fetch() if self.pulls is not None else (0, 0, 0),
            num_deferred=self.scheduler.num_deferred + len(self.scheduler.loading),
            group_usage=tuple(self._hybrid.group_usage()) if self._hybrid is not None else (),
            **self._tier_snapshot(),
        )

    def _kv_fetch(self) -> tuple[int, int, int]:
        """Requests by async KV load stage (vLLM's num_requests_kv_fetch_by_stage): whose
        pull has not started, whose load runs, whose KV landed but who do not run yet."""
        s = self.scheduler
        unstarted = sum(
            1 for r in self.requests.values()
            if r.remote_prefill is not None and r.status != RequestStatus.WAITING_FOR_REMOTE_KVS
        )  # fmt: skip
        return unstarted, len(s.loading), len(s.ready)

    def _lora_adapters(self) -> tuple[str, ...]:
        names = (r.lora_name for r in self.requests.values() if r.lora_name is not None)
        return tuple(dict.fromkeys(names))

    def _tier_snapshot(self) -> dict[str, Any]:
        connector = self.connector
        if connector is None:
            return {}
        jobs = connector.jobs()
        capacity = max(connector.cpu.capacity, 1)
        tiers = tuple(
            TierSnapshot(t.name, t.tier.usage, c.block_queries, c.block_hits,
                         c.promotion_failures, c.cascade_failures, promoting, cascading,
                         written / capacity, read / capacity)
            for t in connector.storage
            for c in (connector.counters[t.name],)
            for promoting, cascading, written, read in (jobs[t.name],)
        )  # fmt: skip
        p = connector.primary
        primary = TierSnapshot("primary", connector.cpu.usage, p.block_queries, p.block_hits)
        reading = sum(len(keys) for _, keys in connector.loads.blocks())
        return {"stores_skipped": connector.stores_skipped, "tiers": tiers,
                "primary": primary if tiers else None,
                "cpu_read_usage": reading / capacity,
                "cpu_write_usage": connector.cpu.num_incoming / capacity}  # fmt: skip

    def num_cached_prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of these hashes the device prefix cache holds."""
        if self._hybrid is not None:
            return self._hybrid.find_hit_blocks(block_hashes, len(block_hashes))
        return self.pool.num_cached_prefix(block_hashes)

    def has_pending_transfers(self) -> bool:
        """Transfers in flight, or KV held for a pull until a lease ends: the core needs
        driving until they end."""
        return (
            (self.connector is not None and self.connector.has_pending)
            or bool(self.pulls)
            # A hold that can expire (a claimed one waits for another engine's pull).
            or (self.holds is not None and self.holds.next_deadline() is not None)
        )

    def next_transfer_deadline(self) -> float | None:
        """When a transfer next ends, a load or pull times out, a posted store starts or a
        hold expires (None: nothing in flight)."""
        deadline = None if self.connector is None else self.connector.next_deadline()
        for part in (self.pulls, self.holds):
            if part:
                d = part.next_deadline()
                if d is not None and (deadline is None or d < deadline):
                    deadline = d
        return deadline

    def waits_on_peers(self) -> bool:
        """KV held for other engines' pulls: what frees it happens there (P/D)."""
        return bool(self.holds)

    @property
    def has_transfer_parts(self) -> bool:
        """Tiers or P/D: a live driver needs a transfer timer."""
        return self.connector is not None or self.pulls is not None or self.holds is not None

    @property
    def has_tier_news(self) -> bool:
        """Transfer records or tier events that another engine's poll left for this one
        (a tier shared with it), waiting for its next step or `advance_transfers`."""
        return self.connector is not None and self.connector.has_pending_records

    @property
    def transfer_version(self) -> int:
        """Changes whenever a transfer, pull or hold starts or ends (the timer re-arms)."""
        return sum(p.version for p in (self.connector, self.pulls, self.holds) if p is not None)

    def stall_error(self) -> RuntimeError:
        """What a driver raises when a pass scheduled nothing although requests remain (a bug:
        every admitted request fits the pool, and running requests preempt others for room)."""
        return RuntimeError(
            f"engine stalled: {len(self.requests)} unfinished requests, none schedulable"
        )

    # -- results without a pass ---------------------------------------------------------------

    def advance_transfers(self, now: float) -> StepResult:
        """Apply the transfers due by `now` without running a pass (an idle result)."""
        self.time = max(self.time, now)
        records = self._poll_transfers(now)
        pulled = self._poll_pd(now)
        return StepResult(now, now, [], self._stats(), [], self._take_events(), records, pulled)

    def reset_prefix_cache(
        self, now: float, *, whole: bool = False, reset_running: bool = False
    ) -> tuple[int | None, StepResult]:
        """Clear the device prefix cache of blocks nobody references; returns the number
        cleared and an idle result carrying the events: AllBlocksCleared, then BlockStored for
        what every tier still holds. `whole`: vLLM 0.34's reset, refused (None) while any
        block is referenced; `reset_running` preempts the running requests first (they
        recompute)."""
        self.time = max(self.time, now)
        preempted = self.scheduler.preempt_running() if reset_running else None
        if whole and self.pool.num_used:
            return None, StepResult(now, now, [], self._stats(preempted), [], [], [])
        pending = self._take_events()  # recorded before the reset: they go out first
        cleared = self.pool.reset_prefix_cache()
        if self.connector is not None:
            self.connector.announce()
        events = pending + self._take_events()
        return cleared, StepResult(now, now, [], self._stats(preempted), [], events, [])

    def _poll_pd(self, now: float) -> list[PullRecord]:
        """Pulls that ended (KV landed, or failed: recompute) and holds that expired."""
        if self.holds:
            for request in self.holds.expire(now):
                self.scheduler.free_finished(request)
        pulls = self.pulls
        if not pulls:
            return []
        loaded, failed = pulls.poll(now)
        for request in loaded:
            request.remote_prefill = None
            self.kv.finish_pull(request)
            self.scheduler.resume(request)
        for request in failed:
            request.remote_prefill = None  # vLLM's kv_load_failure_policy "recompute"
            self.kv.free(request)
            if request.num_cached_tokens < 0:
                request.tier_hits = ()
            self.scheduler.requeue(request)
        records = pulls.take_records()
        for record in records:
            pulled = self.requests.get(record.request_id)
            if pulled is not None:
                pulled.pull_time += record.duration
        return records

    def _poll_transfers(self, now: float) -> list[TransferRecord]:
        connector = self.connector
        if connector is None:
            return []
        loaded, timed_out = connector.poll(now)
        for request in loaded:
            # The loaded blocks are in the CPU tier (pinned while read): nothing to store.
            self.kv.finish_load(request)
            self.scheduler.resume(request)
        for request in timed_out:
            self.kv.free(request)  # its load was cancelled: recompute, never load again
            request.skip_tier_load = True
            self.scheduler.requeue(request)
        return connector.take_records()

    def _take_events(self) -> list[KVEvent]:
        events = self.pool.take_events()
        if self._tier_events:
            tier_events = self.connector.take_events()  # type: ignore[union-attr]
            if tier_events:
                events = events + tier_events
        return events

    def _stats(
        self, sched: SchedulerOutput | None = None, num_generated: int = 0
    ) -> SchedulerStats:
        s = self.scheduler
        return SchedulerStats.of(
            len(s.running), s.num_waiting, self.pool.usage, sched, num_generated
        )

    # -- P/D holds ----------------------------------------------------------------------------

    def release_hold(self, hold_id: str) -> bool:
        """A decode engine has read a held request's KV (or gave up on it): free its blocks.
        False if nothing was held under that id (the hold expired, or never was)."""
        request = None if self.holds is None else self.holds.release(hold_id)
        if request is None:
            return False
        self.scheduler.free_finished(request)
        return True

    def extend_holds(self, hold_ids: Sequence[str], now: float) -> int:
        """A decode engine's heartbeat for the holds it still wants: each lease runs on for
        two thirds of its length from `now` (vLLM's kv_lease_duration * 2 // 3). How many of
        them this engine still holds."""
        holds = self.holds
        if holds is None:
            return 0
        until = now + holds.timeout * 2 / 3
        return sum(holds.extend(hold_id, until) for hold_id in hold_ids)

    def claim_hold(self, hold_id: str) -> bool:
        """The hold lasts until released (a driver whose decode engines never die: replay,
        where heartbeats would keep every claimed lease alive)."""
        return self.holds is not None and self.holds.extend(hold_id, math.inf)

    def remote_sources(self) -> list[RemotePrefill]:
        """P/D decode side: the prefill engines' holds this engine's requests still want
        (waiting for their pull, or pulling): what its heartbeats name."""
        return [r.remote_prefill for r in self.requests.values() if r.remote_prefill is not None]

    def held_params(self, request_id: str) -> dict[str, Any] | None:
        """The kv_transfer_params of a request this engine holds for a pull (None: none)."""
        if self.holds is None:
            return None
        hold_id = self.holds.hold_id_of(request_id)
        request = None if hold_id is None else self.holds.request(hold_id)
        return None if request is None else self._handoff(request)

    def _handoff(self, request: Request) -> dict[str, Any] | None:
        """The kv_transfer_params a held request answers with, naming where its KV is (the
        fields of vLLM's NixlConnector.request_finished); None if it is not held."""
        hold_id = None if self.holds is None else self.holds.hold_id_of(request.request_id)
        if hold_id is None:
            return None
        host, port = self.side_channel
        return handoff_params(self.config, hold_id, host, port, blocks=request.blocks,
                              num_computed_tokens=request.num_computed_tokens,
                              num_cached_tokens=request.num_cached_tokens)  # fmt: skip
