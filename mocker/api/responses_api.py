"""The OpenAI Responses API (POST /v1/responses) as vLLM serves it: text in, one message out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from pydantic import ValidationError

from mocker.api.chat_bodies import ResponsesRequest
from mocker.api.errors import OpenAIError, error_body

__all__ = ["ResponsesStreamWriter", "chat_fields", "named_as_sent", "response_object"]

# The chat request's fields a responses body's error names as the client sent them.
_SENT_AS = {"messages": "input", "max_completion_tokens": "max_output_tokens",
            "max_tokens": "max_output_tokens", "response_format": "text"}  # fmt: skip


@contextmanager
def named_as_sent() -> Iterator[None]:
    """Errors of the chat a responses body runs as, naming the fields the client sent (its
    `input`, not the chat's `messages`)."""
    try:
        yield
    except ValidationError as exc:  # a field passed on that the chat request refuses
        first = exc.errors()[0]
        loc = str(first["loc"][0]) if first["loc"] else "input"
        name = _SENT_AS.get(loc, loc)
        raise OpenAIError(400, f"{name}: {first['msg']}", name) from None
    except OpenAIError as exc:
        param = _SENT_AS.get(exc.param or "", exc.param)
        message = exc.message.replace("The messages render", "The input renders")
        for chat_name, sent in _SENT_AS.items():
            message = message.replace(chat_name, sent)
        if param != exc.param or message != exc.message:
            raise OpenAIError(exc.status, message, param, error_type=exc.error_type) from None
        raise


# Input content parts that carry text (a message's own, or an earlier answer's).
_TEXT_PARTS = ("input_text", "output_text", "text")
# The vLLM extras a responses body may carry that the chat request honours as well.
_PASSED_ON = ("ignore_eos", "min_tokens", "priority", "cache_salt", "seed", "stop",
              "stop_token_ids", "data_parallel_rank", "session_id", "vllm_xargs")  # fmt: skip


def chat_fields(body: ResponsesRequest) -> dict[str, Any]:
    """The chat request a responses body runs as (vLLM renders its input through the same
    chat template); 400s for what the mock cannot answer."""
    if body.previous_response_id is not None:
        raise OpenAIError(400, "previous_response_id is not supported by this mock server (it "
                          "stores no responses): send the whole conversation as input.",
                          "previous_response_id")  # fmt: skip
    if body.background:
        raise OpenAIError(400, "background responses are not supported by this mock server.",
                          "background")  # fmt: skip
    if body.tools:
        raise OpenAIError(400, "tools are not supported on /v1/responses by this mock server.",
                          "tools")  # fmt: skip
    extra = body.model_extra or {}
    if extra.get("top_logprobs") or "message.output_text.logprobs" in (extra.get("include") or ()):
        raise OpenAIError(400, "logprobs are not supported on /v1/responses by this mock server "
                          "(they are on /v1/completions and /v1/chat/completions).",
                          "top_logprobs")  # fmt: skip
    if isinstance(body.input, list) and not body.input:
        raise OpenAIError(400, "The input must not be empty.", "input")
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
    else:
        messages += [_message(item, i) for i, item in enumerate(body.input)]
    if not messages:
        raise OpenAIError(400, "The input must not be empty.", "input")
    text_format = (body.model_extra or {}).get("text")
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "stream": bool(body.stream),
        **{name: extra[name] for name in _PASSED_ON if name in extra},
    }
    form = text_format.get("format") if isinstance(text_format, dict) else None
    if isinstance(form, dict):
        # Accepted and not enforced, as a chat's response_format (whose json_schema nests
        # what the responses format holds flat).
        if form.get("type") == "json_schema":
            form = {"type": "json_schema",
                    "json_schema": {k: v for k, v in form.items() if k != "type"}}  # fmt: skip
        fields["response_format"] = form
    return fields


def _message(item: dict[str, Any], i: int) -> dict[str, Any]:
    """One input item as a chat message: a message of text (its parts joined)."""
    kind = item.get("type", "message")
    if kind != "message":
        raise OpenAIError(400, f"input[{i}]: only message items are supported by this mock "
                          f"server (got type {kind!r}).", "input")  # fmt: skip
    if "role" not in item:
        raise OpenAIError(400, f"input[{i}]: a message needs its role.", "input")
    role = item["role"]
    if role not in ("user", "system", "developer", "assistant"):
        raise OpenAIError(400, f"input[{i}]: unknown role {role!r}.", "input")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise OpenAIError(400, f"input[{i}]: only text content is supported by this "
                                  f"mock server (got {kind!r}).", "input")  # fmt: skip
            text = part.get("text")
            if not isinstance(text, str):
                raise OpenAIError(400, f"input[{i}]: a text part needs its text.", "input")
            texts.append(text)
        content = "".join(texts)
    elif not isinstance(content, str):
        raise OpenAIError(400, f"input[{i}]: content must be a string or a list of text "
                          "parts.", "input")  # fmt: skip
    # (vLLM's chat rendering reads a developer message as the system one)
    return {"role": "system" if role == "developer" else role, "content": content}


