"""Transfers between the device pool and the host tier: stores (offload), loads (onboard), links.

The offload manager turns the engine's decisions into transfers on two links
(device→host, host→device) and applies their completions. It is driven by the
engine core with explicit times, like everything in the core: the live driver's
transfer workers only sleep until `next_deadline()` and ask the engine loop to
`poll`; the replay driver jumps its virtual clock there. Same code, two clocks.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from mocker.config import EngineConfig, OffloadPolicy
from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.host import HostBlock, HostTier
from mocker.tiers.link import Link, TransferId

__all__ = ["Direction", "OffloadManager", "TransferKind", "TransferRecord"]


class Direction(IntEnum):
    D2H = 0  # device to host: stores
    H2D = 1  # host to device: loads


class TransferKind(IntEnum):
    STORE = 0
    LOAD = 1


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """A finished transfer, for metrics and reports (times on the engine's clock)."""

    kind: TransferKind
    num_blocks: int
    nbytes: int
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(slots=True, eq=False)
class _Store:
    blocks: list[KVBlock]
    hashes: list[BlockHash]
    start: float
    owners: list[Request] | None = None  # write-through: the request of each block


@dataclass(slots=True, eq=False)
class _Load:
    request: Request
    tid: TransferId
    hashes: list[BlockHash]
    start: float
    deadline: float  # the load timeout


class OffloadManager:
    """Owns the host tier, both links and every transfer in flight.

    Evict policy (KVBM): the pool hands over dirty blocks as it evicts them
    (`offload_evicted`); their slots stay occupied until the copy ends, then the
    pool gets them back empty. Write-through (vLLM's OffloadingConnector): newly
    computed full prompt blocks are pinned (one extra reference) and copied after
    their pass (`stage_stores` + `start_staged`); the pin holds even a finished
    request's blocks until the copy ends. Either way a block becomes visible on
    host only when its copy completes. Loads pin their host blocks, copy them into
    device slots the scheduler reserved, and either finish or time out.
    """

    def __init__(
        self,
        config: EngineConfig,
        pool: BlockPool,
        host: HostTier,
        prefill_ms: Callable[[int], float],
    ) -> None:
        self.config = config
        self.pool = pool
        self.host = host
        self.policy = config.offload_policy
        self.block_bytes = config.block_bytes
        self.batch_size = config.offload_batch_size
        self.block_size = config.block_size
        self._prefill_ms = prefill_ms
        speedup = config.speedup_ratio
        latency_s = config.transfer_latency_ms / 1000.0
        # Unscaled links answer "does this load pay off"; the scaled ones carry transfers.
        self._d2h_model = Link(config.host_d2h_bandwidth_gbps * 1e9, latency_s)
        self._h2d_model = Link(config.host_h2d_bandwidth_gbps * 1e9, latency_s)
        self.d2h = Link(config.host_d2h_bandwidth_gbps * 1e9 * speedup, latency_s / speedup)
        self.h2d = Link(config.host_h2d_bandwidth_gbps * 1e9 * speedup, latency_s / speedup)
        self._load_timeout = config.load_timeout / speedup
        self._stores: dict[TransferId, _Store] = {}
        self._loads: dict[TransferId, _Load] = {}
        self._load_of: dict[Request, _Load] = {}
        self._timeouts: list[tuple[float, TransferId]] = []  # lazily pruned
        self._staged: list[tuple[KVBlock, BlockHash, Request]] = []  # write-through, pinned
        # Write-through, as vLLM's delay_free: a request's copies in flight, and the block
        # tables of finished requests held until their last copy ends.
        self._storing: dict[Request, int] = {}
        self._held: dict[Request, list[KVBlock]] = {}
        self._records: list[TransferRecord] = []
        # Bumped whenever a transfer starts, ends or is cancelled: the live driver re-arms
        # its transfer workers when it changes.
        self.version = 0
        # Cumulative totals (reports; metrics use the records).
        self.stored_blocks = 0
        self.loaded_blocks = 0

    # -- planning (no state change) -----------------------------------------------------------

    def host_match(self, request: Request, start: int, stop: int) -> int:
        """Blocks of the request found on host contiguously from block `start` (< stop)."""
        return self.host.match(request.block_hashes, start, min(stop, len(request.block_hashes)))

    def load_pays_off(self, num_blocks: int) -> bool:
        """Load rather than recompute: enough blocks, and copying them is faster than
        prefilling their tokens (both unscaled model times, transfers alone on the link)."""
        if num_blocks < self.config.min_load_blocks:
            return False
        transfer_ms = self._h2d_model.duration(num_blocks * self.block_bytes) * 1000.0
        return transfer_ms < self._prefill_ms(num_blocks * self.block_size)

    # -- state --------------------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        return bool(self._stores or self._loads or self._staged)

    @property
    def num_held_blocks(self) -> int:
        """Blocks of finished requests held until their copies end (for checks)."""
        return sum(len(blocks) for blocks in self._held.values())

    @property
    def num_loading(self) -> int:
        return len(self._loads)

    def loading_blocks(self) -> list[tuple[Request, list[BlockHash]]]:
        """Requests whose KV is loading and the host hashes they read (for checks)."""
        return [(ld.request, ld.hashes) for ld in self._loads.values()]

    def store_batches(self) -> list[int]:
        """Blocks in each device-to-host copy in flight (for checks)."""
        return [len(s.blocks) for s in self._stores.values()]

    def storing_blocks(self) -> list[KVBlock]:
        """Device blocks whose copy to host is in flight (for checks)."""
        return [b for s in self._stores.values() for b in s.blocks]

    def next_deadline(self, direction: Direction | None = None) -> float | None:
        """When something next needs the engine's attention on a link (None: nothing)."""
        times: list[float] = []
        if direction is not Direction.H2D:
            d = self.d2h.next_deadline()
            if d is not None:
                times.append(d)
        if direction is not Direction.D2H:
            d = self.h2d.next_deadline()
            if d is not None:
                times.append(d)
            timeouts, loads = self._timeouts, self._loads
            while timeouts and timeouts[0][1] not in loads:
                heapq.heappop(timeouts)
            if timeouts:
                times.append(timeouts[0][0])
        return min(times) if times else None

    def take_records(self) -> list[TransferRecord]:
        if not self._records:
            return []
        out, self._records = self._records, []
        return out

    # -- stores -------------------------------------------------------------------------------

    def _reserve(self, block: KVBlock, block_hash: BlockHash) -> bool:
        """Claim a host slot for a copy of `block`; evicted host hashes make any device
        block with them dirty again (offload on eviction)."""
        # The tokens are only needed for the Stored event when the copy lands.
        tokens = block.token_ids(self.block_size) if self.host.record_events else ()
        host_block = HostBlock(block_hash, block.parent_hash, tokens, block.lora_name)
        evicted = self.host.reserve(host_block)
        if evicted is None:
            return False
        for gone in evicted:
            self.pool.set_dirty(gone, True)
        return True

    def offload_evicted(self, now: float) -> None:
        """Evict policy: copy the blocks the pool evicted since the last call, in batches."""
        evicted = self.pool.take_evicting()
        if not evicted:
            return
        batch: list[KVBlock] = []
        dropped: list[KVBlock] = []
        for block in evicted:
            block_hash = block.block_hash
            assert block_hash is not None
            if self.host.holds(block_hash) or not self._reserve(block, block_hash):
                dropped.append(block)  # already there, or no host slot: nothing to copy
            else:
                batch.append(block)
        if dropped:
            self.pool.finish_offload(dropped)
        self._start_stores(now, batch)

    def stage_stores(self, request: Request, blocks: Sequence[KVBlock]) -> None:
        """Write-through: pin newly cached prompt blocks now (before their request may free
        them); `start_staged` copies them once their pass has ended."""
        pinned: list[KVBlock] = []
        for block in blocks:
            block_hash = block.block_hash
            if block_hash is None or self.host.holds(block_hash):
                continue
            if not self._reserve(block, block_hash):
                break  # every host block is pinned by loads: skip the rest too
            pinned.append(block)
            self._staged.append((block, block_hash, request))
        if pinned:
            self.pool.touch(pinned)
            self._storing[request] = self._storing.get(request, 0) + len(pinned)

    def hold_if_storing(self, request: Request) -> bool:
        """A request finished while copies of its blocks are in flight: hold its whole block
        table until the last one ends (vLLM's delay_free). False: free it now."""
        if request not in self._storing:
            return False
        self._held[request] = request.blocks
        request.blocks = []
        return True

    def start_staged(self, now: float) -> None:
        if self._staged:
            staged, self._staged = self._staged, []
            self._start_stores(
                now, [s[0] for s in staged], [s[1] for s in staged], [s[2] for s in staged]
            )

    def _start_stores(
        self,
        now: float,
        blocks: list[KVBlock],
        hashes: list[BlockHash] | None = None,
        owners: list[Request] | None = None,
    ) -> None:
        if hashes is None:
            hashes = [b.cached_hash for b in blocks]
        size = self.batch_size
        for lo in range(0, len(blocks), size):
            chunk = blocks[lo : lo + size]
            tid = self.d2h.start(now, len(chunk) * self.block_bytes)
            chunk_owners = owners[lo : lo + size] if owners is not None else None
            self._stores[tid] = _Store(chunk, hashes[lo : lo + size], now, chunk_owners)
            self.version += 1

    def _finish_store(self, store: _Store, end: float) -> None:
        self.host.commit(store.hashes)
        if self.policy is OffloadPolicy.EVICT:
            self.pool.finish_offload(store.blocks)
        else:
            # Unpin tail first, as a request frees its blocks, so a chain is evicted leaf first.
            self.pool.free_blocks(reversed(store.blocks))
            storing = self._storing
            for owner in store.owners or ():
                storing[owner] -= 1
                if not storing[owner]:
                    del storing[owner]
                    held = self._held.pop(owner, None)
                    if held:
                        self.pool.free_blocks(reversed(held))
        n = len(store.blocks)
        self.stored_blocks += n
        self._records.append(
            TransferRecord(TransferKind.STORE, n, n * self.block_bytes, store.start, end)
        )

    # -- loads --------------------------------------------------------------------------------

    def start_load(self, now: float, request: Request, start: int, num_blocks: int) -> None:
        """Copy blocks [start, start + num_blocks) of the request from host into the device
        slots the scheduler reserved for them."""
        hashes = request.block_hashes[start : start + num_blocks]
        self.host.pin(hashes)
        tid = self.h2d.start(now, num_blocks * self.block_bytes)
        load = _Load(request, tid, hashes, now, now + self._load_timeout)
        self._loads[tid] = load
        self._load_of[request] = load
        heapq.heappush(self._timeouts, (load.deadline, tid))
        self.version += 1

    def cancel_load(self, now: float, request: Request) -> bool:
        """Drop a request's load (abort, timeout); its host blocks are unpinned. The
        caller frees the device slots."""
        load = self._load_of.pop(request, None)
        if load is None:
            return False
        del self._loads[load.tid]
        self.h2d.cancel(now, load.tid)
        self.host.unpin(load.hashes)
        self.version += 1
        return True

    # -- completions --------------------------------------------------------------------------

    def poll(self, now: float) -> tuple[list[Request], list[Request]]:
        """Apply everything due by `now`, in time order: finished stores and loads, and
        load timeouts. Returns (requests whose KV loaded, requests whose load timed out)."""
        if self._stores:
            for tid, end in self.d2h.advance_to(now):
                self._finish_store(self._stores.pop(tid), end)
                self.version += 1
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
                self.host.unpin(load.hashes)
                n = len(load.hashes)
                self.loaded_blocks += n
                self._records.append(
                    TransferRecord(TransferKind.LOAD, n, n * self.block_bytes, load.start, end)
                )
                loaded.append(load.request)
                self.version += 1
        return loaded, timed_out
