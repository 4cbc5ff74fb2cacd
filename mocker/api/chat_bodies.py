"""The chat bodies: POST /v1/chat/completions, and POST /v1/responses (served as a chat)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, WithJsonSchema

from mocker.api.body_fields import (
    MARK_CHAT,
    GenerationFields,
    Int64,
    ModelName,
    OpenBody,
    PositiveInt,
    logprobs_schema,
    only_schema,
    schema_range,
)

__all__ = ["ChatCompletionRequest", "ChatMessage", "ResponsesRequest"]


def _text_part(schema: dict[str, Any]) -> None:
    # The server joins the text of text parts and refuses every other kind (a 400).
    props = schema["properties"]
    props["type"] = {"type": "string", "enum": ["text", "input_text"], "title": "Type"}
    props["text"] = {"type": "string", "title": "Text"}
    schema["required"] = ["type", "text"]


class ContentPart(OpenBody):
    model_config = ConfigDict(json_schema_extra=_text_part)

    type: str
    text: str | None = None


class ChatMessage(OpenBody):
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


class ChatCompletionRequest(GenerationFields):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(json_schema_extra=_chat_rules)

    messages: Annotated[list[ChatMessage], Field(min_length=1, json_schema_extra={MARK_CHAT: True})]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[Int64 | None, WithJsonSchema(logprobs_schema("top_logprobs"))] = None
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


class ResponsesRequest(OpenBody):
    """POST /v1/responses (the OpenAI Responses API, as vLLM serves it): text input rendered
    by the chat template, one message out (mocker.api.responses_api)."""

    model: ModelName | None = None
    input: Annotated[str | list[dict[str, Any]], WithJsonSchema(_RESPONSES_INPUT_SCHEMA)]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Annotated[float, schema_range(minimum=0, maximum=2)] | None = None
    top_p: Annotated[float, schema_range(exclusiveMinimum=0, maximum=1)] | None = None
    stream: bool | None = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Refused unless empty or unset: the mock keeps no responses and calls no tools.
    previous_response_id: Annotated[str | None, only_schema({"type": "null"}, "null")] = None
    background: Annotated[
        bool | None, only_schema({"anyOf": [{"const": False}, {"type": "null"}]}, "false")
    ] = False
    tools: Annotated[
        list[dict[str, Any]] | None,
        only_schema({"anyOf": [{"type": "array", "maxItems": 0}, {"type": "null"}]}, "[]"),
    ] = None
