"""Completions and chat: request → engine requests → streamed chunks or one JSON response."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from mocker.api.chunks import DONE, ChunkWriter, error_event, usage_dict
from mocker.api.errors import OpenAIError, error_response
from mocker.api.faults import FaultInjector, JitteredEmitter, failure_error
from mocker.faults import FaultType
from mocker.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from mocker.api.responses import DeferredResponse, Emitter, EventStreamResponse
from mocker.config import EngineConfig
from mocker.engine.core import RequestRejected
from mocker.engine.group import EngineGroup, RankError
from mocker.engine.live import EngineDeadError, LiveEngine, RequestStream
from mocker.engine.outputs import RequestOutput
from mocker.request import EngineRequest, FinishReason, SamplingParams
from mocker.settings import ServerSettings
from mocker.tokenizer import ChatTemplateError, TextTokenizer

__all__ = ["OpenAIServing", "RequestHeaders", "pinned_rank"]

logger = logging.getLogger("mocker.requests")

_ABORTED = "The request was aborted mid-stream (injected fault)."


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    """What a generation request's headers say beyond its body."""

    request_id: str | None = None  # X-Request-Id
    rank: str | None = None  # X-data-parallel-rank, as sent
    fault: str | None = None  # X-Mocker-Fail


def pinned_rank(field: int | None, header: str | None) -> int | None:
    """The data-parallel rank a request pins: its `data_parallel_rank` field or vLLM's
    X-data-parallel-rank header (they must agree when both are given). As vLLM, a header
    that is not an integer is ignored: the request is load-balanced."""
    rank = None
    if header is not None:
        try:
            rank = int(header)
        except ValueError:
            rank = None
    if field is not None:
        if rank is not None and rank != field:
            raise OpenAIError(
                400,
                f"data_parallel_rank {field} and X-data-parallel-rank {rank} disagree.",
                "data_parallel_rank",
            )
        rank = field
    return rank


@dataclass(slots=True)
class _Job:
    """One engine request of an HTTP request (one choice), and what it has produced so far."""

    index: int
    request_id: str
    engine: LiveEngine  # the data-parallel rank it runs on
    stream: RequestStream
    num_prompt_tokens: int
    # An injected `abort`: the response breaks off once this many tokens are out (or at
    # the finish, if that comes first).
    abort_at: int | None = None
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    completion_tokens: int = 0
    cached_tokens: int = 0
    text: str = ""  # generated text so far (kept only when stop strings are in play)
    sent: int = 0  # characters of `text` already handed out
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    done: bool = False


