"""Completions and chat: checked request → engine requests → a streamed or collected response."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.responses import Response

from mocker.api import responses_api
from mocker.api.chat_checks import check_chat, check_response_format
from mocker.api.choice import Choice
from mocker.api.chunks import ChunkWriter, GenerateChunkWriter
from mocker.api.collect import ResponseCollector, ResponseHead
from mocker.api.errors import OpenAIError
from mocker.api.faults import FaultInjector, JitteredEmitter, failure_error
from mocker.api.ids import random_hex
from mocker.api.inputs import chat_prompt, check_model, completion_prompts
from mocker.api.lifecycle import OpenResponse, OpenResponses
from mocker.api.logprobs import (
    LogprobsFormat,
    prompt_logprobs,
    requested_logprobs,
    requested_prompt_logprobs,
)
from mocker.api.lora import LoraAdapters
from mocker.api.prepare import Prepared
from mocker.api.protocol import (
    MAX_CHOICES,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    ResponsesRequest,
    StreamOptions,
)
from mocker.api.render import generate_request
from mocker.api.responses import DeferredResponse, Emitter, EventStreamResponse, json_response
from mocker.api.responses_api import ResponsesStreamWriter
from mocker.api.sampling_checks import check_sampling, check_token_params
from mocker.api.stop_strings import StopMatcher
from mocker.api.stream import StreamRenderer
from mocker.api.text_table import sinks, text_table
from mocker.config import EngineConfig
from mocker.disagg.params import InvalidTransferParams, parse_transfer_params
from mocker.engine.group import EngineGroup, RankError
from mocker.engine.intake import RequestRejected, check_min_tokens, check_prompt_length
from mocker.engine.live import EngineDeadError, LiveEngine
from mocker.faults import FaultType
from mocker.metrics.prometheus import admission_counts
from mocker.request import EngineRequest, ParallelSampling, SamplingParams
from mocker.settings import ServerSettings
from mocker.settings.lora import LoraModule
from mocker.tokenizer import TextTokenizer

__all__ = ["OpenAIServing", "RequestHeaders", "pinned_rank"]

logger = logging.getLogger("mocker.requests")

GenerationRequest = CompletionRequest | ChatCompletionRequest


@dataclass(frozen=True, slots=True)
class RequestHeaders:
    """What a generation request's headers say beyond its body."""

    request_id: str | None = None  # X-Request-Id
    rank: str | None = None  # X-data-parallel-rank, as sent
    fault: str | None = None  # X-Mocker-Fail
    session: str | None = None  # X-Session-ID


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


def session_of(body: GenerationRequest, header: str | None) -> str | None:
    """A request's session as vLLM 0.34 takes it: the body's `session_id`, else the
    X-Session-ID header, else `vllm_xargs.session_id` (the first non-empty one)."""
    if body.session_id:
        return body.session_id
    if header:
        return header
    xarg = (body.vllm_xargs or {}).get("session_id")
    return xarg if isinstance(xarg, str) and xarg else None


def _remote_cached_tokens(spec: EngineRequest, engine: LiveEngine) -> int | None:
    """What a P/D decode request reports as cached: the prefill's hits (vLLM's
    remote_prefill_cached_tokens), at most its prompt; None when this engine does not pull
    (it ignores the params, as vLLM does without a KV consumer role)."""
    remote = spec.remote_prefill
    if remote is None or remote.cached_tokens is None or engine.core.pulls is None:
        return None
    return min(remote.cached_tokens, len(spec.prompt_token_ids))


def _usage_wanted(options: StreamOptions | None, forced: bool) -> tuple[bool, bool]:
    """vLLM's should_include_usage: (usage at the end, usage on every chunk). Forced
    (--enable-force-include-usage): both; else as stream_options ask, a running usage
    only with the final one."""
    if forced:
        return True, True
    if options is None:
        return False, False
    include = bool(options.include_usage)
    return include, include and bool(options.continuous_usage_stats)


