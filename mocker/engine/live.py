"""The live driver: an asyncio task that steps the core on the wall clock and streams outputs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from mocker.disagg.params import RemotePrefill
from mocker.engine.inbox import (
    AddRequest,
    ExtendHolds,
    FinishEarly,
    PreloadLora,
    PullAnswered,
    ReleaseHold,
    ResetPrefixCache,
)
from mocker.engine.intake import request_id_in_use
from mocker.engine.live_loop import LiveLoop
from mocker.engine.outputs import RequestOutput
from mocker.engine.stream import EngineDeadError, RequestStream
from mocker.request import EngineRequest, FinishReason, RequestStatus

__all__ = ["EngineDeadError", "LiveEngine", "RequestStream"]

logger = logging.getLogger(__name__)


class LiveEngine(LiveLoop):
    """Runs EngineCore in one asyncio task; the only writer of engine state.

    Callers put requests and aborts into an inbox and wake the loop. The loop
    steps the core, sleeps until the pass's absolute end, then hands each
    request its new tokens. Consecutive passes chain deadline to deadline, so
    sleep overshoot does not drift the simulated clock (unless the loop falls
    more than `max_lag_s` behind, when it resynchronises to the wall clock; with merged
    passes, more than that many passes).

    With `max_merged_passes` > 1, a loop that wakes BEHIND_SHARE (mocker.engine.live_loop)
    of a pass or more after its pass ended (the process cannot keep up with the modelled
    passes) runs the passes that are due at once and hands their tokens out together, one
    output per stream, up to that many passes: the engine's timeline keeps its modelled pace,
    as vLLM's engine core does in its own process while a lagging API server merges a
    stream's deltas (RequestOutputCollector). Each pass is observed (metrics, KV events) when
    it ends.

    With tiers, a transfer timer (mocker.engine.transfer_timer) sleeps until the KV
    stack's next deadline and posts to the inbox; the loop then applies what is due.
    Only the loop changes block and tier state.
    """

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

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            self._die(EngineDeadError("engine loop cancelled"))
            raise
        except Exception as exc:
            logger.exception("engine loop failed; marking the engine dead")
            self._die(exc)

    def _release_remotes(self) -> None:
        """A dying engine tells its prefill engines to free the KV its requests wanted (in
        the core or still in the inbox), rather than leave it held until the leases end."""
        if self.core.pulls is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing can be sent
            for remote in self._wanted_remotes():
                self.release_remote(remote)

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
