"""Decode side: prompt KV pulled from prefill engines over one bandwidth-limited link
(processor sharing among this engine's pulls), then confirmed by the prefill engine."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from mocker.disagg.params import RemotePrefill
from mocker.request import Request
from mocker.tiers.channel import open_channel
from mocker.tiers.link import Link, TransferId

__all__ = [
    "PULL_SOURCE",
    "PdCounters",
    "PrefillPeers",
    "Pull",
    "PullRecord",
    "PullState",
    "RemotePulls",
    "Unreachable",
]

# The source of pulled KV in a request's tier hits (vLLM's CacheHitSource for NIXL).
PULL_SOURCE = "p2p"


_NO_TRANSFER = TransferId(-1)


@dataclass(slots=True)
class PdCounters:
    """What a live driver's side channel counts for vLLM's NIXL metrics."""

    failed_notifications: int = 0  # decode side: notifications that got no answer
    failed_releases: int = 0  # of which releases (a pull's failure is counted as the pull's)
    notifications_after_expiry: int = 0  # prefill side: reads of KV no longer held


class PullState(IntEnum):
    TRANSFERRING = 0  # bytes on the link
    CONFIRMING = 1  # bytes through; waiting for the prefill engine's answer
    DONE = 2
    FAILED = 3


@dataclass(slots=True, eq=False)
class Pull:
    """One request's pull: `num_blocks` device blocks (reserved) from the prefill engine
    named in `remote`."""

    request: Request
    remote: RemotePrefill
    num_blocks: int
    nbytes: int
    start: float
    deadline: float  # a pull whose bytes are not through by then fails (it recomputes)
    tid: TransferId = _NO_TRANSFER
    state: PullState = PullState.TRANSFERRING
    end: float = math.nan  # when its bytes were through


@dataclass(frozen=True, slots=True)
class PullRecord:
    """A pull that ended (engine clock): for vLLM's NIXL transfer metrics and reports."""

    request_id: str
    num_blocks: int
    nbytes: int
    start: float
    end: float
    ok: bool

    @property
    def duration(self) -> float:
        return self.end - self.start


class PrefillPeers(Protocol):
    """How a decode engine talks to the prefill engines (vLLM's NIXL notifications)."""

    def read_done(self, pull: Pull) -> bool | None:
        """A pull's bytes are through: the prefill engine frees its blocks. True or False:
        it held them (or not), known at once; None: the answer comes later (`confirm`)."""
        ...

    def release(self, remote: RemotePrefill) -> None:
        """Free blocks nobody will read (an abort, a timed-out pull)."""
        ...


class Unreachable:
    """No way to reach a prefill engine: every pull fails (the request recomputes)."""

    def read_done(self, pull: Pull) -> bool | None:
        return False

    def release(self, remote: RemotePrefill) -> None:
        return None


