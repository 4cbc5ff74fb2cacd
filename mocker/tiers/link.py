"""A transfer link with processor sharing: N concurrent transfers each progress at B/N."""

from __future__ import annotations

import heapq
from typing import NewType

__all__ = ["Link", "TransferId"]

TransferId = NewType("TransferId", int)


class Link:
    """One direction of a bandwidth-limited link; a pure model: time is always an argument.

    Processor sharing is tracked in *attained service*: every active transfer has
    received the same number of bytes since the link was created, V(t), which grows
    at B/n while n transfers are active. A transfer started when the service level
    was V0 finishes when V reaches V0 + nbytes, so finish order is a heap on that
    target and each event costs O(log n). A fixed per-transfer latency is added
    after the bytes are through. Bandwidth <= 0 means instant transfers.
    """

    __slots__ = ("_active", "_deadline", "_delayed", "_fresh", "_heap", "_next_id", "_service",
                 "_time", "bandwidth", "latency")  # fmt: skip

    def __init__(self, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> None:
        if latency_s < 0:
            raise ValueError(f"latency must be >= 0, got {latency_s}")
        self.bandwidth = bandwidth_bytes_per_s
        self.latency = latency_s
        self._time = 0.0  # the link's state is known up to here
        self._service = 0.0  # V(_time)
        self._heap: list[tuple[float, TransferId]] = []  # (service target, id), lazily pruned
        self._active: dict[TransferId, float] = {}  # id -> service target, while sharing
        # (finish time, id): bytes through, due when the latency has passed too.
        self._delayed: list[tuple[float, TransferId]] = []
        self._next_id = 0
        # next_deadline(), kept until a transfer starts, ends or is cancelled (time passing
        # alone does not move it): every poll of every engine asks for it.
        self._deadline: float | None = None
        self._fresh = True

    def __len__(self) -> int:
        """Transfers not yet finished."""
        return len(self._active) + len(self._delayed)

    @property
    def instant(self) -> bool:
        return self.bandwidth <= 0

    def duration(self, nbytes: int) -> float:
        """Seconds one transfer of `nbytes` takes on an otherwise idle link."""
        return (0.0 if self.instant else nbytes / self.bandwidth) + self.latency

    def start(self, now: float, nbytes: int) -> TransferId:
        """Begin a transfer at `now` (never before the link's last known time)."""
        self._progress(now)
        self._fresh = False
        tid = TransferId(self._next_id)
        self._next_id += 1
        if self.instant or nbytes <= 0:
            heapq.heappush(self._delayed, (self._time + self.latency, tid))
        else:
            target = self._service + nbytes
            self._active[tid] = target
            heapq.heappush(self._heap, (target, tid))
        return tid

    def cancel(self, now: float, tid: TransferId) -> bool:
        """Stop a transfer at `now`; the others speed up. False if it already finished."""
        self._progress(now)
        self._fresh = False
        if self._active.pop(tid, None) is not None:
            return True  # its heap entry is skipped when it surfaces
        for i, (_, other) in enumerate(self._delayed):
            if other == tid:
                self._delayed[i] = self._delayed[-1]
                self._delayed.pop()
                heapq.heapify(self._delayed)
                return True
        return False

    def advance_to(self, now: float) -> list[tuple[TransferId, float]]:
        """Move to `now`; the transfers finished by then, with their finish times, in order."""
        self._progress(now)
        done: list[tuple[TransferId, float]] = []
        delayed = self._delayed
        while delayed and delayed[0][0] <= now:
            finish, tid = heapq.heappop(delayed)
            done.append((tid, finish))
        if done:
            self._fresh = False
        return done

    def next_deadline(self) -> float | None:
        """When the next transfer finishes if nothing else starts (None: link idle)."""
        if not self._fresh:
            self._deadline = self._next_deadline()
            self._fresh = True
        return self._deadline

    def _next_deadline(self) -> float | None:
        best = self._delayed[0][0] if self._delayed else None
        head = self._head()
        if head is not None:
            finish = self._bytes_done_at(head) + self.latency
            best = finish if best is None else min(best, finish)
        return best

    def _bytes_done_at(self, target: float) -> float:
        # Never before the link's time: rounding may leave the service a hair past a target.
        return self._time + max(0.0, target - self._service) * len(self._active) / self.bandwidth

    def _head(self) -> float | None:
        heap, active = self._heap, self._active
        while heap and active.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def _progress(self, now: float) -> None:
        """Advance the shared service to `now`; transfers whose bytes are through move to the
        finish heap, due after their latency. Time never goes back. (`_head` and
        `_bytes_done_at` are written out inline: this runs at every start and poll.)"""
        if now < self._time:
            return
        active, heap = self._active, self._heap
        while active:
            # The heap holds an entry for every active transfer (and stale ones: skipped).
            while active.get(heap[0][1]) != heap[0][0]:
                heapq.heappop(heap)
            head = heap[0][0]
            finish = self._time + max(0.0, head - self._service) * len(active) / self.bandwidth
            if finish > now:
                break
            # Bytes done: time and service move to this instant exactly (no drift).
            self._time = finish
            self._service = head
            tid = heapq.heappop(heap)[1]
            del active[tid]
            heapq.heappush(self._delayed, (finish + self.latency, tid))
            self._fresh = False  # n changed: the others' finish times moved
        if active:
            self._service += (now - self._time) * self.bandwidth / len(active)
        else:
            # Idle: restart the service count, so it never grows large enough to lose
            # precision over a long uptime (stale heap entries go with it).
            self._service = 0.0
            heap.clear()
        self._time = now
