"""Output streams: one per request, merged until read with `get()` or pushed to a listener."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from mocker.compiled import cpass as _cpass
from mocker.compiled import use_compiled
from mocker.engine.outputs import RequestOutput, StepResult

__all__ = [
    "ConsumerError",
    "EngineDeadError",
    "OutputListener",
    "RequestStream",
    "StreamError",
    "TokenSink",
    "deliver",
    "deliver_loop",
    "merged",
]

logger = logging.getLogger(__name__)


class StreamError(RuntimeError):
    """What ends a stream early in place of its outputs; `status` and `client_message` are
    what its client is answered."""

    status = 503

    @property
    def client_message(self) -> str:
        return f"The engine failed: {self}"


class EngineDeadError(StreamError):
    """The engine loop failed; no request can make progress."""


class ConsumerError(StreamError):
    """The consumer of a request's outputs (the server's own renderer) raised on one: the
    request is aborted and the consumer is handed this instead (a server bug: a 500)."""

    status = 500

    @property
    def client_message(self) -> str:
        return "The server failed to write this response (an internal error)."


# Called on the engine loop with each output, or with the error that ends the stream early.
OutputListener = Callable[[RequestOutput | StreamError], None]
# Told when a stream's consumer failed before the request's last output (the owner aborts it).
FailureHook = Callable[["RequestStream"], None]


def merged(outputs: Sequence[RequestOutput]) -> RequestOutput:
    """Consecutive outputs of one request as one, as vLLM's RequestOutputCollector merges a
    stream's deltas while its consumer lags: all their tokens, the last one's time and end,
    the first one's first-token mark and latency."""
    first, last = outputs[0], outputs[-1]
    return RequestOutput(
        last.request_id,
        [t for out in outputs for t in out.new_token_ids],
        last.time,
        last.finished,
        last.finish_reason,
        last.num_prompt_tokens,
        last.num_cached_tokens,
        last.tier_hits,
        first.first_token,
        first.latency,  # of the first token merged
        last.kv_transfer_params,  # (P/D: where the final output's KV waits)
    )


# A consumer's taker of plain tokens (mocker.api._ctext's Sink): called by `deliver` with the
# token of a one-token output that ends nothing, True when it took it (the listener is then
# not called for that output), False having done nothing.
TokenSink = Callable[[int], bool]


class RequestStream:
    """One request's outputs: merged until its consumer reads them with `get()`, or pushed to a
    listener the moment the engine loop produces them (no task wake-up per output). A
    listener may also set `sink` (TokenSink) for the outputs it would only write out."""

    __slots__ = (
        "_error",
        "_event",
        "_listener",
        "_on_failure",
        "_pending",
        "finished",
        "request_id",
        "sink",
    )

    def __init__(self, request_id: str, on_failure: FailureHook | None = None) -> None:
        """`on_failure`: told when the listener raised on an output before the last one."""
        self.request_id = request_id
        self._on_failure = on_failure
        self._pending: RequestOutput | None = None
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self._listener: OutputListener | None = None
        self.sink: TokenSink | None = None
        self.finished = False

    def listen(self, listener: OutputListener) -> None:
        """Push every output (or the engine's death) to `listener`, called on the engine loop;
        what arrived before is handed over at once."""
        self._listener = listener
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                listener(pending)
            except Exception:
                self._listener_failed(listener, pending.finished)
                return
        if self._error is not None:
            self._tell(listener, EngineDeadError(str(self._error)))

    def put(self, out: RequestOutput) -> None:
        if self.finished:
            return  # e.g. the last pass's output of a request aborted meanwhile
        self.finished = out.finished
        listener = self._listener
        if listener is not None:
            try:
                listener(out)
            except Exception:  # a consumer bug must not take the engine loop down with it
                self._listener_failed(listener, out.finished)
            if self.finished:
                self._listener = self.sink = None  # nothing follows: let go of the consumer
            return
        self._merge(out)

    def _listener_failed(self, listener: OutputListener, last: bool) -> None:
        """The listener raised on an output (called while that is handled): the stream ends,
        the consumer is told once (so that its client gets an answer rather than a hang)
        and, unless that output was the request's last, the owner aborts the request."""
        logger.exception("output listener of request %s failed", self.request_id)
        self.finished = True
        self._listener = self.sink = None
        self._tell(listener, ConsumerError(f"output listener of {self.request_id} failed"))
        if not last and self._on_failure is not None:
            self._on_failure(self)

    def _tell(self, listener: OutputListener, error: StreamError) -> None:
        """Hand the listener the error that ends its stream; a failure there is logged."""
        try:
            listener(error)
        except Exception:
            logger.exception("output listener of request %s failed on %r", self.request_id,
                             error)  # fmt: skip

    def _merge(self, out: RequestOutput) -> None:
        """Keep `out` for `get()`, merged with what is already waiting there."""
        pending = self._pending
        if pending is None:
            self._pending = out
        else:
            # The consumer fell behind: merge into a new object (the engine's outputs may
            # also be held by step observers, so they are never mutated).
            self._pending = merged((pending, out))
        self._event.set()

    def fail(self, error: BaseException) -> None:
        if self.finished and self._pending is None and self._error is None:
            return  # already fully delivered
        self._error = error
        self.finished = True
        self.sink = None
        listener, self._listener = self._listener, None
        if listener is not None:
            self._tell(listener, EngineDeadError(str(error)))
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