class RemotePulls:
    """The pulls of one decode engine. A pure model like the tier connector: time is an
    argument, and `poll` applies what is due in time order. How the prefill engine is told
    is the driver's: `read_done` and `release` (a ZMQ side channel live, a direct call in
    replay)."""

    def __init__(
        self,
        link: Link,
        block_bytes: int,
        timeout_s: float,
        peers: PrefillPeers | None = None,
        mode: str = "pull",
    ) -> None:
        self.channel = open_channel(link, PULL_SOURCE, "gpu")
        self.mode = mode  # this engine's connector; a prefill engine's other mode fails
        self.block_bytes = block_bytes
        self.timeout = timeout_s
        self.peers: PrefillPeers = peers if peers is not None else Unreachable()
        self._pulls: dict[str, Pull] = {}  # by request id
        self._deadlines: list[tuple[float, int, Pull]] = []  # lazily pruned
        self._order = 0
        self._answered: list[Pull] = []  # confirmed or refused since the last poll
        self._records: list[PullRecord] = []
        self.version = 0  # bumped when a pull starts or ends (the live timer re-arms)
        self.num_failed = 0  # cumulative, for vLLM's failed-transfer counter

    def __len__(self) -> int:
        return len(self._pulls)

    # -- starting and stopping ----------------------------------------------------------------

    def start(self, now: float, request: Request, num_blocks: int) -> Pull:
        """Pull `num_blocks` blocks into the device slots reserved for them."""
        remote = request.remote_prefill
        assert remote is not None
        pull = Pull(request, remote, num_blocks, num_blocks * self.block_bytes, now,
                    now + self.timeout)  # fmt: skip
        self._pulls[request.request_id] = pull
        if remote.transfer_mode != self.mode:
            # A push (WRITE) and a pull (READ) connector never complete a handshake (vLLM
            # hashes the mode into its compatibility check): the transfer fails at once, and
            # no word reaches the prefill engine, whose hold lasts until its lease ends.
            pull.end, pull.state = now, PullState.FAILED
            self._answered.append(pull)
            heapq.heappush(self._deadlines, (now, self._order, pull))  # (due at once)
            self._order += 1
            self.version += 1
            return pull
        pull.tid = self.channel.start(now, pull.nbytes, lambda end: self._through(pull, end))
        heapq.heappush(self._deadlines, (pull.deadline, self._order, pull))
        self._order += 1
        self.version += 1
        return pull

    def cancel(self, now: float, request: Request) -> bool:
        """Drop a request's pull (abort): the prefill engine is told to free its blocks. The
        caller frees the device slots. False if it had none."""
        pull = self._pulls.pop(request.request_id, None)
        if pull is None:
            return False
        if pull.state is PullState.TRANSFERRING:
            self.channel.cancel(now, pull.tid)
            self.peers.release(pull.remote)
        # Else its read notification is out already: that frees the prefill engine's blocks.
        self.version += 1
        return True

    def confirm(self, request_id: str, ok: bool) -> None:
        """The prefill engine's answer to `read_done`, when it came later (live); applied by
        the next poll. Ignored if the pull is gone (aborted, timed out)."""
        pull = self._pulls.get(request_id)
        if pull is None or pull.state is not PullState.CONFIRMING:
            return
        pull.state = PullState.DONE if ok else PullState.FAILED
        self._answered.append(pull)
        self.version += 1

    # -- time ---------------------------------------------------------------------------------

    def _through(self, pull: Pull, end: float) -> None:
        pull.end = end
        pull.state = PullState.CONFIRMING
        answer = self.peers.read_done(pull)
        if answer is not None:
            pull.state = PullState.DONE if answer else PullState.FAILED
            self._answered.append(pull)

    def next_deadline(self) -> float | None:
        """When the next pull's bytes are through or one times out (None: nothing pending);
        answers already given are due at once (the caller polls after posting them)."""
        if not self._pulls:
            return None
        best = self.channel.next_deadline()
        heap, pulls = self._deadlines, self._pulls
        while heap and pulls.get(heap[0][2].request.request_id) is not heap[0][2]:
            heapq.heappop(heap)
        if heap:
            best = heap[0][0] if best is None else min(best, heap[0][0])
        return best

    def poll(self, now: float) -> tuple[list[Request], list[Request]]:
        """Apply what is due by `now`: bytes through (and answers), timeouts. Returns
        (requests whose KV landed, requests whose pull failed: recompute)."""
        self.channel.finish(now)
        loaded: list[Request] = []
        failed: list[Request] = []
        answered, self._answered = self._answered, []
        for pull in answered:
            if self._pulls.pop(pull.request.request_id, None) is None:
                continue
            ok = pull.state is PullState.DONE
            (loaded if ok else failed).append(pull.request)
            self._record(pull, ok)
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            deadline, _, pull = heapq.heappop(heap)
            if self._pulls.get(pull.request.request_id) is not pull:
                continue
            if pull.state is PullState.CONFIRMING:
                # Its bytes are through: the answer decides, and always comes (a live
                # driver gives up on a silent peer on the wall clock, unscaled).
                continue
            del self._pulls[pull.request.request_id]
            if pull.state is PullState.TRANSFERRING:
                self.channel.cancel(deadline, pull.tid)
                pull.end = deadline
            self.peers.release(pull.remote)  # the prefill engine stops holding what nobody reads
            failed.append(pull.request)
            self._record(pull, False)
        if loaded or failed:
            self.version += 1
        return loaded, failed

    def _record(self, pull: Pull, ok: bool) -> None:
        if not ok:
            self.num_failed += 1
        end = pull.end if not math.isnan(pull.end) else pull.deadline
        self._records.append(PullRecord(pull.request.request_id, pull.num_blocks, pull.nbytes,
                                        pull.start, end, ok))  # fmt: skip

    def take_records(self) -> list[PullRecord]:
        records, self._records = self._records, []
        return records
