"""The virtual-clock driver: step the core, jumping time to the next pass end or arrival."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from mocker.clock import VirtualClock
from mocker.engine.core import EngineCore
from mocker.engine.intake import RequestRejected
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stats import FinishedRequestStats
from mocker.request import EngineRequest

__all__ = ["Abort", "VirtualDriver", "VirtualRun"]


@dataclass(frozen=True, slots=True)
class Abort:
    """A client abort at a given virtual time."""

    time: float
    request_id: str


@dataclass(slots=True)
class VirtualRun:
    """Everything a finished virtual run produced."""

    finished: list[FinishedRequestStats] = field(default_factory=list)
    aborted: list[RequestOutput] = field(default_factory=list)
    rejected: list[tuple[EngineRequest, str]] = field(default_factory=list)
    num_steps: int = 0
    end_time: float = 0.0


class VirtualDriver:
    """Discrete-event loop: arrivals and aborts are applied at the start of the first pass at or
    after their time; while idle, time jumps straight to the next arrival.

    (Replay's `_ReplayRun` is the other virtual-clock loop: K engines, routing, closed
    loops, the decode fast path. This one drives one core with aborts and yields every
    result, for tests and benchmarks. They are to merge into one event-driven clock with
    the tiered KV stack.)"""

    def __init__(self, core: EngineCore, clock: VirtualClock | None = None) -> None:
        self.core = core
        self.clock = clock if clock is not None else VirtualClock()

    def steps(
        self,
        requests: Iterable[EngineRequest],
        aborts: Iterable[Abort] = (),
        *,
        run: VirtualRun | None = None,
    ) -> Iterator[StepResult]:
        """Yield each pass's result, after the clock has moved to its end; also the idle
        results of instants when only host-tier transfers ended (they carry the transfers
        and KV events). The run ends when every request has ended and every transfer has
        drained."""
        run = run if run is not None else VirtualRun()
        timed: list[tuple[float, int, EngineRequest | Abort]] = [
            (r.arrival_time, 0, r) for r in requests
        ]
        timed += [(a.time, 1, a) for a in aborts]
        # Same time: arrivals before aborts, so an abort can target a same-instant arrival.
        timed.sort(key=lambda item: (item[0], item[1]))
        core, clock = self.core, self.clock
        i = 0
        idle_at_same_time = 0
        while True:
            now = clock.now()
            while i < len(timed) and timed[i][0] <= now:
                self._apply(timed[i][2], now, run)
                i += 1
            if core.has_unfinished_requests() or core.has_pending_transfers():
                result = core.step(now)
                if not result.idle:
                    idle_at_same_time = 0
                    clock.advance_to(result.end)
                    run.num_steps += 1
                    run.finished.extend(result.finished)
                    yield result
                    continue
                # Nothing can run now: jump to the next transfer deadline or arrival.
                if result.newsworthy:
                    yield result
                nexts = [t for t in (core.next_transfer_deadline(),) if t is not None]
                if i < len(timed):
                    nexts.append(timed[i][0])
                if not nexts:
                    if core.has_unfinished_requests():
                        raise core.stall_error()
                    continue
                target = max(now, min(nexts))
                idle_at_same_time = idle_at_same_time + 1 if target == now else 0
                if idle_at_same_time > 100:  # every idle step at `now` applies what is due
                    raise core.stall_error()
                clock.advance_to(target)
            elif i < len(timed):
                clock.advance_to(max(now, timed[i][0]))
            else:
                run.end_time = now
                return

    def run(self, requests: Iterable[EngineRequest], aborts: Iterable[Abort] = ()) -> VirtualRun:
        """Run until every request has finished, been aborted or been rejected."""
        run = VirtualRun()
        for _ in self.steps(requests, aborts, run=run):
            pass
        return run

    def _apply(self, item: EngineRequest | Abort, now: float, run: VirtualRun) -> None:
        if isinstance(item, Abort):
            out = self.core.abort_request(item.request_id, now)
            if out is not None:
                run.aborted.append(out)
            return
        try:
            self.core.add_request(item)
        except RequestRejected as exc:
            run.rejected.append((item, str(exc)))
