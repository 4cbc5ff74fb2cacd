"""Loads from the CPU tier into device slots the scheduler reserved (vLLM's KV loads)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.context import TierContext
from mocker.tiers.hybrid_store import chunk_keys
from mocker.tiers.link import TransferId
from mocker.tiers.transfers import TransferKind

__all__ = ["NO_TRANSFER", "Load", "Loads"]

NO_TRANSFER = TransferId(-1)  # (a job's id until its transfer starts)


@dataclass(slots=True, eq=False)
class Load:
    """A CPU → device copy for a request (the second hop of a staged load)."""

    request: Request
    tid: TransferId
    hashes: Sequence[BlockHash]  # (a slice of the request's: a list, or a replay's array)
    start: float
    deadline: float  # the load timeout
    live: bool = True  # until it ends or is cancelled (its timeout's heap entry then is dead)


class Loads:
    """The connector's CPU → device copies in flight, by request."""

    def __init__(self, connector: TierContext) -> None:
        self._c = connector
        self.active: dict[Request, Load] = {}
        self.ended: list[Request] = []  # loads that ended since the last poll returned
        self.loaded_blocks = 0  # cumulative, for checks

    def blocks(self) -> list[tuple[Request, Sequence[BlockHash]]]:
        """Requests whose KV is loading and the CPU-tier keys they read (for checks)."""
        return [(load.request, load.hashes) for load in self.active.values()]

    def start(self, now: float, request: Request, start: int, num_blocks: int) -> None:
        """Copy blocks [start, start + num_blocks) of the request from the CPU tier into the
        device slots the scheduler reserved for them."""
        c = self._c
        hashes = chunk_keys(request.block_hashes, c.unit)[start : start + num_blocks]
        c.cpu.prepare_load(hashes)
        self.attribute(request, hashes)
        load = Load(request, NO_TRANSFER, hashes, now, now + c.load_timeout)
        load.tid = c.h2d.start(now, num_blocks * c.block_bytes, partial(self._ended, load))
        self.active[request] = load
        c.push_timeout(load.deadline, load)
        c.version += 1

    def attribute(self, request: Request, hashes: Sequence[BlockHash]) -> None:
        """The request's tier hits, by the tier each loaded block came from (counted once,
        at its first admission); what its promotion kept for it is released."""
        promoted, request.promoted = request.promoted, None
        if request.num_cached_tokens < 0:
            if promoted:
                request.tier_hits = self._tier_hits(promoted, hashes)
            else:  # (all found in the CPU tier)
                n = len(hashes)
                request.tier_hits = ((self._c.cpu.name, n * self._c.block_size),) if n else ()

    def _tier_hits(
        self, promoted: dict[BlockHash, str], hashes: Sequence[BlockHash]
    ) -> tuple[tuple[str, int], ...]:
        """Tokens of a load per tier they came from, when the request's own promotion
        brought some: a block it brought counts for that tier (even if promoted twice, after
        an eviction), any other one was found in the CPU tier."""
        cpu = self._c.cpu.name
        hits = {cpu: 0}
        for key in hashes:
            name = promoted.get(key, cpu)
            hits[name] = hits.get(name, 0) + 1
        block_size = self._c.block_size
        return tuple((name, n * block_size) for name, n in hits.items() if n)

    def _ended(self, load: Load, end: float) -> None:
        c = self._c
        del self.active[load.request]
        load.live = False
        c.cpu.complete_load(load.hashes)
        n = len(load.hashes)
        self.loaded_blocks += n
        c.record(TransferKind.LOAD, c.cpu.name, c.device, n, load.start, end)
        self.ended.append(load.request)
        c.version += 1

    def cancel(self, now: float, request: Request) -> bool:
        """Drop a request's load (abort, timeout); its CPU blocks are unpinned. The caller
        frees the device slots."""
        load = self.active.pop(request, None)
        if load is None:
            return False
        c = self._c
        load.live = False
        c.h2d.cancel(now, load.tid)
        c.cpu.complete_load(load.hashes)
        if request.num_cached_tokens < 0:
            # Its first load: the tier hits `start` set were never counted (they are when it
            # resumes), so it reports none. A later load's (after a preemption) were counted
            # at its first admission: they stay.
            request.tier_hits = ()
        c.version += 1
        return True

    def take_ended(self) -> list[Request]:
        """The requests whose loads ended since the last call."""
        if not self.ended:
            return []
        out, self.ended = self.ended, []
        return out
