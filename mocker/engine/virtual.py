"""The virtual-clock driver: step the core, jumping time to the next pass end or arrival."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from mocker.clock import VirtualClock
from mocker.engine.core import EngineCore
from mocker.engine.event_loop import EventLoop
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
    """One core on the discrete-event loop (mocker.engine.event_loop), fed with engine
    requests and aborts; yields every result, for tests and benchmarks. Arrivals and aborts
    are applied at the start of the first pass at or after their time; while idle, time
    jumps straight to the next arrival."""

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
        results of instants when only tier transfers ended (they carry the transfers and KV
        events). The run ends when every request has ended and every transfer has
        drained."""
        run = run if run is not None else VirtualRun()
        timeline = _Timeline(self, requests, aborts, run)
        loop = EventLoop([self.core], timeline, start=self.clock.now())
        timeline.loop = loop
        clock = self.clock
        for _, result in loop.run():
            clock.advance_to(loop.clocks[0])
            if not result.idle:
                run.num_steps += 1
                run.finished.extend(result.finished)
            yield result
        clock.advance_to(loop.clocks[0])
        run.end_time = clock.now()

    def run(self, requests: Iterable[EngineRequest], aborts: Iterable[Abort] = ()) -> VirtualRun:
        """Run until every request has finished, been aborted or been rejected."""
        run = VirtualRun()
        for _ in self.steps(requests, aborts, run=run):
            pass
        return run


class _Timeline:
    """Requests and aborts in time order (same time: arrivals first, so an abort can
    target a same-instant arrival)."""

    def __init__(
        self,
        driver: VirtualDriver,
        requests: Iterable[EngineRequest],
        aborts: Iterable[Abort],
        run: VirtualRun,
    ) -> None:
        timed: list[tuple[float, int, EngineRequest | Abort]] = [
            (r.arrival_time, 0, r) for r in requests
        ]
        timed += [(a.time, 1, a) for a in aborts]
        timed.sort(key=lambda item: (item[0], item[1]))
        self.timed = timed
        self.i = 0
        self.core = driver.core
        self.run = run
        self.loop: EventLoop | None = None

    def next_time(self) -> float | None:
        return self.timed[self.i][0] if self.i < len(self.timed) else None

    def apply(self, now: float) -> None:
        loop = self.loop
        assert loop is not None
        _, _, item = self.timed[self.i]
        self.i += 1
        loop.wake(0, now)
        if isinstance(item, Abort):
            out = self.core.abort_request(item.request_id, loop.clocks[0])
            if out is not None:
                self.run.aborted.append(out)
            return
        try:
            self.core.add_request(item)
        except RequestRejected as exc:
            self.run.rejected.append((item, str(exc)))
