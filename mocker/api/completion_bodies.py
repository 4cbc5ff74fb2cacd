"""The completion bodies: POST /v1/completions, and the token-in, token-out generate."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema

from mocker.api.body_fields import (
    MARK_PROMPT_IDS,
    MARK_TOKEN_ID,
    GenerationFields,
    Int64,
    ModelName,
    NonNegInt,
    OpenBody,
    PositiveInt,
    Rank,
    SamplingKnobs,
    StreamOptions,
    TokenIds,
    logprobs_schema,
    only_schema,
)

__all__ = ["CompletionRequest", "GenerateRequest", "GenerateSamplingParams"]

# A prompt's list members stop at their first bad item: token ids tried as a list of texts
# (or of id lists) fail at every item, and pydantic would build an error for each before it
# tries the member that fits: a cost per id of a long prompt.
_PromptTexts = Annotated[list[str], Field(fail_fast=True)]
_PromptIdLists = Annotated[list[TokenIds], Field(fail_fast=True)]

_TOKEN_ID_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 0, MARK_TOKEN_ID: True}
_PROMPT_IDS_SCHEMA: dict[str, Any] = {
    "type": "array", "items": _TOKEN_ID_SCHEMA, "minItems": 1, MARK_PROMPT_IDS: True,
}  # fmt: skip
# A completion prompt: text, texts, token ids or lists of them; none of them empty.
_PROMPT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
        _PROMPT_IDS_SCHEMA,
        {"type": "array", "items": _PROMPT_IDS_SCHEMA, "minItems": 1},
    ],
    "description": "Text, a list of texts, token ids, or a list of token-id lists (one "
    "choice each); none empty, every token id in the vocabulary.",
}


class CompletionRequest(GenerationFields):
    """POST /v1/completions."""

    prompt: Annotated[
        str | _PromptTexts | TokenIds | _PromptIdLists,
        WithJsonSchema(_PROMPT_SCHEMA),
    ]
    max_tokens: PositiveInt | None = 16  # the OpenAI and vLLM default for completions
    logprobs: Annotated[Int64 | None, WithJsonSchema(logprobs_schema("logprobs"))] = None
    echo: bool = False
    best_of: Annotated[
        PositiveInt | None, only_schema({"anyOf": [{"const": 1}, {"type": "null"}]}, "1")
    ] = None
    suffix: Annotated[
        str | None,
        only_schema({"anyOf": [{"type": "string", "maxLength": 0}, {"type": "null"}]}, '""'),
    ] = None


class GenerateSamplingParams(SamplingKnobs):
    """vLLM's SamplingParams as POST /inference/v1/generate takes them (what the mock uses,
    and the common rest, typed)."""

    max_tokens: PositiveInt | None = None  # None: as many as the context leaves
    detokenize: bool = True
    logprobs: Annotated[NonNegInt | None, only_schema({"type": "null"}, "null")] = None


class GenerateRequest(OpenBody):
    """POST /inference/v1/generate (vLLM's token-in/token-out endpoint, as llm-d uses it)."""

    # Answered in the X-Request-Id header: printable ASCII only (a header carries no more).
    request_id: Annotated[str, Field(pattern=r"^[ -~]*$")] | None = None
    token_ids: Annotated[
        list[Annotated[NonNegInt, Field(json_schema_extra={MARK_TOKEN_ID: True})]],
        Field(min_length=1, json_schema_extra={MARK_PROMPT_IDS: True}),
    ]
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    model: ModelName | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None
    output_mode: Literal["tokens"] = "tokens"
    cache_salt: str | None = None
    priority: Int64 = 0
    data_parallel_rank: Rank | None = None
    kv_transfer_params: dict[str, Any] | None = None
