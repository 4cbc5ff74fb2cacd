"""Waiting requests ordered by (priority, arrival), with preempted requests put back in front."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from itertools import count
from typing import Any

from mocker.request import Request

__all__ = ["WaitingQueue"]


class WaitingQueue:
    """A heap keyed by (priority, order).

    First come, first served (`by_arrival` off, where every priority is 0): `push` gives
    increasing orders; `push_front` gives decreasing negative ones, so the latest request
    pushed to the front comes first: exactly a deque's append and appendleft.
    `by_arrival` (vLLM's priority policy): the order is the request's arrival time (then
    the order it came in), wherever it is pushed: a preempted request goes back to its
    place by (priority, arrival), as vLLM's priority queue takes it back.
    Removal (abort) is lazy: the entry is skipped when it reaches the top.
    """

    __slots__ = ("_back", "_by_arrival", "_front", "_heap", "_live")

    def __init__(self, *, by_arrival: bool = False) -> None:
        self._heap: list[tuple[int, Any, Request]] = []
        self._back = count()
        self._front = count(-1, -1)
        self._by_arrival = by_arrival
        self._live: dict[Request, Any] = {}  # request -> its order in the heap

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __contains__(self, request: Request) -> bool:
        return request in self._live

    def _push(self, request: Request, order: Any) -> None:
        if request in self._live:
            raise ValueError(f"request {request.request_id} is already waiting")
        self._live[request] = order
        heapq.heappush(self._heap, (request.priority, order, request))

    def push(self, request: Request) -> None:
        if self._by_arrival:
            self._push(request, (request.arrival_time, next(self._back)))
        else:
            self._push(request, next(self._back))

    def push_front(self, request: Request) -> None:
        if self._by_arrival:
            self.push(request)  # (its place is its arrival's)
        else:
            self._push(request, next(self._front))

    def _settle(self) -> None:
        heap, live = self._heap, self._live
        while heap and live.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)

    def peek(self) -> Request | None:
        self._settle()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Request:
        self._settle()
        _, _, request = heapq.heappop(self._heap)
        del self._live[request]
        return request

    def pop_entry(self) -> tuple[Request, Any]:
        """Pop the first request with its order, to `restore` it later in the same place
        (a request skipped by one pass keeps its turn)."""
        self._settle()
        _, order, request = heapq.heappop(self._heap)
        del self._live[request]
        return request, order

    def restore(self, request: Request, order: Any) -> None:
        self._push(request, order)

    def remove(self, request: Request) -> bool:
        return self._live.pop(request, None) is not None

    def __iter__(self) -> Iterator[Request]:
        """Waiting requests in scheduling order (for tests and introspection; O(n log n))."""
        return iter([r for _, o, r in sorted(self._heap) if self._live.get(r) == o])
