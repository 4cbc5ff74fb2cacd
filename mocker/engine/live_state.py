"""The live driver's state: its core and clock, inbox, streams and held outputs."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from mocker.clock import WallClock
from mocker.config import EngineConfig
from mocker.disagg.params import RemotePrefill
from mocker.engine.core import EngineCore
from mocker.engine.inbox import AddRequest, InboxMessage, TransfersDue
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.sleep import SleepState
from mocker.engine.stats import EngineSnapshot, FinishedRequestStats
from mocker.engine.stream import RequestStream, deliver_loop
from mocker.engine.transfer_timer import TransferTimer

__all__ = ["LiveState"]


class LiveState:
    """LiveEngine's state, which its loop (mocker.engine.live_loop) and intake change."""

    def __init__(
        self,
        engine: EngineConfig | EngineCore,
        *,
        clock: WallClock | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        on_finish: Callable[[FinishedRequestStats], None] | None = None,
        max_lag_s: float = 0.05,
        max_merged_passes: int = 1,
    ) -> None:
        if max_merged_passes < 1:
            raise ValueError(f"max_merged_passes must be >= 1, not {max_merged_passes}")
        self.core = engine if isinstance(engine, EngineCore) else EngineCore(engine)
        self.clock = clock if clock is not None else WallClock()
        self.on_step = on_step
        # Requests that end outside a pass (abort, stop string); a pass's own finishes are in
        # its StepResult.
        self.on_finish = on_finish
        self.max_lag_s = max_lag_s
        # Passes run back to back while the loop is behind, their tokens handed out at once
        # (see _loop); 1: every pass's tokens go out before the next pass starts.
        self.max_merged_passes = max_merged_passes
        self._held: dict[RequestStream, list[RequestOutput]] = {}  # outputs not yet out
        self._held_passes = 0
        self._inbox: deque[InboxMessage] = deque()
        self._inbox_requests = 0  # AddRequests in the inbox: waiting, not yet in the core
        self._inbox_tokens = 0  # their prompt tokens
        # vLLM's sleep mode: while paused, new requests wait here (counted as in the inbox).
        self.sleep = SleepState()
        self._asleep: deque[InboxMessage] = deque()
        self._wake = asyncio.Event()
        # Request id -> stream, from add_request until the engine is done with the id
        # (its final output delivered, or its abort applied), so an id is never reused
        # while the loop could still deliver an old output under it.
        self._streams: dict[str, RequestStream] = {}
        self._deliver_loop = deliver_loop()  # (None: `deliver`'s Python loop)
        self._task: asyncio.Task[None] | None = None
        self._timer = TransferTimer(self.core, self.clock, lambda: self._post(TransfersDue()))
        self.dead_error: BaseException | None = None

    # -- state --------------------------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_error is not None

    @property
    def num_waiting(self) -> int:
        """Waiting requests, including those accepted but not yet drained into the core."""
        return self.core.num_waiting + self._inbox_requests

    @property
    def num_running(self) -> int:
        return self.core.num_running

    def snapshot(self) -> EngineSnapshot:
        """The core's snapshot, with accepted requests still in the inbox counted waiting."""
        snap = self.core.snapshot()
        if self.sleep.sleeping:
            snap = replace(snap, sleep_state=self.sleep.gauges())
        if not self._inbox_requests:
            return snap
        return replace(snap, num_waiting=snap.num_waiting + self._inbox_requests)

    def prefill_backlog(self) -> int:
        """Prompt tokens of the requests without their first token yet (vLLM 0.34's
        max_num_queued_tokens count: a prompt counts whole until its first token)."""
        pending = (r.num_prompt_tokens for r in self.core.requests.values()
                   if r.first_token_time is None)  # fmt: skip
        return self._inbox_tokens + sum(pending)

    def has_request(self, request_id: str) -> bool:
        """Whether `request_id` is in use (its consumer not yet done with it)."""
        return request_id in self._streams

    @property
    def num_open_streams(self) -> int:
        """Requests whose consumers still wait for outputs (in the engine or on their way)."""
        return len(self._streams)

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _wanted_remotes(self) -> list[RemotePrefill]:
        """The prefill KV this engine's requests want: in the core, or still in the inbox
        (or held there while the engine sleeps)."""
        specs = (m.spec for m in (*self._inbox, *self._asleep) if isinstance(m, AddRequest))
        wanted = [r.remote_prefill for r in self.core.requests.values()]
        wanted += [spec.remote_prefill for spec in specs]
        return [remote for remote in wanted if remote is not None]

    def release_remote(self, remote: RemotePrefill) -> None:
        """P/D decode side: a request refused or aborted before the engine took it: its
        prefill engine frees the KV it holds for it."""
        pulls = self.core.pulls
        if pulls is not None:
            pulls.peers.release(remote)

    def _post(self, message: InboxMessage) -> None:
        self._inbox.append(message)
        self._wake.set()
