"""The bodies the routes answer with, as OpenAPI schemas (the routes write their JSON directly,
for speed; these models only describe it, and schemathesis checks the two agree)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["RESPONSE_MODELS", "STREAMED", "ModelCard"]


class _Body(BaseModel):
    # vLLM's bodies carry more optional fields than a client needs typed: allowed.
    model_config = ConfigDict(extra="allow")


class PromptTokensDetails(_Body):
    cached_tokens: int


class UsageInfo(_Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(_Body):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(_Body):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(_Body):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None
    system_fingerprint: str | None = None
    kv_transfer_params: dict[str, Any] | None = None


class TopLogprob(_Body):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Body):
    content: list[TokenLogprob] | None


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatResponseMessage(_Body):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] = []
    reasoning_content: str | None = None


class ChatChoice(_Body):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Body):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo | None
    system_fingerprint: str | None = None
    prompt_token_ids: list[int] | None = None
    kv_transfer_params: dict[str, Any] | None = None


class ResponseUsage(_Body):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseObject(_Body):
    """The OpenAI Responses API's response object (its output items as the API defines them)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: ResponseUsage | None


class RenderedRequest(_Body):
    """vLLM's GenerateRequest: a rendered prompt, as /inference/v1/generate takes it."""

    request_id: str
    token_ids: list[int]
    sampling_params: dict[str, Any]
    model: str | None  # as the request named it
    stream: bool


class GenerateChoice(_Body):
    index: int
    finish_reason: str | None
    token_ids: list[int]
    stop_reason: int | str | None = None


class GenerateResponse(_Body):
    request_id: str
    model: str
    created: int
    usage: UsageInfo | None
    choices: list[GenerateChoice]
    kv_transfer_params: dict[str, Any] | None = None


class TokenizeResponse(_Body):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(_Body):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vllm"
    root: str
    parent: str | None = None
    max_model_len: int


class ModelList(_Body):
    object: Literal["list"]
    data: list[ModelCard]


class VersionResponse(_Body):
    version: str


# (method, path) -> the 200 body's model; a list means a JSON array of them.
RESPONSE_MODELS: dict[tuple[str, str], type[BaseModel] | list[type[BaseModel]]] = {
    ("post", "/v1/completions"): CompletionResponse,
    ("post", "/v1/chat/completions"): ChatCompletionResponse,
    ("post", "/v1/responses"): ResponseObject,
    ("post", "/v1/completions/render"): [RenderedRequest],
    ("post", "/v1/chat/completions/render"): RenderedRequest,
    ("post", "/inference/v1/generate"): GenerateResponse,
    ("post", "/tokenize"): TokenizeResponse,
    ("post", "/detokenize"): DetokenizeResponse,
    ("get", "/v1/models"): ModelList,
    ("get", "/version"): VersionResponse,
}
# The routes that stream server-sent events with "stream": true.
STREAMED = {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/inference/v1/generate"}