class OpenAIServing:
    """Turns validated OpenAI requests into engine requests and their outputs into responses."""

    def __init__(
        self,
        engines: EngineGroup,
        tokenizer: TextTokenizer,
        settings: ServerSettings,
        config: EngineConfig,
        faults: FaultInjector,
    ) -> None:
        self.engines = engines
        self.faults = faults
        self.open_responses = 0  # generation responses not yet ended
        self.tokenizer = tokenizer
        self.settings = settings
        self.config = config
        self._escaped = tokenizer.escaped_piece

    # -- shared checks ------------------------------------------------------------------------

    def check_model(self, model: str | None) -> str:
        """The served name to answer with; 404 for a model this server does not serve."""
        names = self.settings.served_model_names
        if model is None or model == "":
            return names[0]
        if model not in names and model != self.settings.model:
            raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")
        return model if model in names else names[0]

    def check_token_ids(self, ids: Sequence[int], param: str) -> None:
        vocab = self.tokenizer.vocab_size
        for t in ids:
            if not 0 <= t < vocab:
                raise OpenAIError(
                    400, f"Token id {t} is out of vocabulary (vocab size {vocab}).", param=param
                )

    def _check_common(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        if body.n != 1:
            raise OpenAIError(400, "n > 1 is not supported: request one choice (n = 1).", "n")
        if self.engines.is_dead:
            raise OpenAIError(503, f"The engine is not running: {self.engines.dead_error}")

    def _inject(self, forced: str | None, param: str) -> FaultType | None:
        """This request's injected fault: raised here, or `abort` (counted when it cuts)."""
        fault = self.faults.choose(forced)
        if fault is None or fault is FaultType.ABORT:
            return fault
        self.faults.record(fault)
        raise failure_error(fault, self.config.max_model_len, param)

    def _engine_for(self, rank: int | None) -> LiveEngine:
        """The rank a new engine request goes to; 503 while its queue is full."""
        engine = self.engines.pick(rank)
        limit = self.settings.max_num_queued_reqs
        if limit is not None and engine.num_waiting >= limit:
            raise OpenAIError(
                503,
                f"The server is overloaded: {engine.num_waiting} requests are waiting "
                f"(--max-num-queued-reqs {limit}). Retry later.",
            )
        return engine

    def _sampling(
        self,
        body: CompletionRequest | ChatCompletionRequest,
        max_tokens: int | None,
        num_prompt_tokens: int,
    ) -> SamplingParams:
        max_len = self.config.max_model_len
        if num_prompt_tokens >= max_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, your "
                f"prompt contains {num_prompt_tokens} input tokens, leaving no room for the "
                "completion. Please reduce the length of the prompt.",
                param="prompt" if isinstance(body, CompletionRequest) else "messages",
            )
        if max_tokens is not None and body.min_tokens > max_tokens:
            raise OpenAIError(
                400,
                f"min_tokens ({body.min_tokens}) must be less than or equal to max_tokens "
                f"({max_tokens}).",
                param="min_tokens",
            )
        room = max_len - num_prompt_tokens
        limit = room if max_tokens is None else min(max_tokens, room)
        return SamplingParams(
            max_tokens=limit,
            min_tokens=min(body.min_tokens, limit),
            ignore_eos=body.ignore_eos,
            stop_token_ids=tuple(body.stop_token_ids or ()),
        )

    def _start(
        self,
        body: CompletionRequest | ChatCompletionRequest,
        prompts: list[list[int]],
        max_tokens: int | None,
        request_id: str,
        headers: RequestHeaders,
        param: str,
    ) -> list[_Job]:
        """Check every prompt, draw the request's fault (a client mistake is reported as such,
        never masked by one), then hand every prompt to an engine; all or nothing."""
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        stop = tuple(s for s in stop if s)
        rank = pinned_rank(body.data_parallel_rank, headers.rank)
        try:
            self.engines.check_rank(rank)
        except RankError as exc:
            raise OpenAIError(400, str(exc), "data_parallel_rank") from None
        specs: list[EngineRequest] = []
        for i, prompt in enumerate(prompts):
            spec = EngineRequest(
                request_id if len(prompts) == 1 else f"{request_id}-{i}",
                prompt,
                self._sampling(body, max_tokens, len(prompt)),
                priority=body.priority,
                cache_salt=body.cache_salt,
            )
            try:
                self.engines.check_request(spec)
            except RequestRejected as exc:
                raise OpenAIError(400, str(exc)) from None
            specs.append(spec)
        fault = self._inject(headers.fault, param)
        jobs: list[_Job] = []
        try:
            for i, spec in enumerate(specs):
                engine = self._engine_for(rank)
                stream = engine.add_request(spec)
                sampling = spec.sampling
                jobs.append(
                    _Job(
                        i,
                        spec.request_id,
                        engine,
                        stream,
                        len(spec.prompt_token_ids),
                        max(1, sampling.max_tokens // 2) if fault is FaultType.ABORT else None,
                        stop,
                        body.include_stop_str_in_output,
                        frozenset(sampling.stop_token_ids),
                    )
                )
                if self.settings.log_requests:
                    logger.info(
                        "request %s: %d prompt tokens, max_tokens %s, stream %s",
                        spec.request_id,
                        len(spec.prompt_token_ids),
                        sampling.max_tokens,
                        bool(body.stream),
                    )
        except BaseException as exc:
            for job in jobs:
                job.engine.abort(job.request_id, job.stream)
            if isinstance(exc, RequestRejected):
                raise OpenAIError(400, str(exc)) from None
            if isinstance(exc, EngineDeadError):
                raise OpenAIError(503, f"The engine is not running: {exc}") from None
            raise
        return jobs

    # -- endpoints ----------------------------------------------------------------------------

    def completions(
        self, body: CompletionRequest, headers: RequestHeaders = RequestHeaders()
    ) -> Response:
        model = self.check_model(body.model)
        self._check_common(body)
        if body.best_of not in (None, 1):
            raise OpenAIError(400, "best_of > 1 is not supported.", "best_of")
        if body.echo:
            raise OpenAIError(400, "echo is not supported by this server.", "echo")
        if body.suffix:
            raise OpenAIError(400, "suffix is not supported by this server.", "suffix")
        if body.logprobs is not None:
            raise OpenAIError(
                400, "logprobs are not supported by this mock server; omit 'logprobs'.",
                "logprobs",
            )  # fmt: skip
        prompts = self._completion_prompts(body.prompt)
        rid = headers.request_id or uuid.uuid4().hex
        jobs = self._start(body, prompts, body.max_tokens, rid, headers, "prompt")
        return self._respond(body, jobs, model, f"cmpl-{rid}", chat=False, request_id=rid)

    def chat(
        self, body: ChatCompletionRequest, headers: RequestHeaders = RequestHeaders()
    ) -> Response:
        model = self.check_model(body.model)
        self._check_common(body)
        if body.logprobs or body.top_logprobs:
            raise OpenAIError(
                400, "logprobs are not supported by this mock server; omit 'logprobs'.",
                "logprobs",
            )  # fmt: skip
        messages = [self.message_dict(m, i) for i, m in enumerate(body.messages)]
        try:
            prompt = self.tokenizer.encode_chat(
                messages,
                add_generation_prompt=body.add_generation_prompt
                and not body.continue_final_message,
                template_kwargs=body.chat_template_kwargs,
            )
        except ChatTemplateError as exc:
            raise OpenAIError(400, str(exc), "messages") from None
        if not prompt:
            raise OpenAIError(400, "The messages render to an empty prompt.", "messages")
        max_tokens = body.max_completion_tokens or body.max_tokens
        rid = headers.request_id or uuid.uuid4().hex
        jobs = self._start(body, [prompt], max_tokens, rid, headers, "messages")
        return self._respond(body, jobs, model, f"chatcmpl-{rid}", chat=True, request_id=rid)

    def _completion_prompts(self, prompt: Any) -> list[list[int]]:
        if isinstance(prompt, str):
            prompt = [prompt]
        if not prompt:
            raise OpenAIError(400, "The prompt must not be empty.", "prompt")
        if isinstance(prompt[0], int):
            prompt = [prompt]
        out: list[list[int]] = []
        for p in prompt:
            if isinstance(p, str):
                if not p:
                    raise OpenAIError(400, "The prompt must not be empty.", "prompt")
                ids = self.tokenizer.encode(p)
                if not ids:
                    raise OpenAIError(400, "The prompt encodes to no tokens.", "prompt")
            else:
                ids = list(p)  # token ids are used exactly as sent (no BOS added)
                self.check_token_ids(ids, "prompt")
            out.append(ids)
        return out

    @staticmethod
    def message_dict(message: ChatMessage, i: int) -> dict[str, Any]:
        content = message.content
        if isinstance(content, list):
            texts: list[str] = []
            for part in content:
                if part.type not in ("text", "input_text") or part.text is None:
                    raise OpenAIError(
                        400,
                        f"messages[{i}]: content part type {part.type!r} is not supported "
                        "(text parts only).",
                        "messages",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        out = dict(message.model_extra or {})
        out.update(role=message.role, content=content or "")
        if message.name is not None:
            out["name"] = message.name
        return out

    # -- responses ----------------------------------------------------------------------------

    def _respond(
        self,
        body: CompletionRequest | ChatCompletionRequest,
        jobs: list[_Job],
        model: str,
        response_id: str,
        *,
        chat: bool,
        request_id: str,
    ) -> Response:
        created = int(time.time())
        state = {"disconnected": False}
        arrived = asyncio.get_running_loop().time()
        gone = asyncio.Event()  # the client left: a held (jittered) response stops waiting
        # Until the response ends (a drain waits for it: output held back by jitter can
        # outlive the engine request).
        self.open_responses += 1

        def on_disconnect() -> None:
            # Called when the client leaves, and again when the response ends either way.
            if not state["disconnected"]:
                self.open_responses -= 1
            state["disconnected"] = True
            gone.set()
            for job in jobs:
                job.engine.abort(job.request_id, job.stream)

        headers = {"x-request-id": request_id}
        if not body.stream:
            return DeferredResponse(
                lambda: self._full_response(
                    jobs, model, response_id, created, chat, headers, arrived, gone
                ),
                on_disconnect,
            )
        opts = body.stream_options
        writer = ChunkWriter(
            chat=chat,
            response_id=response_id,
            created=created,
            model=model,
            include_usage=bool(opts and opts.include_usage),
            continuous_usage=bool(opts and opts.continuous_usage_stats),
        )

        def start(emitter: Emitter) -> None:
            if self.faults.config.has_jitter:
                self._push(jobs, writer, JitteredEmitter(emitter, self.faults, arrived), state)
            else:
                self._push(jobs, writer, emitter, state)

        return EventStreamResponse(start, on_disconnect, headers)

    def _push(
        self,
        jobs: list[_Job],
        writer: ChunkWriter,
        emitter: Emitter | JitteredEmitter,
        state: dict[str, bool],
    ) -> None:
        """Attach each job's stream to the emitter: from now on the engine loop writes every
        pass's tokens straight to the socket — bytes joined from pre-escaped pieces, one
        write per pass per request, no task switch."""
        escaped = self._escaped
        open_jobs = [len(jobs)]

        def listener_for(job: _Job) -> Callable[[RequestOutput | EngineDeadError], None]:
            plain = not job.stop
            first = [writer.role(job.index) if writer.chat else b""]

            def on_output(out: RequestOutput | EngineDeadError) -> None:
                if job.done or emitter.closed.done():
                    return  # after a stop string matched, or the response has ended
                if isinstance(out, EngineDeadError):
                    job.done = True
                    emitter.emit(error_event(503, f"The engine failed: {out}") + DONE, last=True)
                    return
                if out.finish_reason is FinishReason.ABORT and not out.new_token_ids:
                    job.done = True
                    if state["disconnected"]:
                        emitter.close()
                    else:  # aborted by the server (shutdown), not by the client
                        emitter.emit(error_event(503, "The request was aborted.") + DONE, last=True)
                    return
                if plain:
                    self._account(job, out)
                    text = b"".join([escaped(t) for t in out.new_token_ids])
                else:
                    text = orjson.dumps(self._feed(job, out))[1:-1]
                if job.abort_at is not None and (job.done or job.completion_tokens >= job.abort_at):
                    # Injected abort: what came so far (no finish reason), then the error.
                    chunk = first[0] + writer.text(job.index, text) if text else first[0]
                    self._cut(jobs)
                    payload = chunk + error_event(500, _ABORTED) + DONE
                    if isinstance(emitter, JitteredEmitter):  # counted if it reaches the client
                        emitter.emit(payload, last=True, on_sent=self._record_abort)
                    elif not emitter.closed.done():
                        emitter.emit(payload, last=True)
                        self._record_abort()
                    return
                chunk = first[0] + writer.text(
                    job.index,
                    text,
                    job.finish_reason,
                    job.stop_reason,
                    (job.num_prompt_tokens, job.completion_tokens, job.cached_tokens),
                )
                first[0] = b""
                if not job.done:
                    emitter.emit(chunk)
                    return
                open_jobs[0] -= 1
                if open_jobs[0]:
                    emitter.emit(chunk)
                    return
                if writer.include_usage:
                    chunk += writer.usage(*self._totals(jobs))
                emitter.emit(chunk + DONE, last=True)

            return on_output

        for job in jobs:
            job.stream.listen(listener_for(job))

    async def _full_response(
        self,
        jobs: list[_Job],
        model: str,
        response_id: str,
        created: int,
        chat: bool,
        headers: dict[str, str],
        arrived: float,
        gone: asyncio.Event,
    ) -> Response:
        loop = asyncio.get_running_loop()
        texts: list[list[str]] = [[] for _ in jobs]
        done: asyncio.Future[Response | None] = loop.create_future()
        remaining = [len(jobs)]
        cut = [False]  # an injected abort ended it

        def listener_for(job: _Job) -> Callable[[RequestOutput | EngineDeadError], None]:
            def on_output(out: RequestOutput | EngineDeadError) -> None:
                if job.done or done.done():
                    return
                if isinstance(out, EngineDeadError):
                    done.set_result(error_response(503, f"The engine failed: {out}"))
                    return
                if out.finish_reason is FinishReason.ABORT and not out.new_token_ids:
                    done.set_result(error_response(503, "The request was aborted."))
                    return
                texts[job.index].append(self._feed(job, out))
                if job.abort_at is not None and (job.done or job.completion_tokens >= job.abort_at):
                    self._cut(jobs)  # an injected abort: the response is the error
                    cut[0] = True
                    done.set_result(error_response(500, _ABORTED))
                    return
                if job.done:
                    remaining[0] -= 1
                    if not remaining[0]:
                        done.set_result(None)

            return on_output

        for job in jobs:
            job.stream.listen(listener_for(job))
        failure = await done
        # Jitter: the whole response is held back by up to ttft_jitter × its latency.
        share = self.faults.jitter(self.faults.config.ttft_jitter)
        await self.faults.hold(share * (loop.time() - arrived), gone)
        if cut[0] and not gone.is_set():
            self._record_abort()  # it reaches the client
        if failure is not None:
            return failure
        choices: list[dict[str, Any]] = []
        for job in jobs:
            text = "".join(texts[job.index])
            if chat:
                choices.append(
                    {
                        "index": job.index,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "tool_calls": [],
                            "reasoning_content": None,
                        },
                        "logprobs": None,
                        "finish_reason": job.finish_reason,
                        "stop_reason": job.stop_reason,
                    }
                )
            else:
                choices.append(
                    {
                        "index": job.index,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": job.finish_reason,
                        "stop_reason": job.stop_reason,
                        "prompt_logprobs": None,
                    }
                )
        body = {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
            "usage": usage_dict(*self._totals(jobs)),
            "system_fingerprint": None,
        }
        return Response(orjson.dumps(body), media_type="application/json", headers=headers)

    # -- per-output bookkeeping ---------------------------------------------------------------

    def _record_abort(self) -> None:
        self.faults.record(FaultType.ABORT)

    @staticmethod
    def _cut(jobs: list[_Job]) -> None:
        """End every job of a response now (an injected abort): the engine frees them."""
        for job in jobs:
            job.done = True  # their listeners ignore the abort outputs that follow
            job.engine.abort(job.request_id, job.stream)

    @staticmethod
    def _totals(jobs: list[_Job]) -> tuple[int, int, int]:
        return (
            sum(j.num_prompt_tokens for j in jobs),
            sum(j.completion_tokens for j in jobs),
            sum(j.cached_tokens for j in jobs),
        )

    def _account(self, job: _Job, out: RequestOutput) -> None:
        """Token counts and finish state from one engine output (no text work)."""
        ids = out.new_token_ids
        job.completion_tokens += len(ids)
        job.cached_tokens = out.num_cached_tokens
        if out.finished:
            job.done = True
            reason = out.finish_reason
            job.finish_reason = reason.value if reason is not None else None
            if reason is FinishReason.STOP and ids and ids[-1] in job.stop_token_ids:
                job.stop_reason = ids[-1]

    def _feed(self, job: _Job, out: RequestOutput) -> str:
        """New text to hand out for this output, honouring stop strings."""
        self._account(job, out)
        piece = self.tokenizer.piece
        new = "".join([piece(t) for t in out.new_token_ids])
        if not job.stop:
            return new
        start = max(0, len(job.text) - max(len(s) for s in job.stop) + 1)
        job.text += new
        hit: tuple[int, str] | None = None
        for s in job.stop:
            pos = job.text.find(s, start)
            if pos >= 0 and (hit is None or pos < hit[0]):
                hit = (pos, s)
        if hit is not None:
            pos, s = hit
            job.text = job.text[: pos + len(s)] if job.include_stop else job.text[:pos]
            if not job.done:
                job.done = True
                job.engine.stop_request(job.request_id, job.stream)
            job.finish_reason, job.stop_reason = "stop", s
            emit_to = len(job.text)
        elif job.done:
            emit_to = len(job.text)
        else:
            # Hold back what could be the start of a stop string until it is decided.
            emit_to = max(job.sent, len(job.text) - max(len(s) for s in job.stop) + 1)
        text, job.sent = job.text[job.sent : emit_to], emit_to
        return text
