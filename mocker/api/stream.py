"""The streaming renderer: engine outputs become SSE chunks, written from the engine loop."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import orjson

from mocker.api.choice import Choice, cancel_all, totals
from mocker.api.chunks import (
    ChunkWriter,
    GenerateChunkWriter,
    with_kv_transfer_params,
)
from mocker.api.faults import JitteredEmitter
from mocker.api.lifecycle import OpenResponse
from mocker.api.logprobs import merged
from mocker.api.responses import Emitter
from mocker.api.responses_api import ResponsesStreamWriter
from mocker.api.text_table import SinkFactory
from mocker.engine.outputs import RequestOutput
from mocker.engine.stream import OutputListener, StreamError
from mocker.request import FinishReason

__all__ = ["ABORTED", "StreamRenderer"]

ABORTED = "The request was aborted mid-stream (injected fault)."

# The ids a plain text chunk carries to `_hold`: none (read only: nothing is added to it).
_NO_IDS: list[int] = []


class StreamRenderer:
    """Writes one streamed response. From `attach` on, the engine loop hands each choice's
    outputs to `on_output`, which writes them to the socket at once: bytes joined from
    pre-escaped pieces, one write per pass per choice, no task switch."""

    __slots__ = (
        "_echo_due",
        "_emitter",
        "_escaped",
        "_first",
        "_framed",
        "_heads",
        "_held",
        "_interval",
        "_known",
        "_num_open",
        "_only",
        "_open_tail",
        "_piece",
        "_prompt_due",
        "_record_abort",
        "_response",
        "_sent",
        "_sinks",
        "_text",
        "_writer",
    )

    def __init__(
        self,
        response: OpenResponse,
        writer: ChunkWriter | GenerateChunkWriter | ResponsesStreamWriter,
        *,
        escaped: Callable[[int], bytes],
        known: Mapping[int, bytes],
        piece: Callable[[int], str],
        record_abort: Callable[[], None],
        stream_interval: int = 1,
        framed: Callable[[int, bytes, bytes], bytes | None] | None = None,
        sinks: SinkFactory | None = None,
    ) -> None:
        """`stream_interval`: vLLM's --stream-interval, tokens a choice's chunk waits for
        (its first and last chunks go at once). `framed`: a text table's (text_table.py),
        which frames a plain one-token chunk for the socket in one go; None: joined here.
        `sinks`: the same table's sink maker (text_table.sinks), for a response whose plain
        tokens may go from the engine loop's hand-out straight to the socket."""
        self._response = response
        self._writer = writer
        self._escaped = escaped
        self._known = known  # what `escaped` has answered so far (filled as it answers)
        self._piece = piece
        self._record_abort = record_abort  # an injected abort reached the client
        # What goes before each choice's first chunk: the chat role delta (with the prompt's
        # ids, if asked for); a completion's first chunk carries them on its choice instead.
        choices = response.choices
        self._first = [b""] * len(choices)
        if isinstance(writer, ChunkWriter) and writer.chat:  # a generate stream has no role
            self._first = [writer.role(c.index, c.prompt_token_ids) for c in choices]
        self._text = not isinstance(writer, GenerateChunkWriter)
        self._prompt_due = [not writer.chat and c.prompt_token_ids is not None for c in choices]
        self._echo_due = [c.echo is not None for c in choices]
        self._num_open = len(response.choices)
        # vLLM's stream interval (its output processor's): per choice, the tokens already sent
        # and the text and ids held back since (a chunk goes out once it has `interval`
        # tokens, with the first token, or with the last).
        self._interval = stream_interval
        self._sent = [0] * len(choices)
        self._held: list[tuple[list[bytes], list[int]]] = [([], []) for _ in choices]
        self._emitter: Emitter | JitteredEmitter | None = None
        self._only: Choice  # a response of one choice: that one, set by `attach`
        # The plain case, a text chunk per pass with nothing but new text (no ids, no running
        # usage): each choice's head (its first with the role delta before it) and the tail.
        self._heads: list[bytes] | None = None
        self._open_tail = b""
        if (
            isinstance(writer, ChunkWriter)
            and not writer.with_ids
            and not writer.continuous_usage
            and all(c.logprobs is None and c.echo is None for c in choices)
        ):
            parts = [writer.open_parts(c.index) for c in choices]
            self._heads = [
                first + head for first, (head, _) in zip(self._first, parts, strict=True)
            ]
            self._open_tail = parts[0][1] if parts else b""
        # Framed whole only when each token is a chunk of its own (an interval holds texts).
        self._framed = framed if self._heads is not None and stream_interval == 1 else None
        self._sinks = sinks if self._framed is not None and len(choices) == 1 else None

    def attach(self, emitter: Emitter | JitteredEmitter) -> None:
        self._emitter = emitter
        if self._writer.preamble:  # (what a stream says before any token: /v1/responses')
            emitter.emit(self._writer.preamble)
        choices = self._response.choices
        if len(choices) == 1:  # (the bound method alone: no partial to go through per token)
            self._only = choices[0]
            choices[0].stream.listen(self.on_output)
            return
        for choice in choices:  # (a batch of prompts: a choice each)
            choice.stream.listen(self._listener(choice))

    def _listener(self, choice: Choice) -> OutputListener:
        on_output = self.on_output

        def listener(out: RequestOutput | StreamError) -> None:
            on_output(out, choice)

        return listener

    def on_output(self, out: RequestOutput | StreamError, choice: Choice | None = None) -> None:
        """An output of `choice` (None: the response's only one)."""
        if choice is None:
            choice = self._only
        emitter = self._emitter
        assert emitter is not None
        # (An emitter that offers its direct writer is open: `closed` is asked only without.)
        if choice.done or (emitter.writer is None and emitter.closed.done()):
            return  # after a stop string matched, or the response has ended
        heads = self._heads
        if (
            heads is not None
            and type(out) is RequestOutput
            and not out.finished
            and choice.stops is None
            and choice.abort_at is None
        ):
            # A token chunk that ends nothing (nearly every chunk): no general assembly, and
            # Choice.account inlined (what it does for an output that ends nothing).
            ids = out.new_token_ids
            choice.completion_tokens += len(ids)
            if choice.token_ids is not None:
                choice.token_ids += ids
            remote = choice.remote_cached_tokens
            choice.cached_tokens = out.num_cached_tokens if remote is None else remote
            index = choice.index
            if len(ids) == 1:
                tok = ids[0]
                framed = self._framed
                direct = emitter.writer
                if framed is not None and direct is not None:
                    # The chunk framed from the text table in one go and written as is
                    # (None: a token the table lacks; False: `emit` must take it).
                    chunk = framed(tok, heads[index], self._open_tail)
                    if chunk is not None:
                        try:
                            written = direct.write_framed(chunk)
                        except Exception:  # as in `emit`: the transport closed under us
                            emitter.fail()
                            return
                        if written:
                            if self._first[index]:
                                self._first_sent(index)
                            elif self._sinks is not None:
                                self._attach_sink()
                            return
                # The tokenizer's table first: a call per token costs more than the lookup.
                text = self._known.get(tok) or self._escaped(tok)
            else:
                escaped = self._escaped
                text = b"".join([escaped(t) for t in ids])
            if self._interval > 1:
                held = self._hold(choice, text, _NO_IDS)  # (this chunk carries no ids)
                if held is None:
                    return  # (the chunk waits for more tokens)
                text = held[0]
            chunk = heads[index] + text + self._open_tail
            # Emitter.emit's common case without the call: straight to the transport.
            direct = emitter.writer
            if direct is None:
                emitter.emit(chunk)
            else:
                try:
                    if not direct.write(chunk):
                        emitter.emit(chunk)  # (it says why: a pause, a disconnect)
                except Exception:  # as in `emit`: the transport closed under us
                    emitter.fail()
            if self._first[index]:
                self._first_sent(index)
            return
        if isinstance(out, StreamError):  # the engine died, or this renderer failed
            choice.done = True
            writer = self._writer
            emitter.emit(writer.error(out.status, out.client_message) + writer.done, last=True)
        elif out.finish_reason is FinishReason.ABORT and not out.new_token_ids:
            self._aborted(choice, emitter)
        else:
            self._general(out, choice, emitter)

    def _aborted(self, choice: Choice, emitter: Emitter | JitteredEmitter) -> None:
        """The choice ended by an abort before a token: the client left, or the server did."""
        choice.done = True
        if self._response.disconnected:
            emitter.close()
        else:  # aborted by the server (shutdown), not by the client
            writer = self._writer
            emitter.emit(writer.error(503, "The request was aborted.") + writer.done, last=True)

    def _general(
        self, out: RequestOutput, choice: Choice, emitter: Emitter | JitteredEmitter
    ) -> None:
        """Any other output: stop strings, its end, echo, logprobs, ids, usage, a held or cut
        chunk."""
        if choice.stops is None:
            choice.account(out)
            escaped = self._escaped
            # A generate stream sends ids, not text: no per-token join for it.
            text = b"".join([escaped(t) for t in out.new_token_ids]) if self._text else b""
        else:
            text = orjson.dumps(choice.text_of(out, self._piece))[1:-1]
        ids = out.new_token_ids
        cut = choice.abort_at is not None and choice.abort_due
        if self._interval > 1:
            held = self._hold(choice, text, ids, flush=choice.done or cut)
            if held is None:
                return  # (the chunk waits for more tokens)
            text, ids = held
        index = choice.index
        echoing = choice.echo is not None and self._echo_due[index]
        if echoing:  # (echo: the choice's first chunk starts with its prompt's text)
            text = orjson.dumps(choice.echo)[1:-1] + text
            self._echo_due[index] = False
        if cut:
            self._cut(choice, text, emitter)
            return
        chunk = self._chunk(choice, text, ids, echoing)
        if self._first[index]:
            self._first_sent(index)
        if choice.done:
            self._last(choice, chunk, emitter)
        else:
            emitter.emit(chunk)

    def _chunk(self, choice: Choice, text: bytes, ids: list[int], echoing: bool) -> bytes:
        """The choice's chunk of `text` (and `ids`), with what the request asked to see."""
        writer, index = self._writer, choice.index
        usage = (
            (choice.num_prompt_tokens, choice.completion_tokens, choice.cached_tokens)
            if writer.continuous_usage
            else None
        )
        logprobs = None
        if choice.logprobs is not None:
            taken = choice.logprobs.take(ids)
            if echoing and choice.echo_logprobs is not None:
                taken = merged([choice.echo_logprobs, taken], chat=writer.chat)
            logprobs = orjson.dumps(taken)
        if writer.with_ids:
            prompt = choice.prompt_token_ids if self._prompt_due[index] else None
            self._prompt_due[index] = False
            return self._first[index] + writer.text(
                index, text, choice.finish_reason, choice.stop_reason, usage, ids, prompt,
                logprobs,
            )  # fmt: skip
        return self._first[index] + writer.text(
            index, text, choice.finish_reason, choice.stop_reason, usage, logprobs=logprobs
        )

    def _last(self, choice: Choice, chunk: bytes, emitter: Emitter | JitteredEmitter) -> None:
        """The choice's last chunk; the response's last one carries the usage and [DONE]."""
        # A P/D prefill's last chunk names its KV (a generate stream has no such field, as
        # vLLM's has none).
        if choice.kv_transfer_params is not None and self._text:
            chunk = with_kv_transfer_params(chunk, choice.kv_transfer_params)
        self._num_open -= 1
        if self._num_open:
            emitter.emit(chunk)
            return
        writer = self._writer
        if writer.include_usage:
            chunk += writer.usage(*totals(self._response.choices))
        emitter.emit(chunk + writer.done, last=True)

    def _hold(
        self, choice: Choice, text: bytes, ids: list[int], flush: bool = False
    ) -> tuple[bytes, list[int]] | None:
        """vLLM's stream interval: None while `choice`'s chunk is to wait (this output's text
        and ids held back), else the text and ids of the chunk to send now, what was held
        first. A chunk goes with the choice's first token, once `interval` tokens are unsent,
        or on `flush` (the choice's end; an injected abort's cut)."""
        index = choice.index
        sent = self._sent[index]
        texts, held_ids = self._held[index]
        if not flush and sent and choice.completion_tokens - sent < self._interval:
            texts.append(text)
            held_ids += ids
            return None
        self._sent[index] = choice.completion_tokens
        if not texts:
            return text, ids
        texts.append(text)
        out = b"".join(texts), held_ids + ids
        self._held[index] = ([], [])
        return out

    def _first_sent(self, index: int) -> None:
        """Choice `index`'s first chunk is out: what went before it goes no more."""
        self._first[index] = b""
        writer = self._writer
        if self._heads is not None and isinstance(writer, ChunkWriter):
            self._heads[index] = writer.open_parts(index)[0]

    def _attach_sink(self) -> None:
        """A plain chunk after the first went out by the framed path: from now on the only
        choice's plain tokens (one token, ends nothing) may go from the engine loop's
        hand-out straight to the socket, through a sink that writes what that path writes
        and counts them as it does (the cached tokens it sets are the same for every output
        after the first). Tried once. (The framed path that calls this ran only for a choice
        without stop strings or an injected abort, through the emitter's direct writer: no
        jitter.) Not for a choice that keeps its ids."""
        sinks, self._sinks = self._sinks, None
        choice, emitter = self._only, self._emitter
        direct = None if emitter is None else emitter.writer
        assert sinks is not None and self._heads is not None and direct is not None
        if choice.token_ids is None:
            choice.stream.sink = sinks(
                self._heads[0], self._open_tail, emitter, direct, direct.cycle, choice
            )

    def _cut(self, choice: Choice, text: bytes, emitter: Emitter | JitteredEmitter) -> None:
        """An injected abort: what came so far (no finish reason), then the error."""
        first = self._first[choice.index]
        chunk = first + self._writer.text(choice.index, text) if text else first
        cancel_all(self._response.choices)
        payload = chunk + self._writer.error(500, ABORTED) + self._writer.done
        emitter.emit(payload, last=True, on_sent=self._record_abort)  # counted if it is sent
