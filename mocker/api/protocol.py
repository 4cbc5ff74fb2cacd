"""OpenAI request bodies as pydantic models: validated once at the door; unknown fields kept."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "DetokenizeRequest",
    "GenerateRequest",
    "GenerateSamplingParams",
    "StreamOptions",
    "TokenizeRequest",
]

NonNegInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(ge=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]


def _check_unicode(value: Any, where: str) -> None:
    """Strings must be encodable (JSON allows lone surrogates like "\\ud800"; UTF-8 does not)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError(
                f"{where or 'a string'} is not valid Unicode (lone surrogate)"
            ) from None
    elif isinstance(value, list | tuple):
        for item in value:
            _check_unicode(item, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, where)
            _check_unicode(item, f"{where}.{key}" if where else str(key))


class _Open(BaseModel):
    # vLLM accepts (and logs) fields it does not know; load generators send many.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _valid_unicode(self) -> _Open:
        for name, value in self.__dict__.items():
            if not isinstance(value, BaseModel):  # nested models check themselves
                _check_unicode(value, name)
        for name, value in (self.model_extra or {}).items():
            _check_unicode(value, name)
        return self


class StreamOptions(_Open):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _Sampling(_Open):
    """Fields shared by both generation endpoints."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    min_tokens: NonNegInt = 0
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    include_stop_str_in_output: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: PositiveInt = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    user: str | None = None
    # vLLM extensions
    priority: int = 0
    # Pins a rank (also the X-data-parallel-rank header); strict: true or "1" is no rank.
    data_parallel_rank: Annotated[int, Field(ge=0, strict=True)] | None = None
    cache_salt: str | None = None
    skip_special_tokens: bool = True
    # The prompt's and the generated token ids in the response (and stream chunks).
    return_token_ids: bool | None = None


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: PositiveInt | None = 16  # the OpenAI and vLLM default for completions
    logprobs: NonNegInt | None = None
    echo: bool = False
    best_of: PositiveInt | None = None
    suffix: str | None = None


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: NonNegInt | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Rendered into the prompt by the chat template (as vLLM passes them to it); the mock
    # never calls a tool, nor constrains its output to response_format.
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None


class GenerateSamplingParams(_Open):
    """vLLM's SamplingParams as POST /inference/v1/generate takes them (what the mock uses,
    and the common rest, typed)."""

    max_tokens: PositiveInt | None = None  # None: as many as the context leaves
    min_tokens: NonNegInt = 0
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    include_stop_str_in_output: bool = False
    n: PositiveInt = 1
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    logprobs: NonNegInt | None = None


class GenerateRequest(_Open):
    """POST /inference/v1/generate (vLLM's token-in/token-out endpoint, as llm-d uses it)."""

    request_id: str | None = None
    token_ids: Annotated[list[NonNegInt], Field(min_length=1)]
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    output_mode: Literal["tokens"] = "tokens"
    cache_salt: str | None = None
    priority: int = 0
    data_parallel_rank: Annotated[int, Field(ge=0, strict=True)] | None = None


class TokenizeRequest(_Open):
    """POST /tokenize: a prompt, or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Open):
    """POST /detokenize."""

    model: str | None = None
    tokens: list[int]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vllm"
    root: str
    parent: str | None = None
    max_model_len: int
