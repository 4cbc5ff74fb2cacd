"""What every request body shares: field types, schema markers, value checks, sampling fields.

OpenAI request bodies are pydantic models (completion_bodies.py, chat_bodies.py,
tokenizer_bodies.py): validated once at the door; unknown fields kept.

Their JSON schemas (the app's /openapi.json) say what the server accepts, beyond what pydantic
checks: a value the mock refuses later (too many choices or logprobs, echo, an empty prompt, a
text-less chat, a content part that is not text) is left out of the schema, so a generated
client or a fuzzer sends what the server serves. Those refusals keep their own 400 messages:
the schema says more than pydantic checks, not less. What only the running server knows (the
vocabulary, max_model_len, the served model names, the data-parallel ranks)
`mocker.api.openapi` writes in when the app is built. Integers anywhere in a body must fit 64
bits (orjson writes no larger one back), and /inference/v1/generate's request_id, answered as a
header, must be ASCII.
"""

from __future__ import annotations

from array import array
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MARK_CHAT",
    "MARK_LOGPROBS",
    "MARK_MODEL",
    "MARK_PROMPT_IDS",
    "MARK_RANK",
    "MARK_TOKEN_ID",
    "MAX_CHOICES",
    "UINT64_MAX",
    "GenerationFields",
    "Int64",
    "ModelName",
    "NonNegInt",
    "OpenBody",
    "PositiveInt",
    "Rank",
    "SamplingKnobs",
    "StreamOptions",
    "TokenId",
    "TokenIds",
    "logprobs_schema",
    "only_schema",
    "schema_range",
]

# Integers are 64-bit, as vLLM's (a seed is a torch.long) and as orjson writes them back in a
# render body: a larger one is a 400 here, not a failure to answer.
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
NonNegInt = Annotated[int, Field(ge=0, le=INT64_MAX)]
PositiveInt = Annotated[int, Field(ge=1, le=INT64_MAX)]

# Schema markers mocker.api.openapi replaces with the running server's limits.
MARK_TOKEN_ID = "x-mocker-token-id"  # an integer below the vocabulary size
MARK_PROMPT_IDS = "x-mocker-prompt-ids"  # a token-id list shorter than max_model_len
MARK_MODEL = "x-mocker-model"  # one of the served model names
MARK_RANK = "x-mocker-rank"  # a data-parallel rank of this server
MARK_LOGPROBS = "x-mocker-logprobs"  # at most the server's --max-logprobs
MARK_CHAT = "x-mocker-chat-messages"  # messages that must carry some text (see mocker.api.openapi)

# A token id: the server checks it against the vocabulary (a 400 that names the id).
TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0, MARK_TOKEN_ID: True})]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
# vLLM's data_parallel_rank; strict: true or "1" is no rank.
Rank = Annotated[int, Field(ge=0, le=INT64_MAX, strict=True, json_schema_extra={MARK_RANK: True})]
ModelName = Annotated[str, Field(json_schema_extra={MARK_MODEL: True})]

_NOT_SUPPORTED = "Not supported by this mock server (a 400 unless omitted, null or"


def only_schema(schema: dict[str, Any], what: str) -> WithJsonSchema:
    """The schema of a field the mock refuses all but `schema` of (validated as typed, and
    refused by the server with its own message)."""
    return WithJsonSchema({**schema, "description": f"{_NOT_SUPPORTED} {what})."})


# Nesting a body may have: orjson writes no deeper than 255 levels back (a render echoes
# tools and chat_template_kwargs), and no client needs more.
MAX_DEPTH = 64


