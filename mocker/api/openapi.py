"""The OpenAPI document (/openapi.json) with the running server's limits: the vocabulary,
max_model_len, the served model names and ranks written into the request schemas, and the
error responses the routes give."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from mocker.api.body_fields import (
    INT64_MAX,
    INT64_MIN,
    MARK_CHAT,
    MARK_LOGPROBS,
    MARK_MODEL,
    MARK_PROMPT_IDS,
    MARK_RANK,
    MARK_TOKEN_ID,
    UINT64_MAX,
)
from mocker.api.response_schemas import RESPONSE_MODELS, STREAMED
from mocker.config import EngineConfig
from mocker.config_choices import SchedulingPolicy
from mocker.faults import FAULT_HEADER
from mocker.settings import ServerSettings
from mocker.tokenizer import TextTokenizer

__all__ = ["describe_openapi", "openapi_with_limits"]

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "ErrorResponse",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"type": "integer"},
            },
        }
    },
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
# Free-form values (fields the server keeps but does not read, tools, chat_template_kwargs):
# any JSON whose numbers fit 64 bits, as the server checks.
_ANY_REF = {"$ref": "#/components/schemas/JsonValue"}
_ANY_SCHEMA: dict[str, Any] = {
    "title": "JsonValue",
    "description": "Any JSON value; its numbers within the 64-bit integer range.",
    "anyOf": [
        {"type": ["null", "boolean", "string"]},
        {"type": "number", "minimum": INT64_MIN, "maximum": UINT64_MAX},
        {"type": "array", "items": _ANY_REF},
        {"type": "object", "additionalProperties": _ANY_REF},
    ],
}
# Messages that carry some text: with a chat template that renders no text of its own, the
# server refuses messages that render to an empty prompt.
_SOME_TEXT: dict[str, Any] = {
    "type": "object",
    "required": ["content"],
    "properties": {
        "content": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "array",
                    "contains": {
                        "type": "object",
                        "required": ["text"],
                        "properties": {"text": {"type": "string", "minLength": 1}},
                    },
                },
            ]
        }
    },
}


Fill = Callable[[dict[str, Any]], None]


def _fill(node: Any, fills: dict[str, Fill]) -> None:
    """Replace every marker in a schema tree with what `fills` writes for it."""
    if isinstance(node, dict):
        for marker, fill in fills.items():
            if node.pop(marker, False):
                fill(node)
        if node.get("additionalProperties") is True:
            node["additionalProperties"] = _ANY_REF
        if node.get("type") == "integer":
            # FastAPI's OpenAPI model reads bounds as floats: 2^63 - 1 came back as 2^63.
            for key in ("minimum", "maximum"):
                if isinstance(node.get(key), float):
                    node[key] = max(INT64_MIN, min(INT64_MAX, int(node[key])))
        for value in node.values():
            _fill(value, fills)
    elif isinstance(node, list):
        for value in node:
            _fill(value, fills)


def _chat_needs_text(tokenizer: TextTokenizer) -> bool:
    """Whether messages without text render to no tokens (the plain template's case)."""
    try:
        return not tokenizer.encode_chat(
            [{"role": "user", "content": ""}], add_generation_prompt=False
        )
    except Exception:  # a template that fails on an empty message: no rule to state
        return False


def openapi_with_limits(
    document: dict[str, Any],
    settings: ServerSettings,
    config: EngineConfig,
    tokenizer: TextTokenizer,
) -> dict[str, Any]:
    """`document` (FastAPI's OpenAPI dict, changed in place) with this server's limits and
    error responses: what it refuses is left out, so generated requests are served."""
    names = list(dict.fromkeys([*settings.served_model_names, settings.model,
                                *(m.name for m in settings.lora_modules)]))  # fmt: skip
    ranks = settings.data_parallel_size
    needs_text = _chat_needs_text(tokenizer)

    def model(node: dict[str, Any]) -> None:
        node["enum"] = names

    def rank(node: dict[str, Any]) -> None:
        node["maximum"] = ranks - 1

    def token_id(node: dict[str, Any]) -> None:
        node["maximum"] = tokenizer.vocab_size - 1

    def prompt_ids(node: dict[str, Any]) -> None:
        node["maxItems"] = config.scheduler.max_model_len - 1  # and one token of room to generate

    def chat(node: dict[str, Any]) -> None:
        if needs_text:
            node["contains"] = _SOME_TEXT

    def logprobs(node: dict[str, Any]) -> None:
        limit = settings.max_logprobs
        node["maximum"] = tokenizer.vocab_size if limit == -1 else limit

    fills: dict[str, Fill] = {
        MARK_MODEL: model, MARK_RANK: rank, MARK_TOKEN_ID: token_id,
        MARK_PROMPT_IDS: prompt_ids, MARK_CHAT: chat, MARK_LOGPROBS: logprobs,
    }  # fmt: skip
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    _fill(schemas, fills)
    _server_rules(document, schemas, config)
    # (After the fill: what a response carries beyond its typed fields is any JSON at all.)
    _add_response_bodies(document, schemas)
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["ErrorResponse"] = _ERROR_SCHEMA
    schemas["JsonValue"] = _ANY_SCHEMA
    for path, operations in document.get("paths", {}).items():
        for operation in operations.values():
            _fill(operation, fills)
            _describe_operation(path, operation, ranks)
    return document


# Routes that answer with no JSON: an empty 200 (vLLM's /health and SageMaker's /ping), the
# Prometheus text format, SGLang's plain-text /flush_cache.
_EMPTY = {"/health", "/ping"}
_PLAIN_TEXT = {"/metrics": "text/plain", "/flush_cache": "text/plain"}
_REF = "#/components/schemas/{model}"
# One server-sent event of a stream ("stream": true): its data a JSON chunk, or [DONE].
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}


