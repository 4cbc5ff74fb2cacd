"""Completions and chat: checked request → engine requests → a streamed or collected response."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import ValidationError
from starlette.responses import Response

from mocker.api import responses_api
from mocker.api.chat_bodies import ChatCompletionRequest, ResponsesRequest
from mocker.api.choice import Choice
from mocker.api.completion_bodies import CompletionRequest, GenerateRequest
from mocker.api.engine_requests import EngineRequests
from mocker.api.errors import OpenAIError
from mocker.api.faults import FaultInjector
from mocker.api.headers import RequestHeaders
from mocker.api.ids import random_hex
from mocker.api.inputs import chat_prompt, completion_prompts
from mocker.api.lifecycle import OpenResponses
from mocker.api.lora import LoraAdapters
from mocker.api.prepare import Prepared
from mocker.api.render import generate_request
from mocker.api.request_checks import GenerationRequest, check_supported
from mocker.api.respond import Responder
from mocker.api.responses import json_response
from mocker.api.text_table import sinks, text_table
from mocker.config import EngineConfig
from mocker.disagg.params import InvalidTransferParams, parse_transfer_params
from mocker.engine.group import EngineGroup
from mocker.metrics.sources import admission_counts
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer

__all__ = ["OpenAIServing"]


class OpenAIServing(EngineRequests, Responder):
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

    # -- render (vLLM's /v1/completions/render and /v1/chat/completions/render) ---------------

    def render_completions(
        self,
        body: CompletionRequest,
        headers: RequestHeaders = RequestHeaders(),
        prepared: Prepared | None = None,
    ) -> Response:
        """Every prompt as the engine would run it, one GenerateRequest each (an array)."""
        self._model(body.model)
        check_supported(body)
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
        check_supported(body)
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
