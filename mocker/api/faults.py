"""Fault injection at the door: which request fails, the error it gets, and jittered output."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable

from mocker.api.errors import OpenAIError
from mocker.api.responses import Emitter
from mocker.faults import FAULT_HEADER, NO_FAULT, FaultConfig, FaultType, parse_fault_type

__all__ = ["FaultInjector", "JitteredEmitter", "failure_error"]


class FaultInjector:
    """Decides each generation request's fault, counts the faults clients saw, and paces
    held (jittered) output.

    Failure draws come from one seeded generator, so a run that sends the same requests in
    the same order gets the same failures.
    """

    def __init__(self, config: FaultConfig, seed: int = 0) -> None:
        self.config = config
        self._rng = random.Random(f"mocker-faults-{seed}")
        # Its own generator: how many jitter draws a stream makes depends on timing, and
        # must not shift which requests fail.
        self._jitter_rng = random.Random(f"mocker-jitter-{seed}")
        self.counts: dict[FaultType, int] = dict.fromkeys(FaultType, 0)
        self._holding: set[JitteredEmitter] = set()  # emitters with chunks held back
        self._released = asyncio.Event()  # set at shutdown: nothing is held any more

    def choose(self, forced: str | None) -> FaultType | None:
        """The fault for one request: the one `forced` by the request header (or none for
        "none"), else one of the configured types with probability failure_rate."""
        if forced is not None and forced.strip():
            if forced.strip().lower() == NO_FAULT:
                return None
            try:
                return parse_fault_type(forced)
            except ValueError as exc:
                raise OpenAIError(400, f"{FAULT_HEADER}: {exc} (or {NO_FAULT})") from None
        config = self.config
        if config.failure_rate <= 0 or self._rng.random() >= config.failure_rate:
            return None
        return self._rng.choice(config.failure_types)

    def record(self, fault: FaultType) -> None:
        """Count a fault a client got (an abort once it has cut the response)."""
        self.counts[fault] += 1

    def record_abort(self) -> None:
        """An injected abort reached its client."""
        self.record(FaultType.ABORT)

    # -- jitter -------------------------------------------------------------------------------

    def jitter(self, fraction: float) -> float:
        """A random share in [0, fraction] of a latency, to hold its token back by."""
        if fraction <= 0 or self._released.is_set():
            return 0.0
        return self._jitter_rng.uniform(0.0, fraction)

    async def hold(self, delay: float, gone: asyncio.Event) -> None:
        """Wait `delay` seconds (a held response), cut short when the client leaves or
        release_all() is called."""
        if delay <= 0 or self._released.is_set():
            return
        waits = [asyncio.ensure_future(gone.wait()), asyncio.ensure_future(self._released.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    @property
    def released(self) -> bool:
        """Shutdown released everything held: nothing is held from then on."""
        return self._released.is_set()

    @property
    def num_holding(self) -> int:
        """Responses with chunks held back right now."""
        return len(self._holding)

    def track(self, emitter: JitteredEmitter, holding: bool) -> None:
        """An emitter started (True) or stopped (False) holding chunks back."""
        if holding:
            self._holding.add(emitter)
        else:
            self._holding.discard(emitter)

    def release_all(self) -> None:
        """Send everything held back now, and hold nothing from here on (shutdown)."""
        self._released.set()
        for emitter in list(self._holding):
            emitter.flush(everything=True)


def failure_error(fault: FaultType, max_model_len: int, param: str) -> OpenAIError:
    """The error an injected failure answers with (all but `abort`, which streams first), with
    the fault type's status."""
    if fault is FaultType.RATE_LIMIT:
        return OpenAIError(
            fault.status, "Rate limit reached; retry after a short wait (injected fault)."
        )
    if fault is FaultType.OVERLOADED:
        return OpenAIError(fault.status, "The server is overloaded; retry later (injected fault).")
    if fault is FaultType.CONTEXT_LENGTH:
        return OpenAIError(
            fault.status,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            "request has more tokens than that. Please reduce the length of the input "
            "(injected fault).",
            param,
        )
    return OpenAIError(fault.status, "Internal server error (injected fault).")


class JitteredEmitter:
    """An Emitter that holds each chunk back by a random share of its own latency.

    The first chunk waits up to `ttft_jitter` × the time since the request came in, each
    later one up to `itl_jitter` × the time since the previous chunk came from the engine.
    Chunks keep their order (one never overtakes a held one). The engine and its metrics
    do not see the delay: it stands for what lies between the engine and the client. When
    the response ends (the client left), whatever is held is dropped.
    """

    __slots__ = ("_emitter", "_held", "_injector", "_last_arrival", "_start", "_timer", "closed")

    writer = None  # every chunk goes through `emit` (held back by its jitter)

    def fail(self) -> None:
        self._emitter.fail()

    def __init__(self, emitter: Emitter, injector: FaultInjector, start: float) -> None:
        self._emitter = emitter
        self._injector = injector
        self._last_arrival: float | None = None
        self._start = start
        # (release time, chunk, last, called once it is sent)
        self._held: deque[tuple[float, bytes, bool, Callable[[], None] | None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.closed = emitter.closed
        self.closed.add_done_callback(lambda _: self._drop())

    def emit(
        self, chunk: bytes, *, last: bool = False, on_sent: Callable[[], None] | None = None
    ) -> None:
        if self.closed.done():
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        config = self._injector.config
        first = self._last_arrival is None
        share = self._injector.jitter(config.ttft_jitter if first else config.itl_jitter)
        since = now - (self._start if self._last_arrival is None else self._last_arrival)
        self._last_arrival = now
        release = now + share * since
        if not self._held and release <= now:
            self._emitter.emit(chunk, last=last)
            if on_sent is not None:
                on_sent()
            return
        if self._held:
            if self._held[-1][2]:
                return  # the response's last chunk is already held: nothing may follow it
            release = max(release, self._held[-1][0])
        self._held.append((release, chunk, last, on_sent))
        if self._timer is None:
            self._injector.track(self, True)
            self._timer = loop.call_at(self._held[0][0], self.flush)

    @property
    def num_held(self) -> int:
        """Chunks held back, not yet sent."""
        return len(self._held)

    def flush(self, *, everything: bool = False) -> None:
        """Send every held chunk that is due (or all of them), in order; re-arm for the next."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = self._held
        now = asyncio.get_running_loop().time()
        while held and (everything or held[0][0] <= now) and not self.closed.done():
            _, chunk, last, on_sent = held.popleft()
            self._emitter.emit(chunk, last=last)
            if on_sent is not None:
                on_sent()
        if held and not self.closed.done():
            self._timer = asyncio.get_running_loop().call_at(held[0][0], self.flush)
        else:
            self._drop()

    def _drop(self) -> None:
        """Nothing held any more (all sent, or the response ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()
        self._injector.track(self, False)

    def close(self) -> None:
        self._emitter.close()  # its done-callback drops what is held
