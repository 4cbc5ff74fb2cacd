"""The live driver's loop: drain the inbox, step the core, sleep to the pass's end, hand out."""

from __future__ import annotations

import asyncio

from mocker.engine.inbox import (
    AddRequest,
    ExtendHolds,
    FinishEarly,
    PreloadLora,
    PullAnswered,
    ReleaseHold,
    ResetPrefixCache,
    TransfersDue,
)
from mocker.engine.live_state import LiveState
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stream import EngineDeadError, deliver, merged

__all__ = ["LiveLoop"]

# With passes merged: a loop that wakes this share of a pass (or more) after the pass ended
# is behind (timer overshoot is well under it at modelled speed). A smaller share catches a
# lag sooner but merges more often; `bench/serve_stream.py` measures the pace it keeps.
BEHIND_SHARE = 0.25


class LiveLoop(LiveState):
    """The loop of LiveEngine (mocker.engine.live), the only writer of engine state."""

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
        if self.on_step is not None and result.worth_reporting:
            self.on_step(result)