def _check_value(value: Any, where: str, depth: int = 0) -> None:
    """Strings must be encodable (JSON allows lone surrogates like "\\ud800"; UTF-8 does not),
    integers must fit 64 bits and nesting must stay within MAX_DEPTH (JSON allows any; a body
    echoed back, as chat_template_kwargs in a render, could not be written)."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError(
                f"{where or 'a string'} is not valid Unicode (lone surrogate)"
            ) from None
    elif isinstance(value, int):
        if not INT64_MIN <= value <= UINT64_MAX:
            raise ValueError(f"{where or 'an integer'} is out of the 64-bit integer range")
    elif isinstance(value, list | tuple | dict):
        if depth >= MAX_DEPTH:
            raise ValueError(f"{where or 'a value'} is nested deeper than {MAX_DEPTH} levels")
        if value and not isinstance(value, dict) and _int64s(value):
            return  # a prompt's token ids: checked in C at once, not one call per id
        if isinstance(value, dict):
            for key, item in value.items():
                _check_value(key, where, depth + 1)
                _check_value(item, f"{where}.{key}" if where else str(key), depth + 1)
        else:
            for item in value:
                _check_value(item, where, depth + 1)


def _int64s(values: list[Any] | tuple[Any, ...]) -> bool:
    """Every item an int (or bool) in the signed 64-bit range (the rest: checked one by one)."""
    try:
        array("q", values)
    except (TypeError, OverflowError):
        return False
    return True


_NOTHING_TO_CHECK = frozenset({type(None), bool, float})


class OpenBody(BaseModel):
    # vLLM accepts (and logs) fields it does not know; load generators send many.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _valid_values(self) -> OpenBody:
        values = self.__dict__
        # Only what the client sent (defaults are valid); most of that is flags or numbers:
        # nothing to check, and no call for them (this runs for every request). Nested
        # models check themselves.
        for name in self.model_fields_set:
            value = values.get(name)
            if type(value) not in _NOTHING_TO_CHECK and not isinstance(value, BaseModel):
                _check_value(value, name)
        for name, value in (self.model_extra or {}).items():
            _check_value(value, name)
        return self


class StreamOptions(OpenBody):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


# The most engine requests one HTTP request makes (prompts x n): vLLM sets no bound, but a
# mock that builds every choice before it answers would take any n it is sent.
MAX_CHOICES = 4096

# n: choices per prompt, each its own engine request (vLLM's parallel sampling); the server
# bounds prompts x n (MAX_CHOICES).
Choices = Annotated[
    int,
    Field(
        ge=1,
        le=INT64_MAX,
        json_schema_extra={"maximum": MAX_CHOICES},
        description="Choices per prompt: each runs as an engine request of its own "
        "(ids `<j>_<request id>`); usage counts the prompt once.",
    ),
]


# Keys of at most four digits: in any vocabulary (the server checks the real bound).
_LOGIT_BIAS_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "object", "propertyNames": {"pattern": "^[0-9]{1,4}$"},
         "additionalProperties": {"type": "number"}},
        {"type": "null"},
    ]
}  # fmt: skip


def schema_range(**bounds: float) -> Any:
    """A number's range in the schema only (the server checks it: see `SamplingKnobs`)."""
    return Field(json_schema_extra=dict(bounds))


class SamplingKnobs(OpenBody):
    """vLLM's sampling parameters that a completion, a chat and a generate body share."""

    min_tokens: NonNegInt = 0
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[NonNegInt] | None = None
    include_stop_str_in_output: bool = False
    n: Choices = 1
    seed: Int64 | None = None
    # Ranges as vLLM checks them: stated in the schema, checked by the server with vLLM's
    # messages (mocker.api.sampling_checks), not by pydantic.
    temperature: Annotated[float, schema_range(minimum=0, maximum=2)] | None = None
    top_p: Annotated[float, schema_range(exclusiveMinimum=0, maximum=1)] | None = None
    top_k: Annotated[Int64, schema_range(minimum=-1)] | None = None
    min_p: Annotated[float, schema_range(minimum=0, maximum=1)] | None = None
    presence_penalty: Annotated[float, schema_range(minimum=-2, maximum=2)] | None = None
    frequency_penalty: Annotated[float, schema_range(minimum=-2, maximum=2)] | None = None
    repetition_penalty: Annotated[float, schema_range(exclusiveMinimum=0)] | None = None
    skip_special_tokens: bool = True
    # Tokens a streamed chunk waits for; at least the server's --stream-interval.
    stream_interval: Annotated[Int64, schema_range(minimum=1)] | None = None
    # Token id (a JSON key: a decimal string) -> bias, and the ids sampling may draw from; the
    # server checks them against the vocabulary, as vLLM (the mock biases nothing).
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema(_LOGIT_BIAS_SCHEMA)] = None
    allowed_token_ids: Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})] | None = (
        None
    )


def logprobs_schema(name: str) -> dict[str, Any]:
    """Logprobs per token: synthetic, up to the server's --max-logprobs (vLLM's default 20;
    -1, the whole vocabulary, needs a server started with --max-logprobs -1)."""
    return {
        "anyOf": [
            {"type": "integer", "minimum": 0, "maximum": 20, MARK_LOGPROBS: True},
            {"type": "null"},
        ],
        "description": f"{name}: top alternatives per generated token, with synthetic "
        "log-probabilities (at most the server's --max-logprobs, 20 by default).",
    }


class GenerationFields(SamplingKnobs):
    """Fields shared by both generation endpoints."""

    model: ModelName | None = None
    max_tokens: PositiveInt | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions
    priority: Int64 = 0
    # Pins a rank (also the X-data-parallel-rank header).
    data_parallel_rank: Rank | None = None
    cache_salt: str | None = None
    # vLLM 0.34: related requests' session (also the X-Session-ID header and
    # vllm_xargs.session_id), named in the KV events of the blocks they store.
    session_id: str | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    # The prompt's and the generated token ids in the response (and stream chunks).
    return_token_ids: bool | None = None
    # P/D (NixlConnector): do_remote_decode on a prefill request; a decode request carries
    # what the prefill engine answered (mocker.disagg.params checks the keys).
    kv_transfer_params: dict[str, Any] | None = None
