"""Loads inside the pass (LMCache's synchronous retrieval): the pass that admits a request
copies its CPU-tier chunks before it computes, and takes that much longer."""

from __future__ import annotations

from collections.abc import Sequence

from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.context import TierContext
from mocker.tiers.hybrid_store import chunk_keys
from mocker.tiers.link import Link
from mocker.tiers.loads import Loads
from mocker.tiers.transfers import TransferKind

__all__ = ["SyncLoads"]


class SyncLoads:
    """The CPU → device copies of the pass being scheduled: pinned as it admits them, read
    together over the host link at its start, unpinned at its end."""

    def __init__(self, connector: TierContext, loads: Loads, link: Link) -> None:
        """`link`: the host → device link, at the engine's speed (durations scaled)."""
        self._c = connector
        self._loads = loads
        self._link = link
        self._reading: list[Sequence[BlockHash]] = []  # this pass's, pinned
        self._blocks = 0  # (their sum)

    @property
    def pending(self) -> bool:
        return bool(self._reading)

    def admit(self, request: Request, start: int, num_blocks: int) -> None:
        """The scheduler admits the request with blocks [start, start + num_blocks) read
        from the CPU tier in this pass: they are pinned, and its hits attributed."""
        c = self._c
        hashes = chunk_keys(request.block_hashes, c.unit)[start : start + num_blocks]
        c.cpu.prepare_load(hashes)
        self._loads.attribute(request, hashes)
        self._reading.append(hashes)
        self._blocks += num_blocks

    def start(self, now: float) -> float:
        """Seconds the pass starting at `now` spends reading what it admitted (one copy of
        all of it on the otherwise idle host link), recorded as one load."""
        if not self._reading:
            return 0.0
        c = self._c
        seconds = self._link.duration(self._blocks * c.block_bytes)
        c.record(TransferKind.LOAD, c.cpu.name, c.device, self._blocks, now, now + seconds)
        return seconds

    def finish(self) -> None:
        """The pass ended: what it read is unpinned."""
        c = self._c
        for hashes in self._reading:
            c.cpu.complete_load(hashes)
        self._loads.loaded_blocks += self._blocks
        self._reading, self._blocks = [], 0
        c.version += 1
