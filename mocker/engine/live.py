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
from mocker.request import EngineRequest, FinishReason, Request, RequestStatus
from mocker.tiers.offload import Direction

__all__ = ["EngineDeadError", "LiveEngine", "RequestStream"]

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed; no request can make progress."""


# Posted to the inbox by a transfer worker: a transfer deadline has passed.
_TRANSFERS_DUE = "transfers-due"

# A request, an early finish (id, status), _TRANSFERS_DUE, or a prefix-cache reset
# awaiting the number of blocks it cleared.
_InboxItem = EngineRequest | tuple[str, RequestStatus] | str | asyncio.Future[int]


class RequestStream:
    """One request's outputs: merged until its consumer reads them with `get()`, or pushed to a
    listener the moment the engine loop produces them (no task wake-up per output)."""

    __slots__ = ("_error", "_event", "_listener", "_pending", "finished", "request_id")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._pending: RequestOutput | None = None
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self._listener: Callable[[RequestOutput | EngineDeadError], None] | None = None
        self.finished = False

    def listen(self, listener: Callable[[RequestOutput | EngineDeadError], None]) -> None:
        """Push every output (or the engine's death) to `listener`, called on the engine loop;
        what arrived before is handed over at once."""
        self._listener = listener
        pending, self._pending = self._pending, None
        if pending is not None:
            listener(pending)
        if self._error is not None:
            listener(EngineDeadError(str(self._error)))

    def put(self, out: RequestOutput) -> None:
        if self.finished:
            return  # e.g. the last pass's output of a request aborted meanwhile
        self.finished = out.finished
        listener = self._listener
        if listener is not None:
            try:
                listener(out)
            except Exception:  # a consumer bug must not take the engine loop down with it
                logger.exception("output listener of request %s failed", self.request_id)
                self.finished = True
            return
        pending = self._pending
        if pending is None:
            self._pending = out
        else:
            # The consumer fell behind: merge into a new object (the engine's outputs may
            # also be held by step observers, so they are never mutated).
            self._pending = RequestOutput(
                out.request_id,
                pending.new_token_ids + out.new_token_ids,
                out.time,
                out.finished,
                out.finish_reason,
                out.num_prompt_tokens,
                out.num_cached_tokens,
                out.num_host_cached_tokens,
            )
        self._event.set()

    def fail(self, error: BaseException) -> None:
        if self.finished and self._pending is None and self._error is None:
            return  # already fully delivered
        self._error = error
        self.finished = True
        if self._listener is not None:
            self._listener(EngineDeadError(str(error)))
            return
        self._event.set()

    async def get(self) -> RequestOutput:
        """The tokens produced since the last call; raises EngineDeadError if the engine died."""
        while self._pending is None:
            if self._error is not None:
                raise EngineDeadError(str(self._error)) from self._error
            if self.finished:
                raise RuntimeError(f"request {self.request_id} has finished; no more outputs")
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

    With a host tier, one transfer worker task per link direction sleeps until
    that link's next deadline (re-armed whenever a transfer starts or ends) and
    posts to the inbox; the loop then applies the completions. Only the loop
    changes block and tier state.
    """

    def __init__(
        self,
        engine: EngineConfig | EngineCore,
        *,
        clock: WallClock | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        on_finish: Callable[[Request], None] | None = None,
        max_lag_s: float = 0.05,
    ) -> None:
        self.core = engine if isinstance(engine, EngineCore) else EngineCore(engine)
        self.clock = clock if clock is not None else WallClock()
        self.on_step = on_step
        # Requests that end outside a pass (abort, stop string); a pass's own finishes are in
        # its StepResult.
        self.on_finish = on_finish
        self.max_lag_s = max_lag_s
        self._inbox: deque[_InboxItem] = deque()
        self._inbox_requests = 0  # EngineRequests in the inbox: waiting, not yet in the core
        self._wake = asyncio.Event()
        # Request id -> stream, from add_request until the engine is done with the id
        # (its final output delivered, or its abort applied), so an id is never reused
        # while the loop could still deliver an old output under it.
        self._streams: dict[str, RequestStream] = {}
        self._task: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._rearm = {d: asyncio.Event() for d in Direction}
        self._transfer_version = -1
        self.dead_error: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def is_dead(self) -> bool:
        return self.dead_error is not None

    @property
    def num_waiting(self) -> int:
        """Waiting requests, including those accepted but not yet drained into the core."""
        return self.core.num_waiting + self._inbox_requests

    def has_request(self, request_id: str) -> bool:
        """Whether `request_id` is in use (its consumer not yet done with it)."""
        return request_id in self._streams

    @property
    def num_open_streams(self) -> int:
        """Requests whose consumers still wait for outputs (in the engine or on their way)."""
        return len(self._streams)

    def abort_all(self) -> int:
        """Abort every open request (shutdown); returns how many."""
        ids = list(self._streams)
        for request_id in ids:
            self.abort(request_id)
        return len(ids)

    @property
    def num_running(self) -> int:
        return self.core.num_running

    @property
    def is_running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="engine-loop")
            if self.core.offload is not None:
                self._workers = [
                    loop.create_task(self._transfer_worker(d), name=f"transfer-{d.name.lower()}")
                    for d in Direction
                ]

    async def stop(self) -> None:
        """Cancel the loop; open streams end with an error and new requests are refused."""
        self._die(EngineDeadError("engine stopped"))
        task, self._task = self._task, None
        workers, self._workers = self._workers, []
        for t in [task, *workers]:
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    # -- intake -------------------------------------------------------------------------------

    def add_request(self, spec: EngineRequest) -> RequestStream:
        """Queue a request; raises RequestRejected (client error) or EngineDeadError."""
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        if spec.request_id in self._streams:
            raise RequestRejected(f"request id {spec.request_id!r} is already in use")
        self.core.check_request(spec)
        spec = replace(spec, arrival_time=self.clock.now())
        stream = RequestStream(spec.request_id)
        self._streams[spec.request_id] = stream
        self._inbox.append(spec)
        self._inbox_requests += 1
        self._wake.set()
        return stream

    def abort(self, request_id: str, stream: RequestStream | None = None) -> None:
        """Abort a request: its stream ends now with reason 'abort'; its blocks are freed
        when the loop next turns (before the next pass). With `stream`, only if the id still
        belongs to that stream (not to a later request that reused the id)."""
        self._finish_early(request_id, RequestStatus.FINISHED_ABORTED, FinishReason.ABORT, stream)

    def stop_request(self, request_id: str, stream: RequestStream | None = None) -> None:
        """Finish a request with reason 'stop' (its consumer matched a stop string)."""
        self._finish_early(request_id, RequestStatus.FINISHED_STOPPED, FinishReason.STOP, stream)

    def _finish_early(
        self,
        request_id: str,
        status: RequestStatus,
        reason: FinishReason,
        owner: RequestStream | None,
    ) -> None:
        stream = self._streams.get(request_id)
        if stream is None or stream.finished or (owner is not None and stream is not owner):
            return
        stream.put(RequestOutput(request_id, [], self.clock.now(), True, reason))
        self._inbox.append((request_id, status))
        self._wake.set()

    async def reset_prefix_cache(self) -> int:
        """Clear the device prefix cache of unreferenced blocks, between two passes (so its
        events follow the last pass's); returns the number of blocks cleared."""
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._inbox.append(done)
        self._wake.set()
        return await done

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

    def _drain_inbox(self) -> tuple[float | None, bool]:
        """Apply queued requests and aborts; returns the latest arrival time drained, and
        whether a transfer worker reported a deadline passed."""
        core = self.core
        inbox = self._inbox
        latest: float | None = None
        transfers_due = False
        while inbox:
            item = inbox.popleft()
            if isinstance(item, str):
                transfers_due = True
                continue
            if isinstance(item, asyncio.Future):
                self._reset_prefix_cache(item)
                continue
            if isinstance(item, tuple):
                request_id, status = item
                request = core.finish_request(request_id, self.clock.now(), status)
                self._streams.pop(request_id, None)
                if request is not None and self.on_finish is not None:
                    self.on_finish(request)
                continue
            self._inbox_requests -= 1
            stream = self._streams.get(item.request_id)
            if stream is None or stream.finished:
                continue  # aborted before it reached the engine; its abort item follows
            core.add_request(item)  # validated at the door by check_request
            latest = item.arrival_time if latest is None else max(latest, item.arrival_time)
        return latest, transfers_due

    def _reset_prefix_cache(self, done: asyncio.Future[int]) -> None:
        core = self.core
        try:
            cleared, result = core.reset_prefix_cache(max(self.clock.now(), core.time))
            self._observe(result)
        except BaseException as exc:
            # The loop dies of this; the caller must not wait for an answer that never comes.
            if not done.done():
                done.set_exception(EngineDeadError(f"prefix cache reset failed: {exc!r}"))
            raise
        if not done.done():
            done.set_result(cleared)

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            self._die(EngineDeadError("engine loop cancelled"))
            raise
        except Exception as exc:
            logger.exception("engine loop failed; marking the engine dead")
            self._die(exc)

    async def _loop(self) -> None:
        core, clock = self.core, self.clock
        prev_end: float | None = None
        while True:
            latest_arrival, transfers_due = self._drain_inbox()
            if transfers_due:
                # A deadline passed on the wall clock: apply it now, pass or no pass.
                self._observe(core.advance_transfers(max(clock.now(), core.time)))
            if not core.has_unfinished_requests():
                prev_end = None
                await self._idle()
                continue
            now = clock.now()
            if prev_end is None or now - prev_end >= self.max_lag_s:
                start = now
            else:
                # Chain from the previous deadline, but never before a request that is in
                # this pass arrived (queue times stay non-negative).
                start = prev_end if latest_arrival is None else max(prev_end, latest_arrival)
            result = core.step(max(start, core.time))
            if result.idle:
                # Every request waits for a transfer (a load, or blocks being offloaded).
                if not core.has_pending_transfers():
                    raise core.stall_error()
                self._observe(result)
                prev_end = None
                await self._idle()
                continue
            self._rearm_workers()
            await clock.sleep_until(result.end)
            prev_end = result.end
            self._deliver(result)
            if self.on_step is not None:
                self.on_step(result)

    async def _idle(self) -> None:
        """Sleep until a request, an abort or a transfer worker wakes the loop."""
        self._rearm_workers()
        self._wake.clear()
        await self._wake.wait()

    def _observe(self, result: StepResult) -> None:
        """A result without a pass: news only if it carries transfers, events or counts."""
        self._rearm_workers()
        if self.on_step is not None and result.newsworthy:
            self.on_step(result)

    def _rearm_workers(self) -> None:
        offload = self.core.offload
        if offload is not None and offload.version != self._transfer_version:
            self._transfer_version = offload.version
            for event in self._rearm.values():
                event.set()

    async def _transfer_worker(self, direction: Direction) -> None:
        """Sleep until the link's next deadline, then ask the loop to apply it. Re-armed
        (woken to look again) whenever a transfer starts or ends."""
        rearm = self._rearm[direction]
        core, clock = self.core, self.clock
        while True:
            rearm.clear()
            deadline = core.next_transfer_deadline(direction)
            if deadline is None:
                await rearm.wait()
                continue
            delay = deadline - clock.now()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(rearm.wait(), delay)
                continue  # re-armed, or time is up: look again (timers may fire early)
            self._inbox.append(_TRANSFERS_DUE)
            self._wake.set()
            # The loop applies it at a time >= deadline, which changes the transfer set and
            # re-arms this worker.
            await rearm.wait()

    def _deliver(self, result: StepResult) -> None:
        """Hand each stream its tokens. Outputs of requests that ended during the pass (abort,
        stop string) are dropped from the result too, as vLLM's output processor drops them:
        no client saw those tokens, so no observer counts them."""
        streams = self._streams
        outputs = result.outputs
        kept: list[RequestOutput] | None = None
        for i, out in enumerate(outputs):
            stream = streams.get(out.request_id)
            if stream is None or stream.finished:
                if kept is None:
                    kept = outputs[:i]
                continue
            stream.put(out)
            if out.finished:
                del streams[out.request_id]
            if kept is not None:
                kept.append(out)
        if kept is not None:
            result.outputs = kept

    def _die(self, error: BaseException) -> None:
        if self.dead_error is None:
            self.dead_error = error
        for worker in self._workers:
            worker.cancel()  # nothing left to wake
        streams, self._streams = self._streams, {}
        for item in self._inbox:
            if isinstance(item, asyncio.Future) and not item.done():
                item.set_exception(EngineDeadError(f"engine is dead: {error}"))
        self._inbox.clear()
        self._inbox_requests = 0
        failure = (
            error
            if isinstance(error, EngineDeadError)
            else EngineDeadError(f"engine loop failed: {error!r}")
        )
        for stream in streams.values():
            stream.fail(failure)
