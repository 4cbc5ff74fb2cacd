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
from dataclasses import dataclass
from functools import partial
from itertools import compress
from typing import TypeAlias

from mocker.config import EngineConfig
from mocker.kv.block import KVBlock
from mocker.kv.events import KVEvent
from mocker.kv.hashing import BlockHash
from mocker.kv.manager import DevicePool
from mocker.request import Request
from mocker.tiers.channel import TransferChannel, earliest_of, finish_due_of, open_channel
from mocker.tiers.hybrid_store import chunk_keys
from mocker.tiers.link import Link, TransferId
from mocker.tiers.lru import LruTier
from mocker.tiers.storage import StorageTier
from mocker.tiers.store_policy import Owners, StorePolicy, WriteBack, WriteThrough
from mocker.tiers.tier import BlockBatch, BlockKey
from mocker.tiers.transfers import TierCounters, TransferKind, TransferRecord

__all__ = ["DEVICE", "TierConnector"]

DEVICE = "gpu"  # the device's name in channel keys

# A store posted for a pass's end: (time, order, blocks, keys, owners, parent keys).
_Posted: TypeAlias = tuple[
    float, int, list[KVBlock], list[BlockHash], "Owners | None", "list[BlockHash | None] | None"
]
_NO_TRANSFER = TransferId(-1)  # (a job's id until its transfer starts)


@dataclass(slots=True, eq=False)
class _Load:
    """A CPU → device copy for a request (the second hop of a staged load)."""

    request: Request
    tid: TransferId
    hashes: Sequence[BlockHash]  # (a slice of the request's: a list, or a replay's array)
    start: float
    deadline: float  # the load timeout
    live: bool = True  # until it ends or is cancelled (its timeout's heap entry then is dead)


@dataclass(slots=True, eq=False)
class _Promotion:
    """A secondary tier → CPU copy for a request (the first hop of a staged load): the
    tier's blocks are pinned, the CPU slots reserved, and the request's CPU run pinned
    (its hold) so that nothing it will load is evicted meanwhile."""

    request: Request
    tier: StorageTier
    tid: TransferId
    keys: list[BlockKey]
    hold: Sequence[BlockKey]
    start: float
    deadline: float
    live: bool = True  # until it ends, fails or is cancelled


