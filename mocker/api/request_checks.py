"""A generation body checked against the running server: model, options, logprobs, engine."""

from __future__ import annotations

from mocker.api.chat_bodies import ChatCompletionRequest
from mocker.api.chat_checks import check_chat, check_response_format
from mocker.api.completion_bodies import CompletionRequest
from mocker.api.errors import OpenAIError
from mocker.api.inputs import check_model
from mocker.api.logprobs import LogprobsFormat, requested_logprobs, requested_prompt_logprobs
from mocker.api.lora import LoraAdapters
from mocker.api.sampling_checks import check_sampling, check_token_params
from mocker.engine.group import EngineGroup
from mocker.settings import ServerSettings
from mocker.settings.lora import LoraModule
from mocker.tokenizer import TextTokenizer

__all__ = ["GenerationRequest", "RequestChecks", "check_supported"]

GenerationRequest = CompletionRequest | ChatCompletionRequest


def check_supported(body: GenerationRequest) -> None:
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


class RequestChecks:
    """vLLM's 400s (and the 503 of a dead engine) for a body, before any engine sees it."""

    # Set by OpenAIServing, which these checks are part of.
    engines: EngineGroup
    loras: LoraAdapters
    settings: ServerSettings
    tokenizer: TextTokenizer

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

    def _model(self, name: str | None) -> tuple[str, LoraModule | None]:
        """The model name to answer with, and the adapter it names (None: the base model)."""
        lora = self.loras.get(name)
        if lora is not None:
            return lora.name, lora
        return check_model(self.settings, name), None

    def _check(self, body: GenerationRequest) -> tuple[str, LoraModule | None]:
        model = self._model(body.model)
        check_supported(body)
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
