"""A link between two tiers and the owners of its transfers: whoever started a transfer is
called back when it ends, so a link shared by several engines hands each its own."""

from __future__ import annotations

from collections.abc import Callable

from mocker.tiers.link import Link, TransferId

__all__ = ["Channel", "Done"]

# Called with the transfer's end time, when a poll reaches it.
Done = Callable[[float], None]


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
        if self._done.pop(tid, None) is not None:
            self.link.cancel(now, tid)

    def next_deadline(self) -> float | None:
        return self.link.next_deadline() if self._done else None

    def finish(self, now: float) -> int:
        """Call back, in finish order, every transfer done by `now`; how many ended."""
        if not self._done:
            return 0
        finished = self.link.advance_to(now)
        done = self._done
        for tid, end in finished:
            done.pop(tid)(end)
        return len(finished)
