"""The live driver: an asyncio task that steps the core on the wall clock and streams outputs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from mocker.clock import WallClock
from mocker.config import EngineConfig
from mocker.engine.core import EngineCore, RequestRejected
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.request import EngineRequest

__all__ = ["EngineDeadError", "LiveEngine", "RequestStream"]

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed; no request can make progress."""


class RequestStream:
    """One request's outputs, merged until its consumer reads them (no per-token task)."""

    __slots__ = ("_error", "_event", "_pending", "finished", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._pending: RequestOutput | None = None
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self.finished = False

    def put(self, out: RequestOutput) -> None:
        pending = self._pending
        if pending is None:
            self._pending = out
        else:
            # The consumer fell behind: merge into one output carrying all new tokens.
            pending.new_token_ids.extend(out.new_token_ids)
            pending.time = out.time
            pending.finished = out.finished
            pending.finish_reason = out.finish_reason
        if out.finished:
            self.finished = True
        self._event.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self.finished = True
        self._event.set()

    async def get(self) -> RequestOutput:
        """The tokens produced since the last call; raises EngineDeadError if the engine died."""
        while self._pending is None:
            if self._error is not None:
                raise EngineDeadError(str(self._error)) from self._error
            self._event.clear()
            await self._event.wait()
        out, self._pending = self._pending, None
        return out


class LiveEngine:
    """Runs EngineCore in one asyncio task; the only writer of engine state.

    Callers put requests and aborts into an inbox and wake the loop. The loop
    steps the core, sleeps until the pass's absolute end, then hands each
    request its new tokens. Consecutive passes chain deadline to deadline, so
    sleep overshoot does not drift the simulated clock (unless the loop falls
    more than `max_lag_s` behind, when it resynchronises to the wall clock).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        core: EngineCore | None = None,
        clock: WallClock | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        max_lag_s: float = 0.05,
    ) -> None:
        self.core = core if core is not None else EngineCore(config)
        self.clock = clock if clock is not None else WallClock()
        self.on_step = on_step
        self.max_lag_s = max_lag_s
        self._inbox: deque[EngineRequest | str] = deque()
        self._wake = asyncio.Event()
        self._streams: dict[str, RequestStream] = {}
        self._task: asyncio.Task[None] | None = None
        self.dead_error: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_error is not None

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-loop")

    async def stop(self) -> None:
        """Cancel the loop; every open stream ends with an error instead of hanging."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_streams(EngineDeadError("engine stopped"))

    # -- intake -------------------------------------------------------------------------------

    def add_request(self, spec: EngineRequest) -> RequestStream:
        """Queue a request; raises RequestRejected (client error) or EngineDeadError."""
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error!r}")
        if spec.request_id in self._streams:
            raise RequestRejected(f"request id {spec.request_id!r} is already in use")
        self.core.check_request(spec)
        spec = replace(spec, arrival_time=self.clock.now())
        stream = RequestStream(spec.request_id)
        self._streams[spec.request_id] = stream
        self._inbox.append(spec)
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request; its blocks are freed at the start of the loop's next turn."""
        if self._streams.pop(request_id, None) is not None:
            self._inbox.append(request_id)
            self._wake.set()

    async def generate(self, spec: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Outputs of one request until it finishes; aborts it if the consumer goes away."""
        stream = self.add_request(spec)
        try:
            while True:
                out = await stream.get()
                yield out
                if out.finished:
                    return
        finally:
            if not stream.finished:
                self.abort(spec.request_id)

    # -- the loop -----------------------------------------------------------------------------

    def _drain_inbox(self) -> None:
        core = self.core
        inbox = self._inbox
        while inbox:
            item = inbox.popleft()
            if isinstance(item, str):
                core.abort_request(item, self.clock.now())
                continue
            try:
                core.add_request(item)
            except RequestRejected as exc:  # checked at the door; only a race lands here
                stream = self._streams.pop(item.request_id, None)
                if stream is not None:
                    stream.fail(exc)

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("engine loop failed; marking the engine dead")
            self.dead_error = exc
            self._fail_streams(EngineDeadError(f"engine loop failed: {exc!r}"))

    async def _loop(self) -> None:
        core, clock = self.core, self.clock
        prev_end: float | None = None
        while True:
            self._drain_inbox()
            if not core.has_unfinished_requests():
                prev_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = clock.now()
            start = prev_end if prev_end is not None and now - prev_end < self.max_lag_s else now
            result = core.step(start)
            if result.idle:
                raise core.stall_error()
            await clock.sleep_until(result.end)
            prev_end = result.end
            self._deliver(result)
            if self.on_step is not None:
                self.on_step(result)

    def _deliver(self, result: StepResult) -> None:
        streams = self._streams
        for out in result.outputs:
            stream = streams.get(out.request_id)
            if stream is None:
                continue  # aborted while the pass ran
            stream.put(out)
            if out.finished:
                del streams[out.request_id]

    def _fail_streams(self, error: BaseException) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.fail(error)
