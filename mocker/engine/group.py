"""Data-parallel engines in one server: least-loaded placement, rank pinning, one lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

from mocker.engine.intake import request_id_in_use
from mocker.engine.live import EngineDeadError, LiveEngine
from mocker.engine.stats import queue_score
from mocker.request import EngineRequest

__all__ = ["EngineGroup", "RankError"]


class RankError(ValueError):
    """A request pinned to a data-parallel rank this server does not have."""


class EngineGroup:
    """K live engines (data-parallel ranks), each with its own KV cache and loop.

    A request goes to the rank it names, else to the least loaded one by `queue_score`
    (vLLM's front end: 4 × waiting + running), ties to the lowest rank (so an idle server
    keeps sending to rank 0, where the prefix cache is warm, as vLLM's does).
    Waiting counts requests accepted but not yet drained into the core, so a burst that
    arrives within one pass spreads at once.
    """

    def __init__(self, engines: Sequence[LiveEngine]) -> None:
        if not engines:
            raise ValueError("an engine group needs at least one engine")
        self.engines = list(engines)

    def __len__(self) -> int:
        return len(self.engines)

    def __iter__(self) -> Iterator[LiveEngine]:
        return iter(self.engines)

    def __getitem__(self, rank: int) -> LiveEngine:
        return self.engines[rank]

    def check_rank(self, rank: int | None) -> None:
        """Raise RankError for a rank this server does not have (None: any rank)."""
        if rank is not None and not 0 <= rank < len(self.engines):
            raise RankError(f"data_parallel_rank {rank} is out of range [0, {len(self.engines)}).")

    def check_request(self, spec: EngineRequest) -> None:
        """Raise RequestRejected for a request no rank would take: a request id in use on
        any rank (so the answer does not depend on where a request lands), or one the engine
        refuses (every rank has the same configuration)."""
        self.check_request_id(spec.request_id)
        self.engines[0].core.check_request(spec)

    def check_request_id(self, request_id: str) -> None:
        """Raise RequestRejected if a request of this id runs on any rank."""
        if any(e.has_request(request_id) for e in self.engines):
            raise request_id_in_use(request_id)

    def num_in_flight(self) -> int:
        """Requests in flight on every rank (vLLM 0.34's max_num_queued_reqs count)."""
        return sum(engine.num_open_streams for engine in self.engines)

    def prefill_backlog(self) -> int:
        """Every rank's prompt tokens not yet past their first token."""
        return sum(engine.prefill_backlog() for engine in self.engines)

    def pick(self, rank: int | None = None) -> LiveEngine:
        """The engine for a new request: rank `rank`, or the least loaded."""
        engines = self.engines
        if rank is not None:
            self.check_rank(rank)
            return engines[rank]
        best = engines[0]
        if len(engines) > 1:
            best_score = queue_score(best.num_waiting, best.num_running)
            for engine in engines[1:]:
                score = queue_score(engine.num_waiting, engine.num_running)
                if score < best_score:
                    best, best_score = engine, score
        return best

    # -- the group as one -------------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        """Any rank dead: as vLLM, the server as a whole is then unhealthy."""
        return any(e.is_dead for e in self.engines)

    @property
    def dead_error(self) -> BaseException | None:
        return next((e.dead_error for e in self.engines if e.dead_error is not None), None)

    @property
    def num_open_streams(self) -> int:
        return sum(e.num_open_streams for e in self.engines)

    def abort_all(self) -> int:
        return sum(e.abort_all() for e in self.engines)

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    async def stop(self) -> None:
        for engine in self.engines:
            await engine.stop()

    async def fall_asleep(self, level: int, mode: str) -> None:
        """vLLM's sleep, on every rank."""
        if self.is_dead:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        await asyncio.gather(*(e.fall_asleep(level, mode) for e in self.engines))

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """vLLM's wake_up on every rank; whether all are fully awake."""
        return all([e.wake_up(tags) for e in self.engines])

    @property
    def is_sleeping(self) -> bool:
        return any(e.sleep.sleeping for e in self.engines)

    async def reset_prefix_cache(
        self, *, whole: bool = False, reset_running: bool = False
    ) -> tuple[bool, int]:
        """Clear every rank's prefix cache: whether every rank's reset succeeded (a `whole`
        one is refused while blocks are referenced), and the blocks cleared in all."""
        if self.is_dead:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        cleared = await asyncio.gather(
            *(e.reset_prefix_cache(whole=whole, reset_running=reset_running) for e in self.engines)
        )
        return all(n is not None for n in cleared), sum(n or 0 for n in cleared)
