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
from mocker.disagg.params import RemotePrefill
from mocker.engine.core import EngineCore
from mocker.engine.inbox import (
    AddRequest,
    ExtendHolds,
    FinishEarly,
    InboxMessage,
    PreloadLora,
    PullAnswered,
    ReleaseHold,
    ResetPrefixCache,
    TransfersDue,
)
from mocker.engine.intake import request_id_in_use
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.sleep import SleepState
from mocker.engine.stats import EngineSnapshot, FinishedRequestStats
from mocker.engine.stream import EngineDeadError, RequestStream, deliver, deliver_loop, merged
from mocker.engine.transfer_timer import TransferTimer
from mocker.request import EngineRequest, FinishReason, RequestStatus

__all__ = ["EngineDeadError", "LiveEngine", "RequestStream"]

logger = logging.getLogger(__name__)

# With passes merged: a loop that wakes this share of a pass (or more) after the pass ended
# is behind (timer overshoot is well under it at modelled speed). A smaller share catches a
# lag sooner but merges more often; `bench/serve_stream.py` measures the pace it keeps.
BEHIND_SHARE = 0.25


class LiveEngine:
    """Runs EngineCore in one asyncio task; the only writer of engine state.

    Callers put requests and aborts into an inbox and wake the loop. The loop
    steps the core, sleeps until the pass's absolute end, then hands each
    request its new tokens. Consecutive passes chain deadline to deadline, so
    sleep overshoot does not drift the simulated clock (unless the loop falls
    more than `max_lag_s` behind, when it resynchronises to the wall clock; with merged
    passes, more than that many passes).

    With `max_merged_passes` > 1, a loop that wakes BEHIND_SHARE of a pass or more after
    its pass ended (the process cannot keep up with the modelled passes) runs the passes
    that are due at once and hands their tokens out together, one output per stream, up to
    that many passes: the engine's timeline keeps its modelled pace, as vLLM's engine core does in
    its own process while a lagging API server merges a stream's deltas
    (RequestOutputCollector). Each pass is observed (metrics, KV events) when it ends.

    With tiers, a transfer timer (mocker.engine.transfer_timer) sleeps until the KV
    stack's next deadline and posts to the inbox; the loop then applies what is due.
    Only the loop changes block and tier state.
    """

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

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name="engine-loop")
            if self.core.has_transfer_parts:
                self._timer.start()

    async def stop(self) -> None:
        """Cancel the loop and the transfer timer, and wait for both to end; open streams end
        with an error and new requests are refused."""
        timer_tasks = self._timer.cancel()  # before _die, which cancels it without waiting
        self._die(EngineDeadError("engine stopped"))
        task, self._task = self._task, None
        for t in [task, *timer_tasks]:
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    def abort_all(self) -> int:
        """Abort every open request (shutdown); returns how many."""
        ids = list(self._streams)
        for request_id in ids:
            self.abort(request_id)
        return len(ids)

    # -- intake -------------------------------------------------------------------------------

    def add_request(self, spec: EngineRequest, *, checked: bool = False) -> RequestStream:
        """Queue a request; raises RequestRejected (client error) or EngineDeadError.
        `checked`: the caller validated it against this engine's configuration just now
        (the request id is still checked here)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        if spec.request_id in self._streams:
            raise request_id_in_use(spec.request_id)
        if not checked:
            self.core.check_request(spec)
        spec = replace(spec, arrival_time=self.clock.now())
        stream = RequestStream(spec.request_id, self._consumer_failed)
        self._streams[spec.request_id] = stream
        self._post(AddRequest(spec))
        self._inbox_requests += 1
        self._inbox_tokens += len(spec.prompt_token_ids)
        return stream

    def abort(self, request_id: str, stream: RequestStream | None = None) -> None:
        """Abort a request: its stream ends now with reason 'abort'; its blocks are freed
        when the loop next turns (before the next pass). With `stream`, only if the id still
        belongs to that stream (not to a later request that reused the id)."""
        self._finish_early(request_id, RequestStatus.FINISHED_ABORTED, FinishReason.ABORT, stream)

    def stop_request(self, request_id: str, stream: RequestStream | None = None) -> None:
        """Finish a request with reason 'stop' (its consumer matched a stop string)."""
        self._finish_early(request_id, RequestStatus.FINISHED_STOPPED, FinishReason.STOP, stream)

    def _consumer_failed(self, stream: RequestStream) -> None:
        """A stream's consumer raised on an output before the last (the stream has ended):
        the request is aborted, its blocks freed before the next pass; the stream keeps
        its id until then."""
        if self._streams.get(stream.request_id) is stream:
            self._post(FinishEarly(stream.request_id, RequestStatus.FINISHED_ABORTED))

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
        self._post(FinishEarly(request_id, status))

    async def reset_prefix_cache(
        self, *, whole: bool = False, reset_running: bool = False
    ) -> int | None:
        """Clear the device prefix cache of unreferenced blocks, between two passes (so its
        events follow the last pass's); returns the number of blocks cleared (None: a
        `whole` reset refused: EngineCore.reset_prefix_cache)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        done: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._post(ResetPrefixCache(done, whole, reset_running))
        return await done

    async def fall_asleep(self, level: int, mode: str) -> None:
        """vLLM's sleep: scheduling pauses (new requests wait), after aborting what is in
        flight ("abort"), letting it finish ("wait", answered once it has) or freezing it
        ("keep"); from level 1 the prefix cache is dropped (the KV memory sleeps)."""
        if self.dead_error is not None:
            raise EngineDeadError(f"engine is dead: {self.dead_error}")
        if mode == "abort":
            self.abort_all()
        sleep = self.sleep
        sleep.fall_asleep(level, mode)
        self._wake.set()
        while mode == "wait" and self.core.has_unfinished_requests() and not self.is_dead:
            if sleep.frozen or not sleep.paused:
                break  # a "keep" sleep or a wake came meanwhile: nothing more to wait for
            await asyncio.sleep(0.01)  # (the loop runs the in-flight requests out)
        if level >= 1 and sleep.sleeping:  # (what was kept recomputes after the wake)
            await self.reset_prefix_cache(reset_running=True)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """vLLM's wake_up; once fully awake the requests that waited are taken in."""
        if not self.sleep.wake(tags):
            return False
        self._inbox.extendleft(reversed(self._asleep))
        self._asleep.clear()
        self._wake.set()
        return True

    async def release_hold(self, hold_id: str) -> bool:
        """P/D prefill side: free a held request's KV between two passes; whether it was
        still held (False when dead: nothing is held any more)."""
        if self.dead_error is not None:
            return False
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._post(ReleaseHold(hold_id, done))
        return await done

    def extend_holds(self, hold_ids: tuple[str, ...]) -> None:
        """P/D prefill side: a decode engine's heartbeat, applied between two passes."""
        if self.dead_error is None:
            self._post(ExtendHolds(hold_ids))

    def wants_remote(self, remote: RemotePrefill) -> bool:
        """P/D decode side: a request of this engine (in the core, or on its way there)
        still wants the KV that `remote` names."""
        return remote in self._wanted_remotes()

    def _drop_asleep(self, request_id: str) -> bool:
        """A request held while the engine sleeps ended before it ran: it goes, and its
        prefill engine hears it is not wanted. Whether it was held."""
        for message in self._asleep:
            if isinstance(message, AddRequest) and message.spec.request_id == request_id:
                self._asleep.remove(message)
                self._inbox_requests -= 1
                self._inbox_tokens -= len(message.spec.prompt_token_ids)
                if message.spec.remote_prefill is not None:
                    self.release_remote(message.spec.remote_prefill)
                return True
        return False

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

    def answer_pull(self, request_id: str, ok: bool) -> None:
        """P/D decode side: the prefill engine answered a pull's read notification."""
        self._post(PullAnswered(request_id, ok))

    def preload_lora(self, name: str) -> None:
        """Put an adapter loaded at runtime in the CPU cache, between two passes."""
        self._post(PreloadLora(name))

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

    def _post(self, message: InboxMessage) -> None:
        self._inbox.append(message)
        self._wake.set()

    # -- the loop -----------------------------------------------------------------------------

    def _drain_inbox(self) -> tuple[float | None, bool]:
        """Apply queued messages; returns the latest arrival time drained, and whether a
        transfer timer reported a deadline passed."""
        inbox = self._inbox
        latest: float | None = None
        transfers_due = False
        while inbox:
            match inbox.popleft():
                case AddRequest(spec) if self.sleep.paused:
                    self._asleep.append(AddRequest(spec))  # (still waiting, still counted)
                case AddRequest(spec):
                    self._inbox_requests -= 1
                    self._inbox_tokens -= len(spec.prompt_token_ids)
                    stream = self._streams.get(spec.request_id)
                    if stream is None or stream.finished:
                        # Aborted before it reached the engine; its abort follows.
                        if spec.remote_prefill is not None:
                            self.release_remote(spec.remote_prefill)
                        continue
                    self.core.add_request(spec, checked=True)  # checked at the door
                    arrival = spec.arrival_time
                    latest = arrival if latest is None else max(latest, arrival)
                case FinishEarly(request_id, status) if self._asleep and self._drop_asleep(
                    request_id
                ):
                    self._streams.pop(request_id, None)  # (held while asleep: it never ran)
                case FinishEarly(request_id, status):
                    stats = self.core.finish_request(request_id, self.clock.now(), status)
                    self._streams.pop(request_id, None)
                    if stats is not None and self.on_finish is not None:
                        self.on_finish(stats)
                case TransfersDue():
                    transfers_due = True
                case ResetPrefixCache(done, whole, reset_running):
                    self._reset_prefix_cache(done, whole, reset_running)
                case PreloadLora(name):
                    if self.core.lora is not None:
                        self.core.lora.preload([name])
                case ReleaseHold(hold_id, done):
                    held = self.core.release_hold(hold_id)
                    if not done.done():
                        done.set_result(held)
                case ExtendHolds(hold_ids):
                    self.core.extend_holds(hold_ids, max(self.clock.now(), self.core.time))
                    transfers_due = True  # the next expiry moved: the timer looks again
                case PullAnswered(request_id, ok):
                    if self.core.pulls is not None:
                        self.core.pulls.confirm(request_id, ok)
                        transfers_due = True  # applied at once, pass or no pass
        return latest, transfers_due

    def _reset_prefix_cache(
        self, done: asyncio.Future[int | None], whole: bool, reset_running: bool
    ) -> None:
        core = self.core
        try:
            now = max(self.clock.now(), core.time)
            cleared, result = core.reset_prefix_cache(now, whole=whole, reset_running=reset_running)
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
        # How far behind the loop may fall before it resynchronises: with merged passes, as
        # far as that many passes (the lag they are there to catch up).
        max_lag = self.max_lag_s
        while True:
            latest_arrival, transfers_due = self._drain_inbox()
            if transfers_due:
                # A deadline passed on the wall clock: apply it now, pass or no pass.
                self._observe(core.advance_transfers(max(clock.now(), core.time)))
                self._timer.rearm(force=True)
            if not core.has_unfinished_requests() or self.sleep.frozen:
                prev_end = None
                await self._idle()
                continue
            now = clock.now()
            if prev_end is None or now - prev_end >= max_lag:
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
            self._timer.rearm()
            if self._held and result.end > clock.now():
                self._flush()  # caught up: what the passes before made goes out now
            await clock.sleep_until(result.end)
            prev_end = result.end
            if self.max_merged_passes > 1:
                max_lag = max(self.max_lag_s, self.max_merged_passes * (result.end - result.start))
                # Woken well after the pass ended: the next one may be due already.
                behind = clock.now() - result.end >= BEHIND_SHARE * (result.end - result.start)
                if behind or self._held:
                    self._hold(result)
                    if not behind or self._held_passes >= self.max_merged_passes:
                        self._flush()
                    continue
            deliver(self._streams, result, self._deliver_loop)
            if self.on_step is not None:
                self.on_step(result)

    def _hold(self, result: StepResult) -> None:
        """A pass whose tokens wait to go out with the next passes': observed now, its
        outputs kept per stream (as `deliver`, those of streams already ended are dropped:
        no client sees them, so no observer counts them)."""
        held, streams = self._held, self._streams
        kept: list[RequestOutput] = []
        for out in result.outputs:
            stream = streams.get(out.request_id)
            if stream is None or stream.finished:
                continue
            kept.append(out)
            outs = held.get(stream)
            if outs is None:
                held[stream] = [out]
            else:
                outs.append(out)
        result.outputs = kept
        self._held_passes += 1
        if self.on_step is not None:
            self.on_step(result)

    def _flush(self) -> None:
        """Hand the held outputs out, one per stream. A stream that ended meanwhile (an
        abort, a stop string) gets nothing more, as vLLM drops a finished request's late
        deltas; the passes were observed when they ended, so their tokens stay counted."""
        held, self._held = self._held, {}
        self._held_passes = 0
        streams = self._streams
        for stream, outs in held.items():
            if stream.finished:
                continue  # (its FinishEarly, still in the inbox, retires the id)
            last = outs[-1]
            stream.put(last if len(outs) == 1 else merged(outs))
            # The id is free once its final output is out. Not on `stream.finished`: the
            # consumer may end the stream while it takes the output (a stop string), and
            # the request is then still in the core until its FinishEarly is applied.
            if last.finished and streams.get(stream.request_id) is stream:
                del streams[stream.request_id]

    def _release_remotes(self) -> None:
        """A dying engine tells its prefill engines to free the KV its requests wanted (in
        the core or still in the inbox), rather than leave it held until the leases end."""
        if self.core.pulls is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing can be sent
            for remote in self._wanted_remotes():
                self.release_remote(remote)

    async def _idle(self) -> None:
        """Sleep until a request, an abort or the transfer timer wakes the loop."""
        self._wake.clear()
        if self._held:
            self._flush()  # (after the clear: a stop it causes posts and wakes the loop)
        self._timer.rearm()
        await self._wake.wait()

    def _observe(self, result: StepResult) -> None:
        """A result without a pass: news only if it carries transfers, events or counts."""
        self._timer.rearm()
        if self.on_step is not None and result.newsworthy:
            self.on_step(result)

    def _die(self, error: BaseException) -> None:
        if self.dead_error is None:
            self.dead_error = error
            self._release_remotes()
        self._timer.cancel()  # nothing left to wake
        streams, self._streams = self._streams, {}
        for message in self._inbox:
            if isinstance(message, ResetPrefixCache) and not message.done.done():
                message.done.set_exception(EngineDeadError(f"engine is dead: {error}"))
            elif isinstance(message, ReleaseHold) and not message.done.done():
                message.done.set_result(False)
        self._inbox.clear()
        self._asleep.clear()
        self._inbox_requests = self._inbox_tokens = 0
        self._held, self._held_passes = {}, 0  # their streams fail below
        failure = (
            error
            if isinstance(error, EngineDeadError)
            else EngineDeadError(f"engine loop failed: {error!r}")
        )
        for stream in streams.values():
            stream.fail(failure)
