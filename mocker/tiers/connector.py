"""The scheduler-side connector (vLLM's KVConnector scheduler hooks) to the tiers below the
device: how many more blocks they hold for a request, loads into reserved device slots, stores
as the store policy decides, whether a finished request's free must wait.

It turns the engine's decisions into transfers on links keyed by (source tier,
destination tier) and applies their completions. It is driven by the engine core with
explicit times, like everything in the core, and never acts in the future: a copy that
follows a pass is posted for the pass's end and started by the first `poll` that reaches
that time, in time order with the links' completions (so a tier shared by several engines
never sees times out of order). The live driver's transfer timer only sleeps until
`next_deadline()` and asks the engine loop to `poll`; a virtual-clock driver jumps there.
Same code, two clocks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from mocker.config import EngineConfig
from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.link import Link, TransferId
from mocker.tiers.lru import LruTier
from mocker.tiers.store_policy import StorePolicy, WriteBack, WriteThrough
from mocker.tiers.tier import TierBlock
from mocker.tiers.transfers import TransferKind, TransferRecord

__all__ = ["DEVICE", "TierConnector"]

DEVICE = "gpu"  # the device's name in link keys

# A store posted for a pass's end: (time, order, blocks, keys, owners).
_Posted: TypeAlias = tuple[float, int, list[KVBlock], list[BlockHash], "list[Request] | None"]


@dataclass(slots=True, eq=False)
class _Store:
    blocks: list[KVBlock]
    hashes: list[BlockHash]
    start: float
    owners: list[Request] | None = None  # the policy's tag of each block (see start_stores)


@dataclass(slots=True, eq=False)
class _Load:
    request: Request
    tid: TransferId
    hashes: list[BlockHash]
    start: float
    deadline: float  # the load timeout


class TierConnector:
    """Owns the CPU tier's links and every transfer in flight; the store policy
    (mocker.tiers.store_policy) decides what is copied when.

    The policy reserves CPU slots through `plan_store` and copies through `start_stores`;
    when a copy ends the block becomes visible in the CPU tier and the policy is told
    (`stored`), to release the device side. Loads pin their CPU blocks, copy them into
    device slots the scheduler reserved, and either finish or time out.
    """

    def __init__(
        self,
        config: EngineConfig,
        pool: BlockPool,
        cpu: LruTier,
        prefill_ms: Callable[[int], float],
        *,
        write_back: bool = False,
        evict_ahead: int = 0,
    ) -> None:
        self.config = config
        self.pool = pool
        self.cpu = cpu
        self.policy: StorePolicy = (
            WriteBack(self, evict_ahead) if write_back else WriteThrough(self)
        )
        self.block_bytes = config.block_bytes
        self.batch_size = config.offload_batch_size
        self.block_size = config.block_size
        self._prefill_ms = prefill_ms
        speedup = config.speedup_ratio
        latency_s = config.transfer_latency_ms / 1000.0
        # An unscaled model answers "does this load pay off"; the scaled links carry
        # transfers, keyed by (source tier, destination tier).
        self._h2d_model = Link(config.host_h2d_bandwidth_gbps * 1e9, latency_s)
        self.d2h = Link(config.host_d2h_bandwidth_gbps * 1e9 * speedup, latency_s / speedup)
        self.h2d = Link(config.host_h2d_bandwidth_gbps * 1e9 * speedup, latency_s / speedup)
        self.links: dict[tuple[str, str], Link] = {
            (DEVICE, cpu.name): self.d2h,
            (cpu.name, DEVICE): self.h2d,
        }
        self._time = -math.inf  # the latest time the connector was driven to
        # Stores posted for a pass's end: (time, order, blocks, keys, owners), a heap.
        self._posted: list[_Posted] = []
        self._order = 0
        self._load_timeout = config.load_timeout / speedup
        self._stores: dict[TransferId, _Store] = {}
        self._loads: dict[TransferId, _Load] = {}
        self._load_of: dict[Request, _Load] = {}
        self._timeouts: list[tuple[float, TransferId]] = []  # lazily pruned
        self._records: list[TransferRecord] = []
        # Bumped whenever a transfer starts, ends or is cancelled: the live driver re-arms
        # its transfer timer when it changes.
        self.version = 0
        # Cumulative totals, for checks (metrics and reports read the records).
        self.stored_blocks = 0
        self.loaded_blocks = 0

    # -- planning (no state change) -----------------------------------------------------------

    def num_matched_blocks(self, request: Request, num_device_blocks: int) -> int:
        """Blocks to load after a device hit of `num_device_blocks` (vLLM's
        get_num_new_matched_tokens, in blocks): the contiguous continuation the CPU tier
        holds, if loading it pays off (else 0: recompute). The lookup stops one token short
        of the prompt, as the device's does."""
        if request.skip_tier_load:
            return 0
        hashes = request.block_hashes
        stop = min((request.num_tokens - 1) // self.block_size, len(hashes))
        n = self.cpu.lookup(hashes, num_device_blocks, stop)
        return n if n and self.load_pays_off(n) else 0

    def load_pays_off(self, num_blocks: int) -> bool:
        """Load rather than recompute: enough blocks, and copying them is faster than
        prefilling their tokens (both unscaled model times, transfers alone on the link)."""
        if num_blocks < self.config.min_load_blocks:
            return False
        transfer_ms = self._h2d_model.duration(num_blocks * self.block_bytes) * 1000.0
        return transfer_ms < self._prefill_ms(num_blocks * self.block_size)

    # -- state --------------------------------------------------------------------------------

    @property
    def write_back(self) -> bool:
        return isinstance(self.policy, WriteBack)

    @property
    def has_pending(self) -> bool:
        return bool(self._stores or self._loads or self._posted or self.policy.has_staged)

    @property
    def num_held_blocks(self) -> int:
        """Blocks of finished requests held until their copies end (for checks)."""
        return self.policy.num_held_blocks

    @property
    def num_loading(self) -> int:
        return len(self._loads)

    def loading_blocks(self) -> list[tuple[Request, list[BlockHash]]]:
        """Requests whose KV is loading and the CPU-tier keys they read (for checks)."""
        return [(ld.request, ld.hashes) for ld in self._loads.values()]

    def store_batches(self) -> list[int]:
        """Blocks in each device-to-CPU copy in flight (for checks)."""
        return [len(s.blocks) for s in self._stores.values()]

    def storing_blocks(self) -> list[KVBlock]:
        """Device blocks whose copy to the CPU tier is in flight or posted (for checks)."""
        started = [b for s in self._stores.values() for b in s.blocks]
        return started + [b for posted in self._posted for b in posted[2]]

    def next_deadline(self) -> float | None:
        """When something next needs the engine's attention: a transfer ends, a load times
        out, or a posted store is due (None: nothing)."""
        times = [t for link in self.links.values() if (t := link.next_deadline()) is not None]
        timeouts, loads = self._timeouts, self._loads
        while timeouts and timeouts[0][1] not in loads:
            heapq.heappop(timeouts)
        if timeouts:
            times.append(timeouts[0][0])
        if self._posted:
            times.append(self._posted[0][0])
        return min(times) if times else None

    def take_records(self) -> list[TransferRecord]:
        if not self._records:
            return []
        out, self._records = self._records, []
        return out

    # -- stores -------------------------------------------------------------------------------

    def plan_store(self, blocks: Sequence[KVBlock]) -> list[KVBlock]:
        """Reserve CPU slots for copies of these cached blocks; returns the blocks to copy
        (not held there yet, and room found). The policy hears of the keys the CPU tier
        evicted to make room."""
        cpu = self.cpu
        # The tokens are only needed for the Stored event when the copy lands.
        keep = cpu.record_events
        bs = self.block_size
        tier_blocks = [
            TierBlock(b.cached_hash, b.parent_hash, b.token_ids(bs) if keep else (), b.lora_name)
            for b in blocks
        ]
        plan = cpu.prepare_store(tier_blocks)
        if plan.evicted:
            self.policy.cpu_evicted(plan.evicted)
        if len(plan.keys) == len(blocks):
            return list(blocks)
        chosen = set(plan.keys)
        return [b for b in blocks if b.block_hash in chosen]

    def request_finished(self, request: Request) -> bool:
        """A request finished: True if its blocks must wait for copies in flight (vLLM's
        delay_free; the policy holds them), False to free them now."""
        return self.policy.request_finished(request)

    def start_stores(
        self,
        at: float,
        blocks: list[KVBlock],
        hashes: list[BlockHash] | None = None,
        owners: list[Request] | None = None,
    ) -> None:
        """Copy the blocks (CPU slots reserved by `plan_store`) from `at`: now if the
        connector has been driven that far, else posted until a poll reaches it. `owners`:
        the policy's tag of each block, handed back to it when the copy ends."""
        if not blocks:
            return
        if hashes is None:
            hashes = [b.cached_hash for b in blocks]
        if at > self._time:
            heapq.heappush(self._posted, (at, self._order, blocks, hashes, owners))
            self._order += 1
            self.version += 1
            return
        now = at
        size = self.batch_size
        for lo in range(0, len(blocks), size):
            chunk = blocks[lo : lo + size]
            tid = self.d2h.start(now, len(chunk) * self.block_bytes)
            chunk_owners = owners[lo : lo + size] if owners is not None else None
            self._stores[tid] = _Store(chunk, hashes[lo : lo + size], now, chunk_owners)
            self.version += 1

    def _finish_store(self, store: _Store, end: float) -> None:
        self.cpu.complete_store(store.hashes)
        self.policy.stored(store.blocks, store.owners)
        n = len(store.blocks)
        self.stored_blocks += n
        self._records.append(
            TransferRecord(TransferKind.STORE, n, n * self.block_bytes, store.start, end)
        )

    # -- loads --------------------------------------------------------------------------------

    def start_load(self, now: float, request: Request, start: int, num_blocks: int) -> None:
        """Copy blocks [start, start + num_blocks) of the request from the CPU tier into the
        device slots the scheduler reserved for them."""
        hashes = request.block_hashes[start : start + num_blocks]
        self.cpu.prepare_load(hashes)
        tid = self.h2d.start(now, num_blocks * self.block_bytes)
        load = _Load(request, tid, hashes, now, now + self._load_timeout)
        self._loads[tid] = load
        self._load_of[request] = load
        heapq.heappush(self._timeouts, (load.deadline, tid))
        self.version += 1

    def cancel_load(self, now: float, request: Request) -> bool:
        """Drop a request's load (abort, timeout); its CPU blocks are unpinned. The
        caller frees the device slots."""
        load = self._load_of.pop(request, None)
        if load is None:
            return False
        del self._loads[load.tid]
        self.h2d.cancel(now, load.tid)
        self.cpu.complete_load(load.hashes)
        self.version += 1
        return True

    # -- completions --------------------------------------------------------------------------

    def poll(self, now: float) -> tuple[list[Request], list[Request]]:
        """Apply everything due by `now`, in time order: posted stores start, stores and
        loads finish, loads time out. Returns (requests whose KV loaded, requests whose
        load timed out)."""
        posted = self._posted
        while posted and posted[0][0] <= now:
            at, _, blocks, hashes, owners = heapq.heappop(posted)
            self._finish_stores(at)
            self._time = max(self._time, at)
            self.start_stores(at, blocks, hashes, owners)
        self._time = max(self._time, now)
        self._finish_stores(now)
        return self._finish_loads(now)

    def _finish_stores(self, now: float) -> None:
        if self._stores:
            for tid, end in self.d2h.advance_to(now):
                self._finish_store(self._stores.pop(tid), end)
                self.version += 1

    def _finish_loads(self, now: float) -> tuple[list[Request], list[Request]]:
        loaded: list[Request] = []
        timed_out: list[Request] = []
        if not self._loads:
            return loaded, timed_out
        timeouts = self._timeouts
        while True:
            # Whichever comes first, a load ending or a load timing out.
            link_next = self.h2d.next_deadline()
            while timeouts and timeouts[0][1] not in self._loads:
                heapq.heappop(timeouts)
            timeout_next = timeouts[0][0] if timeouts else None
            if (
                timeout_next is not None
                and timeout_next <= now
                and (link_next is None or timeout_next < link_next)
            ):
                _, tid = heapq.heappop(timeouts)
                load = self._loads[tid]
                self.cancel_load(timeout_next, load.request)
                timed_out.append(load.request)
                continue
            if link_next is None or link_next > now:
                break
            finished = self.h2d.advance_to(link_next)
            if not finished:
                break  # a backstop: the link always finishes what its deadline promised
            for tid, end in finished:
                load = self._loads.pop(tid)
                del self._load_of[load.request]
                self.cpu.complete_load(load.hashes)
                n = len(load.hashes)
                self.loaded_blocks += n
                self._records.append(
                    TransferRecord(TransferKind.LOAD, n, n * self.block_bytes, load.start, end)
                )
                loaded.append(load.request)
                self.version += 1
        return loaded, timed_out
