"""Fault injection for router tests: random or forced failures, and latency jitter."""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

from mocker.api.errors import OpenAIError
from mocker.api.responses import Emitter

__all__ = [
    "FAULT_HEADER",
    "FaultConfig",
    "FaultInjector",
    "FaultType",
    "JitteredEmitter",
    "parse_fault_types",
]

# A request header that forces one fault (or, with "none", none) on that request.
FAULT_HEADER = "X-Mocker-Fail"


class FaultType(StrEnum):
    """The failures a request can be given, named as in the `type` label of the metric."""

    RATE_LIMIT = "rate_limit"  # 429
    OVERLOADED = "overloaded"  # 503
    SERVER_ERROR = "server_error"  # 500
    CONTEXT_LENGTH = "context_length"  # 400, vLLM's context-length message
    ABORT = "abort"  # starts normally, then the stream breaks off with an error event

    @property
    def status(self) -> int:
        """The HTTP status (for `abort`, the code in its error event: the response is 200)."""
        return _STATUS[self]


_STATUS = {
    FaultType.RATE_LIMIT: 429,
    FaultType.OVERLOADED: 503,
    FaultType.SERVER_ERROR: 500,
    FaultType.CONTEXT_LENGTH: 400,
    FaultType.ABORT: 500,
}
_BY_CODE = {str(status): t for t, status in _STATUS.items() if t is not FaultType.ABORT}
NO_FAULT = "none"
# Jitter is a fraction of a latency; past 10× it is a hang, not jitter.
MAX_JITTER = 10.0


def _parse_one(text: str) -> FaultType:
    key = text.strip().lower().replace("-", "_")
    fault = _BY_CODE.get(key)
    if fault is not None:
        return fault
    try:
        return FaultType(key)
    except ValueError:
        known = ", ".join([*_BY_CODE, *(t.value for t in FaultType)])
        raise ValueError(f"unknown failure type {text!r}; use one of {known}") from None


def parse_fault_types(items: Iterable[str | int]) -> tuple[FaultType, ...]:
    """Failure types by status code or name (`429`, `rate_limit`, `abort`, …), deduplicated
    in the order given; raises ValueError naming a bad one."""
    out: list[FaultType] = []
    for item in items:
        for part in str(item).replace(",", " ").split():
            fault = _parse_one(part)
            if fault not in out:
                out.append(fault)
    if not out:
        raise ValueError("give at least one failure type")
    return tuple(out)


def _fraction(name: str, value: Any, *, upper: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, not {value!r}")
    value = float(value)
    if not 0 <= value <= upper:  # NaN fails too
        raise ValueError(f"{name}={value!r} must be [0, {upper:g}]")
    return value


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """What to inject: a failure rate over some types, and jitter as fractions of latency."""

    failure_rate: float = 0.0
    failure_types: tuple[FaultType, ...] = tuple(FaultType)
    ttft_jitter: float = 0.0
    itl_jitter: float = 0.0

    def __post_init__(self) -> None:
        for name, upper in (("failure_rate", 1.0), ("ttft_jitter", MAX_JITTER),
                            ("itl_jitter", MAX_JITTER)):  # fmt: skip
            object.__setattr__(self, name, _fraction(name, getattr(self, name), upper=upper))
        if not self.failure_types:
            raise ValueError("failure_types must name at least one failure type")

    def with_changes(self, changes: Mapping[str, Any]) -> FaultConfig:
        """A copy with `changes` (JSON values: failure_types as a list or a comma string);
        raises ValueError on an unknown key or a bad value, changing nothing."""
        fields = set(self.as_json())
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ValueError(
                f"unknown setting(s) {', '.join(unknown)}; runtime settings are "
                + ", ".join(sorted(fields))
            )
        values = dict(changes)
        if "failure_types" in values:
            types = values["failure_types"]
            if isinstance(types, str | int) and not isinstance(types, bool):
                types = [types]
            if not isinstance(types, list) or any(isinstance(t, bool | dict | list) for t in types):
                raise ValueError("failure_types must be a list of names or status codes")
            values["failure_types"] = parse_fault_types(types)
        return replace(self, **values)  # __post_init__ checks the numbers

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["failure_types"] = [t.value for t in self.failure_types]
        return out

    @property
    def has_jitter(self) -> bool:
        return self.ttft_jitter > 0 or self.itl_jitter > 0


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
                return _parse_one(forced)
            except ValueError as exc:
                raise OpenAIError(400, f"{FAULT_HEADER}: {exc} (or {NO_FAULT})") from None
        config = self.config
        if config.failure_rate <= 0 or self._rng.random() >= config.failure_rate:
            return None
        return self._rng.choice(config.failure_types)

    def record(self, fault: FaultType) -> None:
        """Count a fault a client got (an abort once it has cut the response)."""
        self.counts[fault] += 1

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

    def release_all(self) -> None:
        """Send everything held back now, and hold nothing from here on (shutdown)."""
        self._released.set()
        for emitter in list(self._holding):
            emitter.flush(everything=True)


def failure_error(fault: FaultType, max_model_len: int, param: str) -> OpenAIError:
    """The error an injected failure answers with (all but `abort`, which streams first)."""
    if fault is FaultType.RATE_LIMIT:
        return OpenAIError(429, "Rate limit reached; retry after a short wait (injected fault).")
    if fault is FaultType.OVERLOADED:
        return OpenAIError(503, "The server is overloaded; retry later (injected fault).")
    if fault is FaultType.CONTEXT_LENGTH:
        return OpenAIError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            "request has more tokens than that. Please reduce the length of the input "
            "(injected fault).",
            param,
        )
    return OpenAIError(500, "Internal server error (injected fault).")


class JitteredEmitter:
    """An Emitter that holds each chunk back by a random share of its own latency.

    The first chunk waits up to `ttft_jitter` × the time since the request came in, each
    later one up to `itl_jitter` × the time since the previous chunk came from the engine.
    Chunks keep their order (one never overtakes a held one). The engine and its metrics
    do not see the delay: it stands for what lies between the engine and the client. When
    the response ends (the client left), whatever is held is dropped.
    """

    __slots__ = ("_emitter", "_held", "_injector", "_last_arrival", "_start", "_timer", "closed")

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
            self._injector._holding.add(self)
            self._timer = loop.call_at(self._held[0][0], self.flush)

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
        self._injector._holding.discard(self)

    def close(self) -> None:
        self._emitter.close()  # its done-callback drops what is held
