"""A link between two tiers and the owners of its transfers: whoever started a transfer is
called back when it ends, so a link shared by several engines hands each its own."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from mocker.compiled import clink as _clink
from mocker.compiled import use_compiled
from mocker.tiers.link import Link, TransferId

__all__ = ["Channel", "Done", "TransferChannel", "earliest", "earliest_of", "finish_due",
           "finish_due_of", "open_channel"]  # fmt: skip

# Called with the transfer's end time, when a poll reaches it.
Done = Callable[[float], None]


class TransferChannel(Protocol):
    """What the tiers' users ask of a channel (this module's `Channel`, or the compiled one
    in mocker/tiers/_clink.c, which computes every time by the same expressions)."""

    @property
    def src(self) -> str: ...
    @property
    def dst(self) -> str: ...
    @property
    def key(self) -> tuple[str, str]: ...
    def __len__(self) -> int: ...
    def start(self, now: float, nbytes: int, done: Done, /) -> TransferId: ...
    def cancel(self, now: float, tid: TransferId, /) -> None: ...
    def next_deadline(self) -> float | None: ...
    def finish(self, now: float, /) -> int: ...


def open_channel(link: Link, src: str, dst: str, compiled: bool | None = None) -> TransferChannel:
    """A channel over a fresh `link`: compiled unless `compiled` is False or
    MOCKER_COMPILED=0 (mocker.compiled); the compiled one keeps the
    link's state itself and takes only its bandwidth and latency."""
    if use_compiled("mocker.tiers._clink", compiled):
        return _clink.Channel(link.bandwidth, link.latency, src, dst)
    return Channel(link, src, dst)


def earliest(channels: list[TransferChannel]) -> tuple[float, TransferChannel | None]:
    """(The earliest next deadline of the channels, its channel), the first of equals; (inf,
    None) when all are idle. The compiled module's `earliest` (the same answer) reads its own
    channels without a call each: a poll asks at every event."""
    best, which = math.inf, None
    for channel in channels:
        d = channel.next_deadline()
        if d is not None and d < best:
            best, which = d, channel
    return best, which


def finish_due(channels: list[TransferChannel], bound: float) -> float:
    """Finish the earliest channel at its deadline while that is no later than `bound`,
    asking again after each (a callback may start transfers on any of them): every transfer
    that ends by `bound` is called back, in time order, the first channel of equals first.
    Returns the channels' next deadline then (inf: all idle). (The compiled module's, the
    same, loops in C.)"""
    while True:
        t, channel = earliest(channels)
        if channel is None or not t <= bound:  # (a NaN bound finishes nothing, as in C)
            return t
        channel.finish(t)


def earliest_of(
    compiled: bool | None = None,
) -> Callable[[list[TransferChannel]], tuple[float, TransferChannel | None]]:
    """`earliest`, compiled unless `compiled` is False or MOCKER_COMPILED=0."""
    if use_compiled("mocker.tiers._clink", compiled):
        return _clink.earliest
    return earliest


def finish_due_of(
    compiled: bool | None = None,
) -> Callable[[list[TransferChannel], float], float]:
    """`finish_due`, compiled unless `compiled` is False or MOCKER_COMPILED=0."""
    if use_compiled("mocker.tiers._clink", compiled):
        return _clink.finish_due
    return finish_due


class Channel:
    """A `Link` keyed by (source tier, destination tier), with one callback per transfer."""

    __slots__ = ("_done", "dst", "link", "src")

    def __init__(self, link: Link, src: str, dst: str) -> None:
        self.link = link
        self.src = src
        self.dst = dst
        self._done: dict[TransferId, Done] = {}

    def __len__(self) -> int:
        return len(self._done)

    @property
    def key(self) -> tuple[str, str]:
        return (self.src, self.dst)

    def start(self, now: float, nbytes: int, done: Done) -> TransferId:
        tid = self.link.start(now, nbytes)
        self._done[tid] = done
        return tid

    def cancel(self, now: float, tid: TransferId) -> None:
        """Stop a transfer at `now`; its callback is never called. Nothing if it ended."""
        if self._done.pop(tid, None) is not None:
            self.link.cancel(now, tid)

    def next_deadline(self) -> float | None:
        return self.link.next_deadline() if self._done else None

    def finish(self, now: float) -> int:
        """Call back, in finish order, every transfer done by `now`; how many ended. (The
        callbacks run once the link is at `now`; each may start or cancel transfers, and a
        transfer that ended by `now` is called back even if an earlier callback cancels it.)"""
        if not self._done:
            return 0
        finished = self.link.advance_to(now)
        done = self._done
        calls = [(done.pop(tid), end) for tid, end in finished]
        for call, end in calls:
            call(end)
        return len(calls)
