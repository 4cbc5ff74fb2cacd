"""OpenAI request bodies as pydantic models: validated once at the door; unknown fields kept.

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
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

__all__ = [
    "MARK_LOGPROBS",
    "MAX_CHOICES",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "DetokenizeRequest",
    "GenerateRequest",
    "GenerateSamplingParams",
    "ResponsesRequest",
    "StreamOptions",
    "TokenizeRequest",
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
# A prompt's list members stop at their first bad item: token ids tried as a list of texts
# (or of id lists) fail at every item, and pydantic would build an error for each before it
# tries the member that fits: a cost per id of a long prompt.
_PromptTexts = Annotated[list[str], Field(fail_fast=True)]
_PromptIdLists = Annotated[list[TokenIds], Field(fail_fast=True)]
# vLLM's data_parallel_rank; strict: true or "1" is no rank.
Rank = Annotated[int, Field(ge=0, le=INT64_MAX, strict=True, json_schema_extra={MARK_RANK: True})]
ModelName = Annotated[str, Field(json_schema_extra={MARK_MODEL: True})]

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
_NOT_SUPPORTED = "Not supported by this mock server (a 400 unless omitted, null or"


def _only(schema: dict[str, Any], what: str) -> WithJsonSchema:
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


class _Open(BaseModel):
    # vLLM accepts (and logs) fields it does not know; load generators send many.
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _valid_values(self) -> _Open:
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


class StreamOptions(_Open):
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


def _range(**bounds: float) -> Any:
    """A number's range in the schema only (the server checks it: see `_Knobs`)."""
    return Field(json_schema_extra=dict(bounds))


class _Knobs(_Open):
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
    temperature: Annotated[float, _range(minimum=0, maximum=2)] | None = None
    top_p: Annotated[float, _range(exclusiveMinimum=0, maximum=1)] | None = None
    top_k: Annotated[Int64, _range(minimum=-1)] | None = None
    min_p: Annotated[float, _range(minimum=0, maximum=1)] | None = None
    presence_penalty: Annotated[float, _range(minimum=-2, maximum=2)] | None = None
    frequency_penalty: Annotated[float, _range(minimum=-2, maximum=2)] | None = None
    repetition_penalty: Annotated[float, _range(exclusiveMinimum=0)] | None = None
    skip_special_tokens: bool = True
    # Tokens a streamed chunk waits for; at least the server's --stream-interval.
    stream_interval: Annotated[Int64, _range(minimum=1)] | None = None
    # Token id (a JSON key: a decimal string) -> bias, and the ids sampling may draw from; the
    # server checks them against the vocabulary, as vLLM (the mock biases nothing).
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema(_LOGIT_BIAS_SCHEMA)] = None
    allowed_token_ids: Annotated[list[TokenId], Field(json_schema_extra={"minItems": 1})] | None = (
        None
    )


# A responses body's input: a string, or message items of text (what the mock serves).
_RESPONSES_INPUT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "type": {"const": "message"},
                    "role": {"enum": ["user", "system", "developer", "assistant"]},
                    "content": {
                        "anyOf": [
                            {"type": "string", "minLength": 1},
                            {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["type", "text"],
                                    "properties": {
                                        "type": {"enum": ["input_text", "output_text"]},
                                        "text": {"type": "string", "minLength": 1},
                                    },
                                },
                            },
                        ]
                    },
                },
            },
        },
    ]
}


def _logprobs_schema(name: str) -> dict[str, Any]:
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


class _Sampling(_Knobs):
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


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: Annotated[
        str | _PromptTexts | TokenIds | _PromptIdLists,
        WithJsonSchema(_PROMPT_SCHEMA),
    ]
    max_tokens: PositiveInt | None = 16  # the OpenAI and vLLM default for completions
    logprobs: Annotated[Int64 | None, WithJsonSchema(_logprobs_schema("logprobs"))] = None
    echo: bool = False
    best_of: Annotated[
        PositiveInt | None, _only({"anyOf": [{"const": 1}, {"type": "null"}]}, "1")
    ] = None
    suffix: Annotated[
        str | None, _only({"anyOf": [{"type": "string", "maxLength": 0}, {"type": "null"}]}, '""')
    ] = None


def _text_part(schema: dict[str, Any]) -> None:
    # The server joins the text of text parts and refuses every other kind (a 400).
    props = schema["properties"]
    props["type"] = {"type": "string", "enum": ["text", "input_text"], "title": "Type"}
    props["text"] = {"type": "string", "title": "Text"}
    schema["required"] = ["type", "text"]


class ContentPart(_Open):
    model_config = ConfigDict(json_schema_extra=_text_part)

    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