def _add_response_bodies(document: dict[str, Any], schemas: dict[str, Any]) -> None:
    """The 200 bodies' schemas (response_schemas.py) and media types of the routes."""
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            ok = operation.setdefault("responses", {}).setdefault("200", {})
            if path in _EMPTY:
                ok.pop("content", None)
                ok["description"] = "Healthy (an empty body)"
                operation["responses"]["503"] = {
                    "description": "An engine is dead, or the server drains or starts (an "
                    "empty body)"
                }
                continue
            if path in _PLAIN_TEXT:
                ok["content"] = {_PLAIN_TEXT[path]: {"schema": {"type": "string"}}}
                continue
            model = RESPONSE_MODELS.get((method, path))
            if model is None:
                continue
            one = model[0] if isinstance(model, list) else model
            schema = one.model_json_schema(ref_template=_REF)
            schemas.update(schema.pop("$defs", {}))
            schemas[one.__name__] = schema
            ref: dict[str, Any] = {"$ref": _REF.format(model=one.__name__)}
            body = {"type": "array", "items": ref} if isinstance(model, list) else ref
            content = ok.setdefault("content", {})
            content["application/json"] = {"schema": body}
            if path in STREAMED:
                content["text/event-stream"] = {"schema": _SSE_EVENT}


# What the server refuses beyond the request models' types, as vLLM does: an empty stop
# string; stream options (a non-empty object) without "stream": true.
_STOP: dict[str, Any] = {
    "title": "Stop",
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}},
        {"type": "null"},
    ],
}
_STREAM_OPTIONS_NEED_STREAM: dict[str, Any] = {
    "if": {
        "required": ["stream_options"],
        "properties": {"stream_options": {"type": "object", "minProperties": 1}},
    },
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}
# Render routes take their generation route's body, but check no priority.
_RENDERS = {
    "CompletionRequest": ("/v1/completions/render", "CompletionRenderRequest"),
    "ChatCompletionRequest": ("/v1/chat/completions/render", "ChatCompletionRenderRequest"),
}
_GENERATION_BODIES = ("CompletionRequest", "ChatCompletionRequest", "GenerateRequest",
                      "ResponsesRequest", "GenerateSamplingParams")  # fmt: skip


def _server_rules(document: dict[str, Any], schemas: dict[str, Any], config: EngineConfig) -> None:
    """The generation bodies' rules the server enforces that their models do not state: the
    stop strings, stream options, and a priority only under the priority policy (which the
    render routes, which schedule nothing, do not check: their bodies get schemas of their
    own)."""
    fcfs = config.scheduler.scheduling_policy is not SchedulingPolicy.PRIORITY
    for name in _GENERATION_BODIES:
        schema = schemas.get(name)
        if schema is None:
            continue
        props = schema.setdefault("properties", {})
        if "stop" in props:
            props["stop"] = _STOP
        if "stream_options" in props:
            schema.setdefault("allOf", []).append(_STREAM_OPTIONS_NEED_STREAM)
        render = _RENDERS.get(name)
        if render is not None and render[0] in document.get("paths", {}):
            path, render_name = render
            schemas[render_name] = copy.deepcopy(schema) | {"title": render_name}
            body = document["paths"][path]["post"]["requestBody"]["content"]
            body["application/json"]["schema"] = {"$ref": _REF.format(model=render_name)}
        if name != "GenerateSamplingParams" and fcfs:
            props["priority"] = {
                "title": "Priority", "type": "integer", "const": 0, "default": 0,
                "description": "Only 0: the server schedules first come, first served "
                "(--scheduling-policy priority takes any).",
            }  # fmt: skip


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ERROR_REF}}}


def _describe_operation(path: str, operation: dict[str, Any], ranks: int) -> None:
    responses = operation.setdefault("responses", {})
    if responses.pop("422", None) is not None:  # every validation error is a 400 here
        responses["400"] = _error("Invalid request (the OpenAI error shape)")
    if "requestBody" in operation:
        responses["404"] = _error("The model is not served here")
    # Copies: the routes share their header parameters' dicts (dependencies.HEADER_PARAMETERS).
    params = [dict(p) for p in operation.get("parameters", [])]
    operation["parameters"] = params
    for param in params:
        if param.get("name") == "x-data-parallel-rank":
            param["schema"] = {"type": "string", "enum": [str(r) for r in range(ranks)]}
            param["description"] = "Pins a data-parallel rank (as the data_parallel_rank field)."
    fault = FAULT_HEADER.lower()
    if any(p.get("name") == fault for p in params):
        # A test hook, not the API: it makes the server fail on purpose (500s among them), so
        # it is not offered to generated clients and fuzzers as a parameter.
        operation["parameters"] = [p for p in params if p.get("name") != fault]
    if not operation["parameters"]:
        del operation["parameters"]
    if any(p.get("name") == fault for p in params) and not path.endswith("/render"):
        operation["description"] = (
            operation.get("description", "")
            + f"\n\nThe {FAULT_HEADER} header (none, rate_limit, overloaded, server_error, "
            "context_length, abort, or a status code) forces that failure on the request."
        ).strip()
        ok = responses.get("200", {}).get("content", {})
        ok["text/event-stream"] = {"schema": _SSE_EVENT}  # with stream: true
        responses["429"] = _error("Rate limited (an injected fault)")
        responses["500"] = _error("Internal error (an injected fault)")
        responses["503"] = _error("The engine is not running, overloaded, or starting")


def describe_openapi(
    app: FastAPI, settings: ServerSettings, config: EngineConfig, tokenizer: TextTokenizer
) -> None:
    """Serve `app`'s OpenAPI document with this server's limits (see openapi_with_limits)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_with_limits(generate(), settings, config, tokenizer)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