class TierConnector:
    """Owns the CPU tier's channels, the secondary tiers' use by this engine and every
    transfer it started; the store policy (mocker.tiers.store_policy) decides what is
    copied to the CPU tier when.

    The policy reserves CPU slots through `plan_store` and copies through `start_stores`;
    when a copy ends the block becomes visible in the CPU tier, the policy is told
    (`stored`) to release the device side, and the block is cascaded to every secondary
    tier (its CPU copy pinned until each cascade ends). A lookup that finds the request's
    continuation in a secondary tier starts a promotion to the CPU tier and answers "retry
    later"; the next lookup after it lands finds the blocks in the CPU tier and loads them
    into device slots the scheduler reserved.
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
        self.config = config
        self.pool = pool
        self.cpu = cpu
        self.storage = list(storage)
        self.engine_id = engine_id
        self.policy: StorePolicy = (
            WriteBack(self, evict_ahead)
            if write_back
            else WriteThrough(self, prompt_only=config.offload_prompt_only)
        )
        # A tier's unit: a device block, or (hybrid models) a chunk of `unit` blocks of every
        # KV cache group (mocker.tiers.hybrid_store); sizes and lookups count in units.
        self.unit = config.unit_blocks
        self.block_bytes = config.unit_bytes
        self.batch_size = config.offload_batch_size
        self.block_size = config.block_size * self.unit
        self._prefill_ms = prefill_ms
        speedup = config.speedup_ratio
        latency_s = config.transfer_latency_ms / 1000.0
        # An unscaled model answers "does this load pay off"; the scaled channels carry
        # transfers, keyed by (source tier, destination tier).
        self._h2d_model = Link(config.cpu_read_gbps * 1e9, latency_s)
        d2h_link = Link(config.cpu_write_gbps * 1e9 * speedup, latency_s / speedup)
        h2d_link = Link(config.cpu_read_gbps * 1e9 * speedup, latency_s / speedup)
        self.d2h = open_channel(d2h_link, DEVICE, cpu.name)
        self.h2d = open_channel(h2d_link, cpu.name, DEVICE)
        self.channels: list[TransferChannel] = [self.d2h, self.h2d]
        # (The channels' next deadline, and their transfers ended by a time: compiled with them.)
        self._earliest = earliest_of()
        self._finish_due = finish_due_of()
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
        self.stores_skipped = 0  # blocks the CPU tier had no room for (all pinned)
        self._time = -math.inf  # the latest time the connector was driven to
        # Stores posted for a pass's end (`_Posted`), a heap.
        self._posted: list[_Posted] = []
        self._order = 0
        self._load_timeout = config.load_timeout / speedup
        self._pays_off: dict[int, bool] = {}  # load_pays_off(n) of a CPU-tier hit of n
        self._loads: dict[Request, _Load] = {}
        self._promotions: dict[Request, _Promotion] = {}
        self._promoting: dict[BlockKey, _Promotion] = {}  # keys on their way to the CPU tier
        # Promoted runs kept for a retry (each pinned as itself: a pin is released with the
        # sequence that took it), and holds to unpin after this pass's loads.
        self._holds: dict[Request, list[Sequence[BlockKey]]] = {}
        self._released: list[Sequence[BlockKey]] = []
        # CPU runs found this pass, to spare: (keys, start, stop), cut only if a promotion
        # must pin them (most passes start none).
        self._looked_up: list[tuple[Sequence[BlockKey], int, int]] = []
        # Copies in flight, by the id of their block list: device → CPU (the device blocks)
        # and CPU → secondary tiers (the CPU keys they pin).
        self._storing: dict[int, list[KVBlock]] = {}
        self._cascading: dict[int, list[BlockKey]] = {}
        # Per secondary tier: cascades in flight to it, and the CPU blocks they read.
        self.cascades: dict[str, list[int]] = {t.name: [0, 0] for t in self.storage}
        self._loaded: list[Request] = []  # loads that ended since the last poll returned
        self._timeouts: list[tuple[float, int, _Load | _Promotion]] = []
        self._records: list[TransferRecord] = []
        # Bumped whenever a transfer starts, ends or is cancelled: the live driver re-arms
        # its transfer timer when it changes.
        self.version = 0
        self._shared = self.has_shared_tier
        self._deadline: float | None = None
        self._deadline_version = -1
        # Cumulative totals, for checks (metrics and reports read the records).
        self.stored_blocks = 0
        self.loaded_blocks = 0

    # -- planning -----------------------------------------------------------------------------

    def num_matched_blocks(self, request: Request, num_device_blocks: int) -> int | None:
        """Blocks to load after a device hit of `num_device_blocks` (vLLM's
        get_num_new_matched_tokens, in blocks): the contiguous continuation the CPU tier
        holds, if loading it pays off (else 0: recompute); None ("retry later") while the
        continuation is being promoted from a secondary tier. The lookup stops one token
        short of the prompt, as the device's does."""
        if request in self._promotions:
            return None
        hold = self._holds.pop(request, None)
        if hold is not None:
            self._released += hold  # unpinned once this pass's loads have pinned theirs
        if request.skip_tier_load:
            request.promoted = None
            return 0
        hashes = chunk_keys(request.block_hashes, self.unit)
        stop = min((len(request.all_token_ids) - 1) // self.block_size, len(hashes))
        n = self.cpu.lookup(hashes, num_device_blocks, stop)
        pos = num_device_blocks + n
        if self.storage and pos < stop:
            if hashes[pos] in self._promoting:
                return None  # another request's promotion brings it: wait for that
            found = self._in_storage(hashes, pos, stop)
            self._count_lookups(request, n, stop - pos, found)
            if found is not None and self._promote(request, hashes, num_device_blocks, pos,
                                                   *found):  # fmt: skip
                return None
        elif self.storage and stop > num_device_blocks:
            self._count_lookups(request, n, 0, None)
        pays = self._pays_off.get(n)
        if pays is None:  # (a pure function of n: kept)
            pays = self._pays_off[n] = bool(n) and self.load_pays_off(n)
        if not pays:
            request.promoted = None  # what was promoted for it is not loaded (now)
            return 0
        if self.storage:
            # Another request's promotion in this same pass may make room in the CPU tier:
            # the run is spared until this pass's loads have pinned theirs (`_promote` pins
            # these runs while it reserves; nothing else evicts from the CPU tier in a pass).
            self._looked_up.append((hashes, num_device_blocks, pos))
        return n

    def skip_lookup(self, request: Request) -> None:
        """The request is admitted without a lookup (or without loading what one found):
        what the connector kept for its retry is released, as a lookup would."""
        hold = self._holds.pop(request, None)
        if hold is not None:
            self._released += hold
        request.promoted = None

    def load_pays_off(self, num_blocks: int, promote_s: float = 0.0) -> bool:
        """Load rather than recompute: enough blocks, and copying them (after a promotion of
        `promote_s`) is faster than prefilling their tokens (unscaled model times, the
        transfers alone on their links)."""
        if num_blocks * self.unit < self.config.min_load_blocks:  # counted in device blocks
            return False
        transfer_s = promote_s + self._h2d_model.duration(num_blocks * self.block_bytes)
        return transfer_s * 1000.0 < self._prefill_ms(num_blocks * self.block_size)

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
        policy = self.policy
        return (
            type(policy) is WriteThrough
            and policy.prompt_only
            and not (self.has_pending or self._holds or self._released or self._looked_up)
        )

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

    def loading_blocks(self) -> list[tuple[Request, Sequence[BlockHash]]]:
        """Requests whose KV is loading and the CPU-tier keys they read (for checks)."""
        return [(ld.request, ld.hashes) for ld in self._loads.values()]

    def cpu_pins(self) -> dict[BlockKey, int]:
        """The pins the connector holds on CPU-tier keys: loads, holds, cascades (checks)."""
        pins: dict[BlockKey, int] = {}
        runs = [ld.hashes for ld in self._loads.values()]
        runs += [run for hold in self._holds.values() for run in hold]
        runs += [p.hold for p in self._promotions.values()] + self._released
        runs += self._cascading.values()
        for run in runs:
            for key in run:
                pins[key] = pins.get(key, 0) + 1
        return pins

    def store_batches(self) -> list[int]:
        """Blocks in each device-to-CPU copy in flight (for checks)."""
        return [len(blocks) for blocks in self._storing.values()]

    def storing_blocks(self) -> list[KVBlock]:
        """Device blocks whose copy to the CPU tier is in flight or posted (for checks)."""
        started = [b for blocks in self._storing.values() for b in blocks]
        return started + [b for posted in self._posted for b in posted[2]]

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
        timeouts = self._timeouts
        if timeouts and timeouts[0][0] < t:  # (the live head is no earlier than the head)
            timeout = self._next_timeout()
            if timeout is not None and timeout < t:
                t = timeout
        self._deadline = None if t == math.inf else t
        self._deadline_version = self.version
        return self._deadline

    @property
    def has_news(self) -> bool:
        """Transfer records or secondary-tier events not yet taken (`take_records`,
        `take_events`): what another engine's poll leaves here when it ends this engine's
        copy on a shared channel, or a copy that changes a shared tier."""
        return bool(self._records) or any(t.has_events(self.engine_id) for t in self.storage)

    def take_records(self) -> list[TransferRecord]:
        if not self._records:
            return []
        out, self._records = self._records, []
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

    # -- stores -------------------------------------------------------------------------------

    def plan_store(self, blocks: Sequence[KVBlock]) -> list[KVBlock]:
        """Reserve CPU slots for copies of these cached blocks; returns the blocks to copy
        (not held there yet, and room found). The policy hears of the keys the CPU tier
        evicted to make room."""
        return self.plan_store_keyed(blocks)[0]

    def plan_store_keyed(
        self, blocks: Sequence[KVBlock]
    ) -> tuple[list[KVBlock], list[BlockHash], list[BlockHash | None]]:
        """`plan_store`, and the keys of the blocks to copy and their parents' keys, in their
        order (so that neither the copy's start nor its cascade looks them up again)."""
        cpu, pool = self.cpu, self.pool
        # (The hashes of cached device blocks name their copies: the pool reads them, from
        # `KVBlock`s, a hybrid model's chunks, or the compiled pool's ids.)
        keys = pool.store_hashes(blocks)
        parents = pool.parent_hashes(blocks)
        meta = pool.token_meta(blocks, self.block_size) if cpu.record_events else None
        # (The tokens are needed only for the Stored events when the copy lands, here and in
        # the tiers the block cascades to, which publish only if the CPU tier does.)
        if cpu.reserve_all_new(keys, parents, meta):  # (device hashes are distinct)
            return (blocks if isinstance(blocks, list) else list(blocks)), keys, parents
        if cpu.holds_all(keys):  # (a prompt's last block recomputed after its load, most)
            return [], [], []
        plan = cpu.prepare_store(BlockBatch(keys, parents, meta, unique=True))
        self.stores_skipped += plan.skipped
        if plan.evicted:
            self.policy.cpu_evicted(plan.evicted)
        if len(plan.keys) == len(blocks):  # (then the batch's keys, in its order)
            return (blocks if isinstance(blocks, list) else list(blocks)), plan.keys, parents
        chosen = set(plan.keys)  # (a batch's keys are distinct: the plan keeps their order)
        kept = list(map(chosen.__contains__, keys))
        return list(compress(blocks, kept)), plan.keys, list(compress(parents, kept))

    def request_finished(self, request: Request) -> bool:
        """A request finished: True if its blocks must wait for copies in flight (vLLM's
        delay_free; the policy holds them), False to free them now."""
        return self.policy.request_finished(request)

    def start_stores(
        self,
        at: float,
        blocks: list[KVBlock],
        hashes: list[BlockHash] | None = None,
        owners: Owners | None = None,
        parents: list[BlockHash | None] | None = None,
    ) -> None:
        """Copy the blocks (CPU slots reserved by `plan_store`) from `at`: now if the
        connector has been driven that far, else posted until a poll reaches it. `owners`:
        the policy's tag of the blocks (runs of them), handed back to it when a copy ends;
        `parents`: their parents' keys, if the caller has them (their cascades name them).
        The lists are the connector's from now on (copies in flight keep them)."""
        if not blocks:
            return
        if hashes is None:
            hashes = self.pool.store_hashes(blocks)
        self.version += 1
        if at > self._time:
            heapq.heappush(self._posted, (at, self._order, blocks, hashes, owners, parents))
            self._order += 1
            return
        size = self.batch_size
        if len(blocks) <= size:  # one copy (most passes)
            self._start_store(at, blocks, hashes, owners, parents)
            return
        pieces = _cut_runs(owners, size) if owners is not None else None
        for i, lo in enumerate(range(0, len(blocks), size)):
            self._start_store(at, blocks[lo : lo + size], hashes[lo : lo + size],
                              None if pieces is None else pieces[i],
                              None if parents is None else parents[lo : lo + size])  # fmt: skip

    def _start_store(
        self, at: float, blocks: list[KVBlock], hashes: list[BlockHash], owners: Owners | None,
        parents: list[BlockHash | None] | None,
    ) -> None:  # fmt: skip
        # (A transfer's callback is a partial of a method: made in C, no closure factory.)
        done = partial(self._store_ended, blocks, hashes, parents, at, owners)
        self.d2h.start(at, len(blocks) * self.block_bytes, done)
        self._storing[id(blocks)] = blocks

    def _store_ended(
        self, blocks: list[KVBlock], hashes: list[BlockHash],
        parents: list[BlockHash | None] | None, start: float, owners: Owners | None, end: float,
    ) -> None:  # fmt: skip
        self.version += 1
        del self._storing[id(blocks)]
        self.cpu.complete_store(hashes)
        self.policy.stored(blocks, owners)
        n = len(blocks)
        self.stored_blocks += n
        self._record(TransferKind.STORE, DEVICE, self.cpu.name, n, start, end)
        if self.storage:
            self._cascade(hashes, end, parents)

    def _cascade(
        self, keys: list[BlockKey], now: float, parents: list[BlockKey | None] | None = None
    ) -> None:
        """Write-through from the CPU tier to every secondary tier, in parallel; the CPU
        copies (just landed: `parents`, their parent keys, if known) are pinned until each
        copy ends."""
        cpu = self.cpu
        for tier in self.storage:
            if tier.tier.record_events:
                run = tier.prepare_store(cpu.copies(keys), self.engine_id).keys
            else:
                # Without events whose copy it is matters to no one: the tier's residency
                # reserves the batch (all new and room for all, most batches) in one call.
                if parents is None:
                    parents = cpu.parents(keys)
                run = list(keys)  # (each cascade's own list: its pin and copy are named by it)
                if not tier.tier.reserve_all_new(run, parents, None):
                    batch = BlockBatch(run, parents, None, unique=True)
                    run = tier.prepare_store(batch, self.engine_id).keys
            if not run:
                continue
            cpu.pin_landed(run)
            self._cascading[id(run)] = run
            active = self.cascades[tier.name]
            active[0] += 1
            active[1] += len(run)
            done = partial(self._cascade_ended, tier, run, now)
            tier.write.start(now, len(run) * self.block_bytes, done)

    def _cascade_ended(
        self, tier: StorageTier, keys: list[BlockKey], start: float, end: float
    ) -> None:
        del self._cascading[id(keys)]
        active = self.cascades[tier.name]
        active[0] -= 1
        active[1] -= len(keys)
        ok = not (tier.spec.failure_rate and tier.fails())  # (no draw without a rate)
        tier.complete_store(keys, ok)
        self.cpu.unpin(keys)
        if ok:
            self._record(TransferKind.STORE, self.cpu.name, tier.name, len(keys), start, end)
        else:
            self.counters[tier.name].cascade_failures += 1
        self.version += 1

    # -- promotions (secondary tier → CPU) ----------------------------------------------------

    def jobs(self) -> dict[str, tuple[int, int, int, int]]:
        """Per secondary tier: (promotions, cascades) in flight, and the CPU blocks they
        write and read (vLLM 0.34's active jobs and primary-tier usage by tier)."""
        out = {name: (0, n, 0, blocks) for name, (n, blocks) in self.cascades.items()}
        for promotion in self._promotions.values():
            name = promotion.tier.name
            n, cascades, written, read = out[name]
            out[name] = (n + 1, cascades, written + len(promotion.keys), read)
        return out

    def _in_storage(
        self, hashes: Sequence[BlockHash], pos: int, stop: int
    ) -> tuple[int, int] | None:
        """(tier index, run) of the first secondary tier holding the continuation at `pos`."""
        for i, tier in enumerate(self.storage):
            m = tier.tier.lookup(hashes, pos, stop)
            if m:
                return i, m
        return None

    def _count_lookups(
        self, request: Request, n: int, rest: int, found: tuple[int, int] | None
    ) -> None:
        """The tiering lookup counters, as vLLM 0.34 counts them: chunk by chunk from the
        device hit until one no tier holds, each chunk once per request (its first lookup),
        in the CPU tier first, then in the secondary tiers in order until one holds it.
        `n` chunks were in the CPU tier, `rest` follow; `found`: the tier promoting a run."""
        if request.lookups_counted:
            return
        request.lookups_counted = True
        j, m = found if found is not None else (len(self.storage), 0)
        missed = 1 if m < rest else 0  # the chunk that ends the walk
        self.primary.block_queries += n + m + missed
        self.primary.block_hits += n
        for i, tier in enumerate(self.storage):
            counters = self.counters[tier.name]
            counters.block_queries += (m if i <= j else 0) + missed
            counters.block_hits += m if i == j else 0

    def _promote(
        self,
        request: Request,
        hashes: Sequence[BlockHash],
        dev: int,
        pos: int,
        index: int,
        m: int,
    ) -> bool:
        """Start promoting the request's continuation (`m` blocks at `pos`) from the
        secondary tier `index`, if loading all of it then pays off. True: started (retry
        later)."""
        tier = self.storage[index]
        promote_s = tier.read_model.duration(m * self.block_bytes)
        if not self.load_pays_off(pos - dev + m, promote_s):
            return False
        cpu = self.cpu
        copies = tier.tier.copies(hashes[pos : pos + m])
        # The request's CPU run is pinned first: making room must not evict it.
        hold = hashes[dev:pos]
        cpu.prepare_load(hold)
        # Neither may the runs other requests found this pass, which they are about to load.
        looked_up = [keys[lo:hi] for keys, lo, hi in self._looked_up]
        for run in looked_up:
            cpu.pin(run)
        plan = cpu.prepare_store(copies)
        for run in looked_up:
            cpu.unpin(run)
        if plan.evicted:
            self.policy.cpu_evicted(plan.evicted)
        keys = plan.keys
        if not keys:
            cpu.complete_load(hold)
            return False
        self.policy.cpu_gained(keys)  # (undone by `_unwind` if the promotion fails)
        tier.tier.prepare_load(keys)
        now = self._time
        promotion = _Promotion(request, tier, _NO_TRANSFER, keys, hold, now,
                               now + self._load_timeout)  # fmt: skip
        promotion.tid = tier.read.start(now, len(keys) * self.block_bytes,
                                        partial(self._promotion_ended, promotion))  # fmt: skip
        self._promotions[request] = promotion
        for key in keys:
            self._promoting[key] = promotion
        self._push_timeout(promotion.deadline, promotion)
        self.version += 1
        return True

    def _promotion_ended(self, promotion: _Promotion, end: float) -> None:
        tier = promotion.tier
        if tier.fails():
            self.counters[tier.name].promotion_failures += 1
            self._failed_promotion(promotion, end)
            return
        self._end_promotion(promotion)  # bumps the version
        tier.tier.complete_load(promotion.keys)
        self.cpu.complete_store(promotion.keys)
        # The landed blocks join the hold: pinned until the request's retry.
        self.cpu.prepare_load(promotion.keys)
        self._holds[promotion.request] = [promotion.hold, promotion.keys]
        request = promotion.request
        if request.promoted is None:
            request.promoted = {}
        request.promoted.update(dict.fromkeys(promotion.keys, tier.name))
        n = len(promotion.keys)
        self._record(TransferKind.LOAD, tier.name, self.cpu.name, n, promotion.start, end)

    def _failed_promotion(self, promotion: _Promotion, end: float) -> None:
        """A promotion failed (or timed out) at `end`: recorded (its latency, no bytes), then
        unwound."""
        self._record(TransferKind.LOAD, promotion.tier.name, self.cpu.name, 0,
                     promotion.start, end, ok=False)  # fmt: skip
        self._unwind(promotion)

    def _end_promotion(self, promotion: _Promotion) -> None:
        del self._promotions[promotion.request]
        promotion.live = False
        for key in promotion.keys:
            del self._promoting[key]
        self.version += 1

    def _unwind(self, promotion: _Promotion) -> None:
        """A promotion failed or timed out: free both hops' reservations; the request
        recomputes (its next lookup answers 0)."""
        self._end_promotion(promotion)
        promotion.tier.tier.complete_load(promotion.keys)
        self.cpu.complete_store(promotion.keys, success=False)
        # While the keys were incoming the CPU tier "held" them, so a request that computed
        # one of them meanwhile left its device block unretained (write-back): the policy
        # must hear they are gone, or that block is later evicted without being copied.
        self.policy.cpu_evicted(promotion.keys)
        self.cpu.complete_load(promotion.hold)
        promotion.request.skip_tier_load = True

    def drop_request(self, now: float, request: Request) -> None:
        """The request ended (abort, finish) outside a load: its promotion is cancelled and
        its hold released."""
        promotion = self._promotions.get(request)
        if promotion is not None:
            promotion.tier.read.cancel(now, promotion.tid)
            self._unwind(promotion)
        for run in self._holds.pop(request, ()):
            self.cpu.complete_load(run)

    def scheduled(self, now: float, loads: Sequence[tuple[Request, int, int]]) -> None:
        """The pass at `now` was scheduled: its loads start (`start_load`: request, first
        block, number of blocks), the holds they replace go (`end_schedule`), and the store
        policy hears of it. (One call a pass: every pass makes it.)"""
        for request, start, num_blocks in loads:
            self.start_load(now, request, start, num_blocks)
        if self._looked_up or self._released:
            self.end_schedule()
        after = self.policy.after_schedule
        if after is not None:
            after(now)

    def end_schedule(self) -> None:
        """The pass's loads have pinned their CPU blocks: the holds they replace go."""
        self._looked_up = []
        released, self._released = self._released, []
        for hold in released:
            self.cpu.complete_load(hold)

    # -- loads (CPU → device) -----------------------------------------------------------------

    def start_load(self, now: float, request: Request, start: int, num_blocks: int) -> None:
        """Copy blocks [start, start + num_blocks) of the request from the CPU tier into the
        device slots the scheduler reserved for them."""
        hashes = chunk_keys(request.block_hashes, self.unit)[start : start + num_blocks]
        self.cpu.prepare_load(hashes)
        promoted, request.promoted = request.promoted, None
        if request.num_cached_tokens < 0:  # its hits are counted once, at its first admission
            if promoted:
                request.tier_hits = self._tier_hits(promoted, hashes)
            else:  # (all found in the CPU tier)
                n = len(hashes)
                request.tier_hits = ((self.cpu.name, n * self.block_size),) if n else ()
        load = _Load(request, _NO_TRANSFER, hashes, now, now + self._load_timeout)
        load.tid = self.h2d.start(now, num_blocks * self.block_bytes,
                                  partial(self._load_ended, load))  # fmt: skip
        self._loads[request] = load
        self._push_timeout(load.deadline, load)
        self.version += 1

    def _tier_hits(
        self, promoted: dict[BlockHash, str], hashes: Sequence[BlockHash]
    ) -> tuple[tuple[str, int], ...]:
        """Tokens of a load per tier they came from, when the request's own promotion
        brought some: a block it brought counts for that tier (even if promoted twice, after
        an eviction), any other one was found in the CPU tier."""
        cpu = self.cpu.name
        hits = {cpu: 0}
        for key in hashes:
            name = promoted.get(key, cpu)
            hits[name] = hits.get(name, 0) + 1
        return tuple((name, n * self.block_size) for name, n in hits.items() if n)

    def _load_ended(self, load: _Load, end: float) -> None:
        del self._loads[load.request]
        load.live = False
        self.cpu.complete_load(load.hashes)
        n = len(load.hashes)
        self.loaded_blocks += n
        self._record(TransferKind.LOAD, self.cpu.name, DEVICE, n, load.start, end)
        self._loaded.append(load.request)
        self.version += 1

    def cancel_load(self, now: float, request: Request) -> bool:
        """Drop a request's load (abort, timeout); its CPU blocks are unpinned. The
        caller frees the device slots."""
        load = self._loads.pop(request, None)
        if load is None:
            return False
        load.live = False
        self.h2d.cancel(now, load.tid)
        self.cpu.complete_load(load.hashes)
        if request.num_cached_tokens < 0:
            # Its first load: the tier hits `start_load` set were never counted (they are
            # when it resumes), so it reports none. A later load's (after a preemption) were
            # counted at its first admission: they stay.
            request.tier_hits = ()
        self.version += 1
        return True

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
                if now > self._time:
                    self._time = now
                return [], timed_out
        finish_due, channels = self._finish_due, self.channels
        posted, timeouts = self._posted, self._timeouts
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
            if bound > self._time:
                self._time = bound
            if timeouts and timeouts[0][0] <= bound:
                deadline, _, job = timeouts[0]
                if job.live:
                    self._time_out(deadline, timed_out)
                else:
                    heapq.heappop(timeouts)  # (a job that ended)
            elif posted and posted[0][0] <= bound:
                at, _, blocks, hashes, owners, parents = heapq.heappop(posted)
                self.start_stores(at, blocks, hashes, owners, parents)
            elif bound < now:
                continue  # (a head moved during the callbacks: no callback does that today)
            else:
                self._keep_deadline(t)  # (for the driver's next ask, and the next poll)
                break
        loaded, self._loaded = self._loaded, []
        return loaded, timed_out

    def _time_out(self, now: float, timed_out: list[Request]) -> None:
        _, _, job = heapq.heappop(self._timeouts)
        request = job.request
        if isinstance(job, _Load):
            self.cancel_load(now, request)
            timed_out.append(request)
        else:
            job.tier.read.cancel(now, job.tid)
            self.counters[job.tier.name].promotion_failures += 1
            self._failed_promotion(job, now)

    def _push_timeout(self, deadline: float, job: _Load | _Promotion) -> None:
        heapq.heappush(self._timeouts, (deadline, self._order, job))
        self._order += 1

    def _next_timeout(self) -> float | None:
        timeouts = self._timeouts
        while timeouts and not timeouts[0][2].live:
            heapq.heappop(timeouts)
        return timeouts[0][0] if timeouts else None

    def _record(
        self,
        kind: TransferKind,
        src: str,
        dst: str,
        n: int,
        start: float,
        end: float,
        ok: bool = True,
    ) -> None:
        # (tuple.__new__ directly: a named tuple's own __new__ is a Python function)
        record = (kind, n, n * self.block_bytes, start, end, src, dst, ok)
        self._records.append(tuple.__new__(TransferRecord, record))


def _cut_runs(runs: Owners, size: int) -> list[Owners]:
    """Runs of owners cut into pieces of `size` blocks (the last may be shorter)."""
    pieces: list[Owners] = []
    piece: Owners = []
    room = size
    for owner, n in runs:
        while n >= room:
            piece.append((owner, room))
            pieces.append(piece)
            piece, n, room = [], n - room, size
        if n:
            piece.append((owner, n))
            room -= n
    if piece:
        pieces.append(piece)
    return pieces
