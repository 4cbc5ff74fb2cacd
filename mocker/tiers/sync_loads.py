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
    together over the host link at its start, unpinned at its end. LMCache reads from the
    chunk boundary at or before vLLM's own hit (it keeps whole chunks)."""

    def __init__(self, connector: TierContext, loads: Loads, link: Link) -> None:
        """`link`: the host → device link, at the engine's speed (durations scaled)."""
        self._c = connector
        self._loads = loads
        self._link = link
        self._reading: list[Sequence[BlockHash]] = []  # this pass's, pinned
        self._blocks = 0  # the blocks this pass reads, whole chunks
        self._looked: set[Request] = set()  # looked up by LMCache, not yet scheduled

    @property
    def pending(self) -> bool:
        return bool(self._reading)

    def looks_up(self, request: Request) -> bool:
        """Whether LMCache would look the request up now: once until it is scheduled (its
        answer is kept meanwhile)."""
        return request not in self._looked

    def looked_up(self, request: Request, hit_tokens: int) -> None:
        """LMCache's lookup of a request's whole chunks."""
        stats = self._c.lmcache
        if stats is not None:
            self._looked.add(request)
            stats.lookup(len(request.all_token_ids), hit_tokens)

    def admit(self, request: Request, start: int, num_blocks: int) -> None:
        """The scheduler admits the request with blocks [start, start + num_blocks) read
        from the CPU tier in this pass: they are pinned, and its hits attributed."""
        c = self._c
        hashes = chunk_keys(request.block_hashes, c.unit)[start : start + num_blocks]
        c.cpu.prepare_load(hashes)
        self._loads.attribute(request, hashes)
        self._reading.append(hashes)
        read = num_blocks + start % c.chunk  # (the first chunk whole)
        self._blocks += read
        if c.lmcache is not None:
            tokens = read * c.block_size
            c.lmcache.retrieve(tokens, self._link.duration(read * c.block_bytes))

    def scheduled(self, request: Request, vllm_hit: int, scheduled_to: int) -> None:
        """A request's first pass after its lookup: vLLM's own hit, and the tokens it will
        have computed at the pass's end."""
        if request in self._looked:
            self._looked.discard(request)
            assert self._c.lmcache is not None
            self._c.lmcache.scheduled(vllm_hit, scheduled_to)

    def forget(self, request: Request) -> None:
        """The request ended before it was scheduled."""
        self._looked.discard(request)

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
        self._loads.loaded_blocks += sum(map(len, self._reading))
        self._reading, self._blocks = [], 0
        c.version += 1
