"""The one discrete-event driver of the virtual clock: K engine cores, the arrivals that feed
them, and the tier deadlines between their passes; `VirtualDriver` and `mocker replay` both
run on it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult

__all__ = ["Arrivals", "EventLoop"]

_INF = float("inf")


class Arrivals(Protocol):
    """What feeds the engines: requests, aborts, closed-loop users."""

    def next_time(self) -> float | None:
        """When the next arrival is due (None: none left, or none until a request ends)."""
        ...

    def apply(self, now: float) -> None:
        """Apply the arrival due at `now` (route it to an engine, add it, abort...)."""
        ...


# A faster way through engine k's next passes, up to (not past) a time: True if it ran any.
FastPath = Callable[[int, float], bool]


class EventLoop:
    """Events in time order: an arrival, an engine's next pass (at its clock: the end of its
    previous pass, or a time it idles until), and, for an engine attached to a tier shared
    with others, the deadlines of its transfers even during a pass (so a shared channel is
    advanced, and its completions handed to their engines, in time order across engines).

    A pass's effects are applied when it starts (the core computes its end); its tokens
    exist at its end, which becomes the engine's clock. An arrival is applied before any
    pass that starts at or after its time, and an idle engine's clock jumps to it.
    """

    def __init__(
        self,
        cores: Sequence[EngineCore],
        arrivals: Arrivals,
        *,
        fast: FastPath | None = None,
        start: float = 0.0,
    ) -> None:
        self.cores = list(cores)
        self.arrivals = arrivals
        self.fast = fast
        self.clocks = [start] * len(self.cores)
        self.num_passes = 0
        # Per engine: when it went idle to wait for a deadline (its clock jumped from there to
        # the deadline), or None. An arrival before that deadline runs at its own time: the
        # deadline may never matter (a P/D hold that a pull will release).
        self._idle_from: list[float | None] = [None] * len(self.cores)
        # Engines parked until another engine changes their state (P/D: a prefill engine
        # whose pool is full of KV held for pulls), with their transfer version then.
        self._parked: dict[int, int] = {}
        # Engines whose deadlines need polling during their passes.
        self._exact = [c.connector is not None and c.connector.has_shared_tier
                       for c in self.cores]  # fmt: skip

    def busy(self, k: int) -> bool:
        core = self.cores[k]
        return core.has_unfinished_requests() or core.has_pending_transfers()

    def wake(self, k: int, at: float) -> None:
        """An arrival reached engine k: if it was idle, its clock jumps to the arrival; if it
        was only waiting for a deadline, the arrival's pass runs before it (the core has
        applied nothing past the instant it went idle)."""
        since = self._idle_from[k]
        if since is not None:
            # Its clock stands at a deadline it jumped to (and may no longer wait for): the
            # arrival's pass runs first (its load, say, then shares a link with the others).
            start = max(since, at)
            self.clocks[k] = min(self.clocks[k], start) if self.busy(k) else start
            self._idle_from[k] = None
            self._parked.pop(k, None)
        elif not self.busy(k):
            self.clocks[k] = max(self.clocks[k], at)

    def next_engine(self) -> tuple[int, float]:
        """The engine with the earliest event and its time ((-1, inf): none is busy)."""
        return self.next_engine_of(range(len(self.cores)))

    def next_engine_of(self, engines: Iterable[int]) -> tuple[int, float]:
        """Of these engines, the one with the earliest event and its time."""
        best, best_t = -1, _INF
        clocks, exact, cores = self.clocks, self._exact, self.cores
        for k in engines:
            core = cores[k]
            if not (core.has_unfinished_requests() or core.has_pending_transfers()):
                continue
            t = clocks[k]
            if exact[k]:
                deadline = core.next_transfer_deadline()
                if deadline is not None and deadline < t:
                    t = deadline
            if t < best_t:
                best, best_t = k, t
        return best, best_t

    def parked(self, k: int) -> bool:
        """Engine k waits, blocked, until another engine's progress frees its KV (P/D)."""
        return k in self._parked

    def _unpark(self, now: float) -> None:
        """Parked engines whose state another engine changed (a pull released their KV) run
        again from `now`."""
        for j, version in list(self._parked.items()):
            core = self.cores[j]
            if core.transfer_version != version:
                del self._parked[j]
                self._idle_from[j] = None
                self.clocks[j] = max(now, core.time)

    def run(self) -> Iterator[tuple[int, StepResult]]:
        """Run until no arrival is left and every engine is drained; yields each pass's
        result (after the engine's clock moved to its end) and each idle result that
        carries news (transfers, events, counts)."""
        arrivals, clocks, cores = self.arrivals, self.clocks, self.cores
        same_instant = 0
        last = -_INF
        while True:
            k, t = self.next_engine()
            arrival = arrivals.next_time()
            if arrival is not None and (k < 0 or arrival <= t):
                arrivals.apply(arrival)
                continue
            if k < 0:
                if self._parked:  # they wait for each other: nothing will ever free them
                    raise cores[next(iter(self._parked))].stall_error()
                return
            core, now = cores[k], clocks[k]
            if t < now:
                # A transfer deadline during engine k's pass (a shared tier): apply it then.
                result = core.advance_transfers(t)
                if self._parked:
                    self._unpark(t)
                if result.worth_reporting:
                    yield k, result
                continue
            self._idle_from[k] = None
            if self.fast is not None and self.fast(k, _INF if arrival is None else arrival):
                same_instant = 0
                continue
            result = core.step(now)
            if self._parked:
                self._unpark(now)
            if not result.idle:
                same_instant = 0
                clocks[k] = result.end
                self.num_passes += 1
                yield k, result
                continue
            if result.worth_reporting:
                yield k, result
            # Nothing can run: idle until the next transfer deadline or arrival, or (P/D:
            # its pool holds KV for other engines' pulls) until one of those pulls ends.
            targets = [x for x in (core.next_transfer_deadline(), arrival) if x is not None]
            pending = core.has_unfinished_requests()
            if not targets and not pending:
                continue  # the step applied the last transfers: drained
            blocked = pending and core.waits_on_peers()
            if not targets and not blocked:
                raise core.stall_error()
            target = max(now, min(targets)) if targets else _INF
            same_instant = same_instant + 1 if target == last else 0
            last = target
            if same_instant > 100:  # every idle step at `now` applies what is due
                raise core.stall_error()
            clocks[k] = target
            self._idle_from[k] = now
            if blocked:
                self._parked[k] = core.transfer_version
