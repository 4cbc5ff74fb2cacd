"""Prefill side: finished requests whose KV blocks stay referenced until a decode engine has
pulled them, or until vLLM's abort timeout frees them."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from mocker.request import Request

__all__ = ["KVHolds"]


@dataclass(slots=True, eq=False)
class _Hold:
    request: Request
    deadline: float


class KVHolds:
    """The holds of one engine, by request id. A pure model: times are arguments; the engine
    frees the blocks of whatever `release` or `expire` hands back."""

    __slots__ = ("_deadlines", "_held", "num_expired", "timeout", "version")

    def __init__(self, timeout_s: float) -> None:
        self.timeout = timeout_s
        self._held: dict[str, _Hold] = {}
        self._deadlines: list[tuple[float, str]] = []  # lazily pruned
        self.version = 0  # bumped when a hold starts or ends (the live timer re-arms)
        self.num_expired = 0  # cumulative (vLLM's nixl_num_kv_expired_reqs)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._held

    def hold(self, request: Request, now: float) -> float:
        """Keep a finished request's blocks for a pull; returns when the hold expires."""
        deadline = now + self.timeout
        self._held[request.request_id] = _Hold(request, deadline)
        heapq.heappush(self._deadlines, (deadline, request.request_id))
        self.version += 1
        return deadline

    def request(self, request_id: str) -> Request | None:
        """The held request under this id (None: none)."""
        hold = self._held.get(request_id)
        return None if hold is None else hold.request

    def release(self, request_id: str) -> Request | None:
        """The decode side has read the blocks (or gave up): the request, for the engine to
        free its blocks; None if nothing is held under that id (expired, never held)."""
        hold = self._held.pop(request_id, None)
        if hold is None:
            return None
        self.version += 1
        return hold.request

    def expire(self, now: float) -> list[Request]:
        """Holds whose time is up by `now`, in deadline order."""
        out: list[Request] = []
        heap, held = self._deadlines, self._held
        while heap and heap[0][0] <= now:
            deadline, request_id = heapq.heappop(heap)
            hold = held.get(request_id)
            if hold is not None and hold.deadline == deadline:
                del held[request_id]
                out.append(hold.request)
        if out:
            self.version += 1
            self.num_expired += len(out)
        return out

    def next_deadline(self) -> float | None:
        heap, held = self._deadlines, self._held
        while heap:
            deadline, request_id = heap[0]
            hold = held.get(request_id)
            if hold is not None and hold.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return None
