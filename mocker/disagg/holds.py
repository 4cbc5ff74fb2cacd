"""Prefill side: finished requests whose KV blocks stay referenced until a decode engine has
pulled them, or until their lease (vLLM's kv_lease_duration) expires."""

from __future__ import annotations

import heapq
import math
import uuid
from dataclasses import dataclass

from mocker.request import Request

__all__ = ["KVHolds"]


@dataclass(slots=True, eq=False)
class _Hold:
    request: Request
    deadline: float


class KVHolds:
    """The holds of one engine, by hold id: the request id made unique (a client may reuse a
    request id while the first request's KV is still held; vLLM's internal ids differ too).
    A pure model: times are arguments; the engine frees the blocks of whatever `release` or
    `expire` hands back."""

    __slots__ = ("_by_request", "_deadlines", "_held", "_seq", "_token", "num_expired",
                 "timeout", "version")  # fmt: skip

    def __init__(self, timeout_s: float) -> None:
        self.timeout = timeout_s
        self._held: dict[str, _Hold] = {}  # by hold id
        self._by_request: dict[str, str] = {}  # request id -> its latest hold id
        self._deadlines: list[tuple[float, str]] = []  # lazily pruned
        self._seq = 0
        # Per start: a restarted engine (with a fixed engine id) never reuses a hold id.
        self._token = uuid.uuid4().hex[:8]
        self.version = 0  # bumped when a hold starts or ends (the live timer re-arms)
        self.num_expired = 0  # cumulative (vLLM's nixl_num_kv_expired_reqs)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, hold_id: object) -> bool:
        return hold_id in self._held

    def hold(self, request: Request, now: float) -> str:
        """Keep a finished request's blocks for a pull until `now` + the lease; its hold id."""
        self._seq += 1
        hold_id = f"{request.request_id}-{self._token}{self._seq}"
        deadline = now + self.timeout
        self._held[hold_id] = _Hold(request, deadline)
        self._by_request[request.request_id] = hold_id
        heapq.heappush(self._deadlines, (deadline, hold_id))
        self.version += 1
        return hold_id

    def extend(self, hold_id: str, until: float) -> bool:
        """A decode engine still wants this hold (vLLM's lease heartbeat): it lasts at least
        until `until` (math.inf: until released). False if nothing is held under the id."""
        hold = self._held.get(hold_id)
        if hold is None:
            return False
        if until > hold.deadline:
            hold.deadline = until
            if until != math.inf:
                heapq.heappush(self._deadlines, (until, hold_id))
            self.version += 1
        return True

    def hold_id_of(self, request_id: str) -> str | None:
        """The hold of the latest request with this id, while it is held."""
        return self._by_request.get(request_id)

    def request(self, hold_id: str) -> Request | None:
        """The held request (None: nothing held under this id)."""
        hold = self._held.get(hold_id)
        return None if hold is None else hold.request

    def release(self, hold_id: str) -> Request | None:
        """The decode side has read the blocks (or gave up): the request, for the engine to
        free its blocks; None if nothing is held under that id (expired, never held)."""
        hold = self._held.pop(hold_id, None)
        if hold is None:
            return None
        self._forget(hold_id, hold)
        self.version += 1
        return hold.request

    def _forget(self, hold_id: str, hold: _Hold) -> None:
        request_id = hold.request.request_id
        if self._by_request.get(request_id) == hold_id:
            del self._by_request[request_id]

    def expire(self, now: float) -> list[Request]:
        """Holds whose time is up by `now`, in deadline order."""
        out: list[Request] = []
        heap, held = self._deadlines, self._held
        while heap and heap[0][0] <= now:
            deadline, hold_id = heapq.heappop(heap)
            hold = held.get(hold_id)
            if hold is not None and hold.deadline == deadline:
                del held[hold_id]
                self._forget(hold_id, hold)
                out.append(hold.request)
        if out:
            self.version += 1
            self.num_expired += len(out)
        return out

    def next_deadline(self) -> float | None:
        heap, held = self._deadlines, self._held
        while heap:
            deadline, hold_id = heap[0]
            hold = held.get(hold_id)
            if hold is not None and hold.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return None