def _chat_rules(schema: dict[str, Any]) -> None:
    # What the server refuses as vLLM does (mocker.api.chat_checks), stated where JSON
    # Schema can: a tool_choice needs tools (the schema asks it even of a null or "none"),
    # and tools a tool_choice (its default, "auto", needs the server's tool flags); a
    # continued final message takes no generation prompt (whose default is true).
    schema["dependentRequired"] = {"tool_choice": ["tools"], "tools": ["tool_choice"]}
    # top_logprobs other than 0 needs logprobs: true.
    schema["allOf"] = [
        {
            "if": {
                "required": ["continue_final_message"],
                "properties": {"continue_final_message": {"const": True}},
            },
            "then": {
                "required": ["add_generation_prompt"],
                "properties": {"add_generation_prompt": {"const": False}},
            },
        },
        {
            "if": {
                "required": ["top_logprobs"],
                "properties": {"top_logprobs": {"type": "integer", "minimum": 1}},
            },
            "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
        },
    ]


# The chat fields vLLM checks, as the schema states them (stricter than the server: a named
# tool_choice, which must name one of the tools, is left out).
_TOOLS_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["type", "function"],
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string", "minLength": 1}},
                    },
                },
            },
        },
        {"type": "null"},
    ]
}
_TOOL_CHOICE_SCHEMA: dict[str, Any] = {
    "anyOf": [{"enum": ["none", "required"]}, {"type": "null"}],
    "description": '"auto" (the default with tools) is accepted only by a server started with '
    "--enable-auto-tool-choice and --tool-call-parser, as vLLM's.",
}
_RESPONSE_FORMAT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "object", "required": ["type"],
         "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"],
         "properties": {"type": {"const": "json_schema"}, "json_schema": {"type": "object"}}},
        {"type": "null"},
    ]
}  # fmt: skip


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(json_schema_extra=_chat_rules)

    messages: Annotated[list[ChatMessage], Field(min_length=1, json_schema_extra={MARK_CHAT: True})]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[Int64 | None, WithJsonSchema(_logprobs_schema("top_logprobs"))] = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # Rendered into the prompt by the chat template (as vLLM passes them to it); the mock
    # never calls a tool, nor constrains its output to response_format.
    tools: Annotated[list[dict[str, Any]] | None, WithJsonSchema(_TOOLS_SCHEMA)] = None
    tool_choice: Annotated[str | dict[str, Any] | None, WithJsonSchema(_TOOL_CHOICE_SCHEMA)] = None
    parallel_tool_calls: bool | None = None
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema(_RESPONSE_FORMAT_SCHEMA)] = (
        None
    )


class ResponsesRequest(_Open):
    """POST /v1/responses (the OpenAI Responses API, as vLLM serves it): text input rendered
    by the chat template, one message out (mocker.api.responses_api)."""

    model: ModelName | None = None
    input: Annotated[str | list[dict[str, Any]], WithJsonSchema(_RESPONSES_INPUT_SCHEMA)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, _range(minimum=0, maximum=2)] | None = None
    top_p: Annotated[float, _range(exclusiveMinimum=0, maximum=1)] | None = None
    stream: bool | None = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Refused unless empty or unset: the mock keeps no responses and calls no tools.
    previous_response_id: Annotated[str | None, _only({"type": "null"}, "null")] = None
    background: Annotated[
        bool | None, _only({"anyOf": [{"const": False}, {"type": "null"}]}, "false")
    ] = False
    tools: Annotated[
        list[dict[str, Any]] | None,
        _only({"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]}, "[]"),
    ] = None


class GenerateSamplingParams(_Knobs):
    """vLLM's SamplingParams as POST /inference/v1/generate takes them (what the mock uses,
    and the common rest, typed)."""

    max_tokens: PositiveInt | None = None  # None: as many as the context leaves
    detokenize: bool = True
    logprobs: Annotated[NonNegInt | None, _only({"type": "null"}, "null")] = None


class GenerateRequest(_Open):
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


def _prompt_or_messages(schema: dict[str, Any]) -> None:
    # The server answers a 400 unless exactly one of the two is given.
    schema["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"},
                                                "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"},
                                                  "prompt": {"type": "null"}}},
    ]  # fmt: skip


class TokenizeRequest(_Open):
    """POST /tokenize: a prompt, or chat messages."""

    model_config = ConfigDict(json_schema_extra=_prompt_or_messages)

    model: ModelName | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Open):
    """POST /detokenize."""

    model: ModelName | None = None
    tokens: list[TokenId]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vllm"
    root: str
    parent: str | None = None
    max_model_len: int
