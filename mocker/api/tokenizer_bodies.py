"""The tokenizer bodies: POST /tokenize (a prompt, or chat messages) and POST /detokenize."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from mocker.api.body_fields import ModelName, OpenBody, TokenId
from mocker.api.chat_bodies import ChatMessage

__all__ = ["DetokenizeRequest", "TokenizeRequest"]


def _prompt_or_messages(schema: dict[str, Any]) -> None:
    # The server answers a 400 unless exactly one of the two is given.
    schema["oneOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"},
                                                "messages": {"type": "null"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"},
                                                  "prompt": {"type": "null"}}},
    ]  # fmt: skip


class TokenizeRequest(OpenBody):
    """POST /tokenize: a prompt, or chat messages."""

    model_config = ConfigDict(json_schema_extra=_prompt_or_messages)

    model: ModelName | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(OpenBody):
    """POST /detokenize."""

    model: ModelName | None = None
    tokens: list[TokenId]