def _unsupported(body: GenerationRequest) -> None:
    """400 for what this mock does not generate, and for what vLLM refuses in a body: stream
    options without a stream, sampling values out of range, a chat's tools and formats."""
    options = body.stream_options
    if (
        options is not None
        and not body.stream
        and (options.model_fields_set or options.model_extra)
    ):
        # vLLM's check, on the body as sent: a non-empty object without `stream: true`.
        raise OpenAIError(400, "Stream options can only be defined when `stream=True`.",
                          "stream_options")  # fmt: skip
    check_sampling(body)
    if isinstance(body, ChatCompletionRequest):
        check_chat(body)
    else:
        check_response_format((body.model_extra or {}).get("response_format"))
        if body.best_of not in (None, 1):
            raise OpenAIError(400, "best_of > 1 is not supported.", "best_of")
        if body.suffix:
            raise OpenAIError(400, "suffix is not supported by this server.", "suffix")


class OpenAIServing:
    """Turns validated OpenAI requests into engine requests and their outputs into responses."""

    def __init__(
        self,
        engines: EngineGroup,
        tokenizer: TextTokenizer,
        settings: ServerSettings,
        config: EngineConfig,
        faults: FaultInjector,
        loras: LoraAdapters | None = None,
        rejections: dict[str, int] | None = None,
    ) -> None:
        self.engines = engines
        # Requests refused by admission control, by vLLM's reason (read by /metrics).
        self.rejections = rejections if rejections is not None else admission_counts()
        self.loras = loras if loras is not None else LoraAdapters(settings)
        self.faults = faults
        self.open = OpenResponses()  # generation responses not yet ended
        self.tokenizer = tokenizer
        # The streamed chunks' texts in one compact table (None: joined in Python); what the
        # tokenizer has escaped by now, its whole word palette (later ids go the Python way).
        self._texts = text_table(tokenizer.escaped_pieces)
        # ... and its sinks, which write a plain stream's tokens from the engine loop's hand-out.
        self._sinks = sinks(self._texts)
        self.settings = settings
        self.config = config

    @property
    def open_responses(self) -> int:
        return self.open.count

    # -- endpoints ----------------------------------------------------------------------------

    def completions(
        self,
        body: CompletionRequest,
        headers: RequestHeaders = RequestHeaders(),
        prepared: Prepared | None = None,
    ) -> Response:
        """`prepared`: the prompts tokenized off the loop (prepare.py), if they were long."""
        with self._refusal_releases(body):
            model, lora = self._check(body)
            if prepared is not None:
                prompts = prepared.get()
            else:
                prompts = completion_prompts(self.tokenizer, body.prompt)
            rid = headers.request_id or random_hex()
            choices = self._start(body, prompts, body.max_tokens, rid, headers, "prompt",
                                  lora=lora)  # fmt: skip
            if body.echo:
                self._echo(body, prompts, choices)
        return self._respond(body, choices, model, f"cmpl-{rid}", rid)

    def _echo(
        self, body: CompletionRequest, prompts: list[list[int]], choices: list[Choice]
    ) -> None:
        """echo: each choice's text starts with its prompt's (as sent, or decoded from token
        ids), and its logprobs, if asked for, with the prompt's (vLLM's prompt_logprobs)."""
        sent = body.prompt
        strings = [sent] if isinstance(sent, str) else [p for p in sent if isinstance(p, str)]
        # (a list of strings, or token ids: completion_prompts accepted nothing mixed)
        texts = strings or [self.tokenizer.decode(ids) for ids in prompts]
        n = body.n
        for i, choice in enumerate(choices):
            prompt = i // n
            choice.echo = texts[prompt]
            logprobs = choice.logprobs
            if logprobs is not None:
                # A prompt's logprobs depend on the prompt alone (as vLLM's): made once, by
                # its first choice, and shared by its siblings (read only).
                first = choices[prompt * n]
                choice.echo_logprobs = (
                    logprobs.prompt(prompts[prompt])
                    if first is choice
                    else logprobs.follow_prompt(first.echo_logprobs)
                )

    def chat(
        self,
        body: ChatCompletionRequest,
        headers: RequestHeaders = RequestHeaders(),
        prepared: Prepared | None = None,
    ) -> Response:
        """`prepared`: the rendered prompt tokenized off the loop, if the chat was long."""
        with self._refusal_releases(body):
            model, lora = self._check(body)
            self._check_auto_tool_choice(body)
            if prepared is not None:
                prompt = prepared.get()[0]
            else:
                prompt = chat_prompt(self.tokenizer, body)
            max_tokens = body.max_completion_tokens or body.max_tokens
            rid = headers.request_id or random_hex()
            choices = self._start(body, [prompt], max_tokens, rid, headers, "messages",
                                  lora=lora)  # fmt: skip
        return self._respond(body, choices, model, f"chatcmpl-{rid}", rid)

    def responses(
        self,
        body: ResponsesRequest,
        headers: RequestHeaders = RequestHeaders(),
        prepared: Prepared | None = None,
    ) -> Response:
        """The OpenAI Responses API: the input runs as the chat it renders to (vLLM's way),
        answered as a response object or its stream of events."""
        with responses_api.named_as_sent():  # (errors name the responses fields)
            chat_body = ChatCompletionRequest.model_validate(responses_api.chat_fields(body))
            model, lora = self._check(chat_body)
            if prepared is not None:
                prompt = prepared.get()[0]
            else:
                prompt = chat_prompt(self.tokenizer, chat_body)
            rid = headers.request_id or random_hex()
            choices = self._start(chat_body, [prompt], chat_body.max_completion_tokens, rid,
                                  headers, "input", lora=lora)  # fmt: skip
        return self._respond(chat_body, choices, model, f"resp_{rid}", rid, responses=body)

    def _check_auto_tool_choice(self, body: ChatCompletionRequest) -> None:
        """vLLM's gate: a chat whose tool_choice is "auto" (given, or the default when tools
        are) needs --enable-auto-tool-choice and --tool-call-parser, else a 400."""
        choice = body.tool_choice
        if choice is None and body.tools and "tool_choice" not in body.model_fields_set:
            choice = "auto"
        settings = self.settings
        if choice == "auto" and not (
            settings.enable_auto_tool_choice and settings.tool_call_parser
        ):
            raise OpenAIError(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                              "--tool-call-parser to be set")  # fmt: skip

    # -- render (vLLM's /v1/completions/render and /v1/chat/completions/render) ---------------

    def render_completions(
        self,
        body: CompletionRequest,
        headers: RequestHeaders = RequestHeaders(),
        prepared: Prepared | None = None,
    ) -> Response:
        """Every prompt as the engine would run it, one GenerateRequest each (an array)."""
        self._model(body.model)
        _unsupported(body)
        self._logprobs(body)
        self._prompt_logprobs(body)
        if prepared is not None:
            prompts = prepared.get()
        else:
            prompts = completion_prompts(self.tokenizer, body.prompt)
        rid = "cmpl-" + (headers.request_id or random_hex())
        rendered = [
            generate_request(
                body,
                rid if len(prompts) == 1 else f"{rid}-{i}",
                prompt,
                self._sampling(body, body.max_tokens, len(prompt), "prompt"),
            )
            for i, prompt in enumerate(prompts)
        ]
        return json_response(rendered)

    def render_chat(
        self,
        body: ChatCompletionRequest,
        headers: RequestHeaders = RequestHeaders(),
        prepared: Prepared | None = None,
    ) -> Response:
        """The messages as the engine would run them: one GenerateRequest."""
        self._model(body.model)
        _unsupported(body)
        self._logprobs(body)
        self._prompt_logprobs(body)
        prompt = prepared.get()[0] if prepared is not None else chat_prompt(self.tokenizer, body)
        max_tokens = body.max_completion_tokens or body.max_tokens
        sampling = self._sampling(body, max_tokens, len(prompt), "messages")
        rid = "chatcmpl-" + (headers.request_id or random_hex())
        return json_response(generate_request(body, rid, prompt, sampling))

    # -- token in, token out (vLLM's /inference/v1/generate) ---------------------------------

    def generate(
        self, body: GenerateRequest, headers: RequestHeaders = RequestHeaders()
    ) -> Response:
        """Token ids in, token ids out: the request runs as a completion of those ids."""
        sp = body.sampling_params
        if sp.logprobs is not None or (sp.model_extra or {}).get("prompt_logprobs") is not None:
            raise OpenAIError(400, "logprobs are not supported on this route by this mock "
                              "server (they are on /v1/completions and /v1/chat/completions).",
                              "sampling_params")  # fmt: skip
        fields = (
            {
                "model": body.model, "prompt": body.token_ids, "max_tokens": sp.max_tokens,
                "min_tokens": sp.min_tokens, "ignore_eos": sp.ignore_eos, "stop": sp.stop,
                "stop_token_ids": sp.stop_token_ids, "n": sp.n,
                "include_stop_str_in_output": sp.include_stop_str_in_output,
                "stream": body.stream, "stream_options": body.stream_options,
                "return_token_ids": body.return_token_ids, "cache_salt": body.cache_salt,
                "priority": body.priority, "data_parallel_rank": body.data_parallel_rank,
                "seed": sp.seed,
                "kv_transfer_params": body.kv_transfer_params,
                # (checked as a completion's: check_sampling)
                "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k,
                "min_p": sp.min_p, "presence_penalty": sp.presence_penalty,
                "frequency_penalty": sp.frequency_penalty,
                "repetition_penalty": sp.repetition_penalty,
                "stream_interval": sp.stream_interval, "logit_bias": sp.logit_bias,
                "allowed_token_ids": sp.allowed_token_ids,
            }
        )  # fmt: skip
        with self._refusal_releases(body):
            try:  # the same fields, already validated: a mismatch is the client's to hear
                completion = CompletionRequest.model_validate(fields)
            except ValidationError as exc:
                raise OpenAIError(400, f"invalid sampling_params: {exc}",
                                  "sampling_params") from None  # fmt: skip
            model, lora = self._check(completion)
            prompts = completion_prompts(self.tokenizer, completion.prompt)
            rid = headers.request_id or body.request_id or random_hex()
            choices = self._start(
                completion, prompts, sp.max_tokens, rid, headers, "token_ids", generate=True,
                lora=lora,
            )  # fmt: skip
        return self._respond(
            completion, choices, model, f"generate-tokens-{rid}", rid, generate=True
        )

    @contextmanager
    def _refusal_releases(self, body: GenerationRequest | GenerateRequest) -> Iterator[None]:
        """P/D decode side: a request refused before it reaches an engine (a 4xx, a 503) has
        its prefill engine free the KV held for it at once, as vLLM's
        notify_kv_transfer_request_rejected does, not at the lease's end. (Once `_start`
        returns, the engine owns the request and frees the KV when it ends.)"""
        try:
            yield
        except BaseException:
            try:
                _, remote = parse_transfer_params(body.kv_transfer_params)
            except InvalidTransferParams:
                remote = None
            # Not if another request of this server still wants that KV (a retry that reused
            # an in-flight request id, refused as such).
            if remote is not None and not any(e.wants_remote(remote) for e in self.engines):
                self.engines[0].release_remote(remote)
            raise

    def _model(self, name: str | None) -> tuple[str, LoraModule | None]:
        """The model name to answer with, and the adapter it names (None: the base model)."""
        lora = self.loras.get(name)
        if lora is not None:
            return lora.name, lora
        return check_model(self.settings, name), None

    def _check(self, body: GenerationRequest) -> tuple[str, LoraModule | None]:
        model = self._model(body.model)
        _unsupported(body)
        check_token_params(body, self.tokenizer.vocab_size)
        self._logprobs(body)
        self._prompt_logprobs(body)
        if self.engines.is_dead:
            raise OpenAIError(503, f"The engine is not running: {self.engines.dead_error}")
        return model

    def _logprobs(self, body: GenerationRequest) -> LogprobsFormat | None:
        """The response's synthetic logprobs (None: not asked for); vLLM's 400s."""
        chat = isinstance(body, ChatCompletionRequest)
        # (nearly every request asks for none: nothing to check)
        if isinstance(body, ChatCompletionRequest):
            if not body.logprobs and body.top_logprobs is None:
                return None
        elif body.logprobs is None:
            return None
        num_top = requested_logprobs(
            chat=chat,
            logprobs=body.logprobs,
            top_logprobs=body.top_logprobs if isinstance(body, ChatCompletionRequest) else None,
            max_logprobs=self.settings.max_logprobs,
            vocab_size=self.tokenizer.vocab_size,
        )
        if num_top is None:
            return None
        tokenizer = self.tokenizer
        return LogprobsFormat(num_top, tokenizer.palette, tokenizer.piece, chat=chat)

    def _prompt_logprobs(self, body: GenerationRequest) -> int | None:
        """vLLM's prompt_logprobs (top alternatives per prompt token; None: not asked)."""
        extra = body.model_extra
        if not extra or "prompt_logprobs" not in extra:
            return None
        return requested_prompt_logprobs(
            extra["prompt_logprobs"],
            stream=bool(body.stream),
            max_logprobs=self.settings.max_logprobs,
            vocab_size=self.tokenizer.vocab_size,
        )

    # -- engine requests ----------------------------------------------------------------------

    def _sampling(
        self, body: GenerationRequest, max_tokens: int | None, num_prompt_tokens: int, param: str
    ) -> SamplingParams:
        """The request's limits, max_tokens clamped to the room the context leaves."""
        try:
            check_prompt_length(self.config, num_prompt_tokens, param)
            if max_tokens is not None:
                check_min_tokens(body.min_tokens, max_tokens)
        except RequestRejected as exc:
            raise OpenAIError(400, str(exc), exc.param) from None
        room = self.config.max_model_len - num_prompt_tokens
        limit = room if max_tokens is None else min(max_tokens, room)
        return SamplingParams(
            max_tokens=limit,
            min_tokens=min(body.min_tokens, limit),
            ignore_eos=body.ignore_eos,
            stop_token_ids=tuple(body.stop_token_ids or ()),
        )

    def _specs(
        self,
        body: GenerationRequest,
        prompts: list[list[int]],
        max_tokens: int | None,
        request_id: str,
        param: str,
        lora: LoraModule | None = None,
        num_prompt_top: int | None = None,
        session_id: str | None = None,
    ) -> list[EngineRequest]:
        """One checked engine request per prompt (ids `<id>-<i>` when there are several);
        `num_prompt_top`: the prompt logprobs asked for (None: none)."""
        try:
            remote_decode, remote_prefill = parse_transfer_params(body.kv_transfer_params)
        except InvalidTransferParams as exc:
            raise OpenAIError(400, str(exc), "kv_transfer_params") from None
        n = body.n
        # vLLM 0.34: vllm_xargs.kv_cache_report_mode "full" announces the blocks it hits.
        report_hits = (body.vllm_xargs or {}).get("kv_cache_report_mode") == "full"
        if (remote_prefill is not None or remote_decode) and (len(prompts) > 1 or n > 1):
            # One set of kv_transfer_params answers for one engine request's KV.
            raise OpenAIError(
                400,
                "kv_transfer_params (P/D) go with one prompt and n = 1: send one prompt "
                "per request",
                "kv_transfer_params",
            )
        if len(prompts) * n > MAX_CHOICES:
            raise OpenAIError(
                400,
                f"A request makes at most {MAX_CHOICES} choices (prompts x n) in this "
                f"server; got {len(prompts)} x {n}.",
                "n",
            )
        # vLLM reads no prefix hits for a request whose prompt it scores (prompt_logprobs,
        # or an echo with logprobs).
        scored = num_prompt_top is not None or (
            isinstance(body, CompletionRequest) and body.echo and body.logprobs is not None
        )
        specs: list[EngineRequest] = []
        for i, prompt in enumerate(prompts):
            parent_id = request_id if len(prompts) == 1 else f"{request_id}-{i}"
            sampling = self._sampling(body, max_tokens, len(prompt), param)
            # n > 1: vLLM's parallel sampling, n engine requests `<j>_<id>` of one prompt.
            parent = ParallelSampling(n) if n > 1 else None
            for j in range(n):
                spec = EngineRequest(
                    parent_id if parent is None else f"{j}_{parent_id}",
                    prompt,
                    sampling,
                    priority=body.priority,
                    cache_salt=body.cache_salt,
                    session_id=session_id,
                    report_hits=report_hits,
                    lora_name=lora.name if lora is not None else None,
                    lora_path=lora.path if lora is not None else None,
                    remote_decode=remote_decode,
                    remote_prefill=remote_prefill,
                    parent=parent,
                    skip_reading_prefix_cache=scored,
                )
                try:
                    if j == 0:
                        self.engines.check_request(spec)
                    else:  # (its siblings differ in nothing else the check reads)
                        self.engines.check_request_id(spec.request_id)
                except RequestRejected as exc:
                    raise OpenAIError(400, str(exc), exc.param) from None
                specs.append(spec)
        return specs

    def _inject(self, forced: str | None, param: str) -> FaultType | None:
        """This request's injected fault: raised here, or `abort` (counted when it cuts)."""
        fault = self.faults.choose(forced)
        if fault is None or fault is FaultType.ABORT:
            return fault
        self.faults.record(fault)
        raise failure_error(fault, self.config.max_model_len, param)

    def _engine_for(self, rank: int | None) -> LiveEngine:
        """The rank a new engine request goes to."""
        return self.engines.pick(rank)

    def _admit(self, n: int) -> None:
        """vLLM 0.34's admission control, in the API server over every rank: 503 (counted in
        vllm:admission_rejections) when `n` more requests would put more than
        --max-num-queued-reqs in flight, or while the prompts not past their first token
        hold --max-num-queued-tokens."""
        limit = self.settings.max_num_queued_reqs
        if limit is not None and self.engines.num_in_flight() + n > limit:
            self.rejections["max_num_queued_reqs"] += 1
            raise OpenAIError(503, "The engine is currently busy and cannot accept new requests. "
                              "Please try again later or on a different instance.")  # fmt: skip
        tokens = self.settings.max_num_queued_tokens
        if tokens is not None and self.engines.prefill_backlog() >= tokens:
            self.rejections["max_num_queued_tokens"] += 1
            raise OpenAIError(503, "The engine has reached its prefill token backlog limit. "
                              "Please try again later or on a different instance.")  # fmt: skip

    def _start(
        self,
        body: GenerationRequest,
        prompts: list[list[int]],
        max_tokens: int | None,
        request_id: str,
        headers: RequestHeaders,
        param: str,
        generate: bool = False,
        lora: LoraModule | None = None,
    ) -> list[Choice]:
        """Check every prompt, draw the request's fault (a client mistake is reported as such,
        never masked by one), then hand every prompt to an engine; all or nothing."""
        rank = pinned_rank(body.data_parallel_rank, headers.rank)
        try:
            self.engines.check_rank(rank)
        except RankError as exc:
            raise OpenAIError(400, str(exc), "data_parallel_rank") from None
        num_prompt_top = self._prompt_logprobs(body)
        session = session_of(body, headers.session)
        specs = self._specs(
            body, prompts, max_tokens, request_id, param, lora, num_prompt_top, session
        )
        fault = self._inject(headers.fault, param)
        self._admit(len(specs))
        stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
        stop = tuple(s for s in stop if s)
        logprobs = self._logprobs(body)
        choices: list[Choice] = []
        try:
            for i, spec in enumerate(specs):
                engine = self._engine_for(rank)
                choice = self._choice(body, i, spec, engine, fault, stop, generate)
                if logprobs is not None:
                    choice.logprobs = logprobs.choice(spec.request_id)
                # (usage counts a prompt once, with the first of its n choices)
                choice.counts_prompt = i % body.n == 0
                choices.append(choice)
            if num_prompt_top is not None and not body.stream:  # (a stream sends none)
                tokenizer, n = self.tokenizer, body.n
                for i, prompt in enumerate(prompts):  # (once a prompt, its choices share them)
                    scored = prompt_logprobs(prompt, num_prompt_top, tokenizer.palette,
                                             tokenizer.piece)  # fmt: skip
                    for choice in choices[i * n : (i + 1) * n]:
                        choice.prompt_logprobs = scored
        except BaseException as exc:
            for choice in choices:
                choice.cancel()
            if isinstance(exc, RequestRejected):
                raise OpenAIError(400, str(exc), exc.param) from None
            if isinstance(exc, EngineDeadError):
                raise OpenAIError(503, f"The engine is not running: {exc}") from None
            raise
        return choices

    def _choice(
        self,
        body: GenerationRequest,
        index: int,
        spec: EngineRequest,
        engine: LiveEngine,
        fault: FaultType | None,
        stop: tuple[str, ...],
        generate: bool,
    ) -> Choice:
        stream = engine.add_request(spec, checked=True)  # by _specs, just before
        sampling = spec.sampling
        max_out = sampling.max_tokens or 1
        if self.settings.log_requests:
            logger.info(
                "request %s: %d prompt tokens, max_tokens %s, stream %s",
                spec.request_id, len(spec.prompt_token_ids), sampling.max_tokens,
                bool(body.stream),
            )  # fmt: skip
        ids = bool(body.return_token_ids) or generate
        return Choice(
            index,
            spec.request_id,
            engine,
            stream,
            len(spec.prompt_token_ids),
            abort_at=max(1, max_out // 2) if fault is FaultType.ABORT else None,
            stops=StopMatcher(stop, include_stop=body.include_stop_str_in_output) if stop else None,
            stop_token_ids=frozenset(sampling.stop_token_ids),
            prompt_token_ids=list(spec.prompt_token_ids) if body.return_token_ids else None,
            token_ids=[] if ids else None,
            remote_cached_tokens=_remote_cached_tokens(spec, engine),
        )

    # -- responses ----------------------------------------------------------------------------

    def _respond(
        self,
        body: GenerationRequest,
        choices: list[Choice],
        model: str,
        response_id: str,
        request_id: str,
        generate: bool = False,
        responses: ResponsesRequest | None = None,
    ) -> Response:
        chat = isinstance(body, ChatCompletionRequest)
        created = int(time.time())
        response = OpenResponse(choices, self.open)
        headers = {"x-request-id": request_id}
        tokenizer, faults = self.tokenizer, self.faults
        ids = bool(body.return_token_ids)
        # (a /v1/responses message's id: drawn only for those, a syscall per request)
        message_id = f"msg_{random_hex()}" if responses is not None else ""
        if not body.stream:
            head = ResponseHead(response_id, created, model, chat, headers, generate, ids,
                                responses, message_id)  # fmt: skip
            collector = ResponseCollector(response, head, piece=tokenizer.piece, faults=faults)
            collector.attach()
            return DeferredResponse(collector.response, response.on_disconnect)
        include_usage, continuous_usage = _usage_wanted(
            body.stream_options, self.settings.force_include_usage
        )
        writer: ChunkWriter | GenerateChunkWriter | ResponsesStreamWriter
        if responses is not None:
            writer = ResponsesStreamWriter(responses, response_id, created, model, message_id)
        elif generate:
            writer = GenerateChunkWriter(
                response_id=response_id,
                include_usage=include_usage,
                continuous_usage=continuous_usage,
            )
        else:
            writer = ChunkWriter(
                chat=chat,
                response_id=response_id,
                created=created,
                model=model,
                include_usage=include_usage,
                continuous_usage=continuous_usage,
                with_ids=ids,
            )
        renderer = StreamRenderer(
            response,
            writer,
            escaped=tokenizer.escaped_piece,
            known=tokenizer.escaped_pieces,
            framed=None if self._texts is None else self._texts.framed,
            sinks=self._sinks,
            piece=tokenizer.piece,
            record_abort=faults.record_abort,
            # vLLM's clamp: a request may ask for a longer interval than the server's, not
            # a shorter one.
            stream_interval=max(self.settings.stream_interval, body.stream_interval or 1),
        )

        def start(emitter: Emitter) -> None:
            if faults.config.has_jitter:
                renderer.attach(JitteredEmitter(emitter, faults, response.arrived))
            else:
                renderer.attach(emitter)

        return EventStreamResponse(start, response.on_disconnect, headers)
