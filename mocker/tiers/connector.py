"""The scheduler-side connector (vLLM's KVConnector scheduler hooks) to the tiers below the
device: how many more blocks they hold for a request (or "retry later" while a promotion is
in flight), loads into reserved device slots, stores as the store policy decides, cascades
to secondary tiers, and whether a finished request's free must wait.

It turns the engine's decisions into transfers on channels keyed by (source tier,
destination tier) and applies their completions. It is driven by the engine core with
explicit times, like everything in the core, and never acts in the future: a copy that
follows a pass is posted for the pass's end and started by the first `poll` that reaches
that time. A poll applies what is due one event at a time, in time order (a store that
ends starts its cascade at its end time, a promotion that ends frees its hold then), so the
same code is exact on a virtual clock. A channel of a tier shared by several engines (`obj`)
is advanced by whichever engine polls first; each transfer calls back the engine that
started it. The live driver's transfer timer only sleeps until `next_deadline()` and asks
the engine loop to `poll`; a virtual-clock driver jumps there. Same code, two clocks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from mocker.config import EngineConfig
from mocker.kv.events import KVEvent
from mocker.kv.manager import DevicePool
from mocker.request import Request
from mocker.tiers.channel import earliest_of, finish_due_of
from mocker.tiers.context import TierContext
from mocker.tiers.loads import Load, Loads
from mocker.tiers.lookups import Lookups
from mocker.tiers.lru import LruTier
from mocker.tiers.pricing import LoadPricing
from mocker.tiers.promotions import Promotion, Promotions
from mocker.tiers.storage import StorageTier
from mocker.tiers.store_policy import WriteBack, WriteThrough
from mocker.tiers.stores import Stores
from mocker.tiers.sync_loads import SyncLoads
from mocker.tiers.tier import BlockKey
from mocker.tiers.transfers import TransferRecord

__all__ = ["TierConnector"]


class TierConnector(TierContext):
    """Owns the CPU tier's channels, the secondary tiers' use by this engine and every
    transfer it started; the store policy (mocker.tiers.store_policy) decides what is
    copied to the CPU tier when.

    The policy reserves CPU slots and copies through `stores` (`Stores.plan`, `Stores.start`);
    when a copy ends the block becomes visible in the CPU tier, the policy is told
    (`stored`) to release the device side, and the block is cascaded to every secondary
    tier (its CPU copy pinned until each cascade ends): `Stores`. A lookup that finds the
    request's continuation in a secondary tier starts a promotion to the CPU tier and
    answers "retry later" (`Promotions`); the next lookup after it lands finds the blocks in
    the CPU tier and loads them into device slots the scheduler reserved (`Loads`). This
    class is the door: lookups, the time, deadlines and the poll that applies what is due.
    """

    def __init__(
        self,
        config: EngineConfig,
        pool: DevicePool,
        cpu: LruTier,
        prefill_ms: Callable[[int], float],
        *,
        write_back: bool = False,
        evict_ahead: int = 0,
        storage: Sequence[StorageTier] = (),
        engine_id: int = 0,
    ) -> None:
        super().__init__(config, pool, cpu, storage, engine_id)
        # (The channels' next deadline, and their transfers ended by a time: compiled with them.)
        self._earliest = earliest_of()
        self._finish_due = finish_due_of()
        self.stores = Stores(self)
        self.policy = (
            WriteBack(self, self.stores, evict_ahead)
            if write_back
            else WriteThrough(self, self.stores, prompt_only=config.offload.offload_prompt_only)
        )
        self.loads = Loads(self)
        # LMCache's synchronous retrieval (None: loads run between passes, as vLLM's).
        self.sync_loads = (
            SyncLoads(self, self.loads, self.h2d_link) if config.offload.sync_loads else None
        )
        pricing = LoadPricing(config, self.block_bytes, prefill_ms)
        self.promotions = Promotions(self, pricing)
        self.lookups = Lookups(self, self.promotions, pricing, self.sync_loads)
        # (The parts' tables, read on every lookup and poll; never rebound.)
        self._storing = self.stores.storing
        self._cascading = self.stores.cascading
        self._posted = self.stores.posted
        self._loads = self.loads.active
        self._promotions = self.promotions.active
        self._holds = self.promotions.holds
        self._shared = self.has_shared_tier
        self._deadline: float | None = None
        self._deadline_version = -1

    # -- lookups ------------------------------------------------------------------------------

    def num_matched_blocks(self, request: Request, num_device_blocks: int) -> int | None:
        """Blocks to load after a device hit (`Lookups.num_matched_blocks`)."""
        return self.lookups.num_matched_blocks(request, num_device_blocks)

    def skip_lookup(self, request: Request) -> None:
        """The request is admitted without a lookup (`Lookups.skip`)."""
        self.lookups.skip(request)

    # -- state --------------------------------------------------------------------------------

    @property
    def write_back(self) -> bool:
        return isinstance(self.policy, WriteBack)

    @property
    def has_pending(self) -> bool:
        return bool(
            self._storing or self._loads or self._promotions or self._cascading
            or self._posted or self.policy.has_staged
        )  # fmt: skip

    @property
    def quiet_for_decodes(self) -> bool:
        """Whether passes in which every running request decodes a token leave the connector
        as it is, so a replay may run them at once (mocker/engine/decode_runs.py): nothing
        in flight, posted, staged, held or looked up, and a store policy that stores prompt
        blocks only as they are computed (write-through, offload_prompt_only), so decoding
        stores nothing. A tier shared with other engines is no reason to step: with nothing
        of this engine's in flight, no completion on a shared channel calls it back, and
        the other engines' polls advance those channels in time order without it."""
        policy, promotions = self.policy, self.promotions
        return (
            type(policy) is WriteThrough
            and policy.prompt_only
            and not (self.has_pending or self._holds or promotions.released
                     or promotions.looked_up)
        )  # fmt: skip

    @property
    def has_shared_tier(self) -> bool:
        """A tier shared with other engines: a virtual-clock driver must poll this engine at
        every deadline, even during a pass, so the shared channels see times in order."""
        return any(t.shared for t in self.storage)

    @property
    def stores_in_flight(self) -> bool:
        """Device → CPU copies started or posted: their device blocks come back when they
        end."""
        return bool(self._storing or self._posted)

    @property
    def num_held_blocks(self) -> int:
        """Blocks of finished requests held until their copies end (for checks)."""
        return self.policy.num_held_blocks

    @property
    def num_loading(self) -> int:
        return len(self._loads)

    @property
    def num_promoting(self) -> int:
        return len(self._promotions)

    @property
    def stored_blocks(self) -> int:
        """Blocks copied to the CPU tier so far (for checks)."""
        return self.stores.stored_blocks

    @property
    def loaded_blocks(self) -> int:
        """Blocks loaded into the device so far (for checks)."""
        return self.loads.loaded_blocks

    @property
    def stores_skipped(self) -> int:
        """Blocks the CPU tier had no room for (all pinned): vLLM 0.34's stores_skipped."""
        return self.stores.skipped

    def cpu_pins(self) -> dict[BlockKey, int]:
        """The pins the connector holds on CPU-tier keys: loads, holds, cascades (checks)."""
        pins: dict[BlockKey, int] = {}
        runs = [ld.hashes for ld in self._loads.values()]
        runs += [run for hold in self._holds.values() for run in hold]
        runs += [p.hold for p in self._promotions.values()] + self.promotions.released
        runs += self._cascading.values()
        for run in runs:
            for key in run:
                pins[key] = pins.get(key, 0) + 1
        return pins

    def jobs(self) -> dict[str, tuple[int, int, int, int]]:
        """Per secondary tier: (promotions, cascades) in flight, and the CPU blocks they
        write and read (vLLM 0.34's active jobs and primary-tier usage by tier)."""
        out = {name: (0, n, 0, blocks) for name, (n, blocks) in self.stores.cascades.items()}
        for promotion in self._promotions.values():
            name = promotion.tier.name
            n, cascading, written, read = out[name]
            out[name] = (n + 1, cascading, written + len(promotion.keys), read)
        return out

    def next_deadline(self) -> float | None:
        """When something next needs the engine's attention: a transfer ends, a load or
        promotion times out, or a posted store is due (None: nothing)."""
        # Kept until the version changes (every start, end and cancel bumps it), unless a
        # shared tier's channels are in the list: another engine's transfers move them.
        if self._deadline_version == self.version and not self._shared:
            return self._deadline
        return self._keep_deadline(self._earliest(self.channels)[0])

    def _keep_deadline(self, t: float) -> float | None:
        """The next deadline, given the channels' (`t`), kept for this version."""
        if self._posted and self._posted[0][0] < t:
            t = self._posted[0][0]
        timeouts = self.timeouts
        if timeouts and timeouts[0][0] < t:  # (the live head is no earlier than the head)
            timeout = self._next_timeout()
            if timeout is not None and timeout < t:
                t = timeout
        self._deadline = None if t == math.inf else t
        self._deadline_version = self.version
        return self._deadline

    @property
    def has_pending_records(self) -> bool:
        """Transfer records or secondary-tier events not yet taken (`take_records`,
        `take_events`): what another engine's poll leaves here when it ends this engine's
        copy on a shared channel, or a copy that changes a shared tier."""
        return bool(self.records) or any(t.has_events(self.engine_id) for t in self.storage)

    def take_records(self) -> list[TransferRecord]:
        if not self.records:
            return []
        out, self.records = self.records, []
        return out

    def take_events(self) -> list[KVEvent]:
        """The CPU tier's and the secondary tiers' events since the last call."""
        if not self.cpu.record_events:
            return []  # (no tier publishes without the CPU tier: __init__)
        events = self.cpu.take_events()
        for tier in self.storage:
            more = tier.take_events(self.engine_id)
            if more:
                events = events + more
        return events

    def announce(self) -> None:
        """Every tier records a BlockStored for what it holds (after AllBlocksCleared)."""
        self.cpu.announce()
        for tier in self.storage:
            tier.announce()

    # -- the engine's calls ---------------------------------------------------------------------

    def request_finished(self, request: Request) -> bool:
        """A request finished: True if its blocks must wait for copies in flight (vLLM's
        delay_free; the policy holds them), False to free them now."""
        return self.policy.request_finished(request)

    def drop_request(self, now: float, request: Request) -> None:
        """The request ended (abort, finish) outside a load: its promotion is cancelled and
        its hold released."""
        self.promotions.drop(now, request)
        if self.sync_loads is not None:
            self.sync_loads.forget(request)

    def scheduled(self, now: float, loads: Sequence[tuple[Request, int, int]]) -> None:
        """The pass at `now` was scheduled: its loads start (`start_load`: request, first
        block, number of blocks), the holds they replace go (`end_schedule`), and the store
        policy hears of it. (One call a pass: every pass makes it.)"""
        for request, start, num_blocks in loads:
            self.loads.start(now, request, start, num_blocks)
        promotions = self.promotions
        if promotions.looked_up or promotions.released:
            promotions.end_schedule()
        after = self.policy.after_schedule
        if after is not None:
            after(now)

    def flush_lmcache(self) -> None:
        """LMCache's stats logger's turn (every 10 s, whether or not the engine runs)."""
        if self.lmcache is not None:
            disk = sum(t.tier.num_used for t in self.storage if t.name == "fs")
            self.lmcache.flush(self.cpu.num_used * self.block_bytes, disk * self.block_bytes)

    def cancel_load(self, now: float, request: Request) -> bool:
        """Drop a request's load (abort, timeout); its CPU blocks are unpinned. The
        caller frees the device slots."""
        return self.loads.cancel(now, request)

    # -- completions --------------------------------------------------------------------------

    def poll(self, now: float) -> tuple[list[Request], list[Request]]:
        """Apply everything due by `now`, one event at a time in time order: posted stores
        start, transfers end (on this engine's channels and on shared ones, whoever started
        them), loads and promotions time out. Returns (requests whose KV loaded, requests
        whose load timed out). Requests whose promotion failed are still waiting: their
        next lookup answers 0."""
        timed_out: list[Request] = []
        if self._deadline_version == self.version and not self._shared:
            # (Kept by the last poll or `next_deadline`: a poll between events returns here.)
            due = self._deadline
            if due is None or due > now:
                if now > self.time:
                    self.time = now
                return [], timed_out
        finish_due, channels = self._finish_due, self.channels
        posted, timeouts = self._posted, self.timeouts
        while True:
            # The next posted store or timeout (the heap's head may be a job that ended), if
            # before `now`; every copy that ends by then ends first (at one instant, copies
            # end first, a timeout then loses: the copy made it; then posted stores start).
            bound = now
            if posted and posted[0][0] < bound:
                bound = posted[0][0]
            if timeouts and timeouts[0][0] < bound:
                bound = timeouts[0][0]
            t = finish_due(channels, bound)
            if bound > self.time:
                self.time = bound
            if timeouts and timeouts[0][0] <= bound:
                deadline, _, job = timeouts[0]
                if job.live:
                    self._time_out(deadline, timed_out)
                else:
                    heapq.heappop(timeouts)  # (a job that ended)
            elif posted and posted[0][0] <= bound:
                self.stores.start_posted()
            elif bound < now:
                continue  # (a head moved during the callbacks: no callback does that today)
            else:
                self._keep_deadline(t)  # (for the driver's next ask, and the next poll)
                break
        return self.loads.take_ended(), timed_out

    def _time_out(self, now: float, timed_out: list[Request]) -> None:
        _, _, job = heapq.heappop(self.timeouts)
        request = job.request
        if isinstance(job, Load):
            self.loads.cancel(now, request)
            timed_out.append(request)
        elif isinstance(job, Promotion):
            job.tier.read.cancel(now, job.tid)
            self.counters[job.tier.name].promotion_failures += 1
            self.promotions.failed(job, now)

    def _next_timeout(self) -> float | None:
        timeouts = self.timeouts
        while timeouts and not timeouts[0][2].live:
            heapq.heappop(timeouts)
        return timeouts[0][0] if timeouts else None