def response_object(
    body: ResponsesRequest,
    response_id: str,
    created: int,
    model: str,
    *,
    message_id: str,
    text: str | None,
    finish_reason: str | None,
    usage: tuple[int, int, int] | None,
) -> dict[str, Any]:
    """The response object: in progress (`text` None), or done with its one message."""
    if text is None:
        status, output, details = "in_progress", [], None
    else:
        incomplete = finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        details = {"reason": "max_output_tokens"} if incomplete else None
        output = [_message_item(message_id, text, status)]
    out: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": details,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "max_tool_calls": None,
        "metadata": body.metadata,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "auto",
        "store": False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
    }
    if usage is not None:
        prompt, completion, cached = usage
        out["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
    return out


def _message_item(message_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"id": message_id, "type": "message", "status": status, "role": "assistant",
            "content": content}  # fmt: skip


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponsesStreamWriter:
    """The events of one streamed response, for the stream renderer: `response.created`
    (and `in_progress`, the message and its text part opened) before any token, a
    `response.output_text.delta` per chunk, the text, part and message closed with the
    last, then `response.completed` (or `incomplete`) with the usage; no `[DONE]`."""

    __slots__ = ("_body", "_created", "_finish", "_id", "_item", "_model", "_seq", "_texts",
                 "preamble")  # fmt: skip

    chat = False
    with_ids = False
    continuous_usage = False
    include_usage = True  # (the last event always carries the usage)
    done = b""

    def __init__(
        self, body: ResponsesRequest, response_id: str, created: int, model: str, message_id: str
    ) -> None:
        self._body = body
        self._id = response_id
        self._created = created
        self._model = model
        self._item = message_id
        self._seq = 0
        self._texts: list[bytes] = []  # the text so far, JSON-escaped
        self._finish: str | None = None
        started = self._response(None)
        self.preamble = b"".join(
            (
                self._event("response.created", {"response": started}),
                self._event("response.in_progress", {"response": started}),
                self._event("response.output_item.added", {
                    "output_index": 0, "item": _message_item(message_id, None, "in_progress")}),
                self._event("response.content_part.added", {
                    "item_id": message_id, "output_index": 0, "content_index": 0,
                    "part": _text_part("")}),
            )
        )  # fmt: skip

    def _response(
        self, text: str | None, usage: tuple[int, int, int] | None = None
    ) -> dict[str, Any]:
        return response_object(self._body, self._id, self._created, self._model,
                               message_id=self._item, text=text, finish_reason=self._finish,
                               usage=usage)  # fmt: skip

    def _event(self, kind: str, fields: dict[str, Any]) -> bytes:
        seq = self._seq
        self._seq += 1
        data = orjson.dumps({"type": kind, "sequence_number": seq, **fields})
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def error(self, status: int, message: str) -> bytes:
        """A mid-stream error as the Responses API's `error` event."""
        kind = error_body(status, message)["error"]["type"]
        return self._event("error", {"code": kind, "message": message, "param": None})

    def text(
        self,
        index: int,
        escaped_text: bytes,
        finish_reason: str | None = None,
        stop_reason: str | int | None = None,
        usage: tuple[int, int, int] | None = None,
        token_ids: list[int] | None = None,
        prompt_ids: list[int] | None = None,
        logprobs: bytes | None = None,
    ) -> bytes:
        """A chunk's text as a delta event (already JSON-escaped); with the finish, the
        events that close the text, its part and the message."""
        out = b""
        if escaped_text:
            seq = self._seq
            self._seq += 1
            out = b"".join(
                (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                 b'"sequence_number":', str(seq).encode(), b',"item_id":"', self._item.encode(),
                 b'","output_index":0,"content_index":0,"delta":"', escaped_text,
                 b'","logprobs":[]}\n\n')
            )  # fmt: skip
            self._texts.append(escaped_text)
        if finish_reason is None:
            return out
        self._finish = finish_reason
        text = self.text_so_far
        status = "incomplete" if finish_reason == "length" else "completed"
        item = self._item
        return out + b"".join(
            (
                self._event("response.output_text.done", {
                    "item_id": item, "output_index": 0, "content_index": 0, "text": text,
                    "logprobs": []}),
                self._event("response.content_part.done", {
                    "item_id": item, "output_index": 0, "content_index": 0,
                    "part": _text_part(text)}),
                self._event("response.output_item.done", {
                    "output_index": 0, "item": _message_item(item, text, status)}),
            )
        )  # fmt: skip

    @property
    def text_so_far(self) -> str:
        text: str = orjson.loads(b'"' + b"".join(self._texts) + b'"')
        return text

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        """The last event: the whole response, with its usage."""
        response = self._response(self.text_so_far, (prompt, completion, cached))
        kind = "response.incomplete" if response["status"] == "incomplete" else (
            "response.completed")  # fmt: skip
        return self._event(kind, {"response": response})