# The compiled hand-out loop: deliver(streams, outputs, hand) -> the kept outputs, or None
# when every one was kept.
DeliverLoop = Callable[
    [dict[str, RequestStream], list[RequestOutput], Callable[..., None]], list[RequestOutput] | None
]


def deliver(
    streams: dict[str, RequestStream], result: StepResult, loop: DeliverLoop | None = None
) -> None:
    """Hand each stream its tokens from a pass; a stream's last output retires its id.
    Outputs of requests that ended during the pass (abort, stop string) are dropped from
    the result too, as vLLM's output processor drops them: no client saw those tokens, so
    no observer counts them. A one-token output that ends nothing goes to the stream's sink
    when it has one (and the sink takes it), every other one to `_put_open`. `loop`: the
    compiled one (`deliver_loop`), which does the same in C; this one is the reference."""
    outputs = result.outputs
    if loop is not None:
        kept = loop(streams, outputs, _put_open)
    else:
        kept = None
        for i, out in enumerate(outputs):
            stream = streams.get(out.request_id)
            if stream is None or stream.finished:
                if kept is None:
                    kept = outputs[:i]
                continue
            sink = stream.sink
            ids = out.new_token_ids
            if sink is None or out.finished or len(ids) != 1 or not sink(ids[0]):
                _put_open(streams, stream, out)
            if kept is not None:
                kept.append(out)
    if kept is not None:
        result.outputs = kept


def _put_open(streams: dict[str, RequestStream], stream: RequestStream, out: RequestOutput) -> None:
    """RequestStream.put, inlined, for an open stream (`deliver`)."""
    finished = stream.finished = out.finished
    listener = stream._listener
    if listener is None:
        stream._merge(out)
    else:
        try:
            listener(out)
        except Exception:  # a consumer bug must not take the engine loop down with it
            stream._listener_failed(listener, finished)
    if finished:
        # Its last output: the stream lets go of its consumer (the renderer holds the
        # stream, the stream its listener: a reference cycle left to the cyclic GC).
        stream._listener = stream.sink = None
        del streams[out.request_id]


def deliver_loop(compiled: bool | None = None) -> DeliverLoop | None:
    """The compiled hand-out loop (mocker/engine/_cpass.c), or None for `deliver`'s own (not
    built, MOCKER_COMPILED=0, or `compiled=False`)."""
    if not use_compiled("mocker.engine._cpass", compiled):
        return None
    return _cpass.deliver
