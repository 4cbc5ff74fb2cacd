"""Long prompts and chats tokenized in a worker thread before their route runs, as vLLM's API
server tokenizes off its serving loop: one 10 MB prompt never stalls every other stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

from mocker.api.errors import OpenAIError
from mocker.api.inputs import chat_prompt, completion_prompts
from mocker.api.protocol import ChatCompletionRequest, CompletionRequest
from mocker.tokenizer import UNLOCKED_CHARS, TextTokenizer

__all__ = ["Prepared", "prepare_chat", "prepare_completion"]


class Prepared(NamedTuple):
    """A request's prompts as token ids, or the client error tokenizing them raised (given
    where the route would have raised it, after its other checks)."""

    prompts: list[list[int]]
    error: OpenAIError | None

    def get(self) -> list[list[int]]:
        if self.error is not None:
            raise self.error
        return self.prompts


def _chars(value: Any) -> int:
    """The characters of text a prompt or a message list carries (token ids count none)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


def _message_chars(body: ChatCompletionRequest) -> int:
    total = 0
    for m in body.messages:
        content = m.content
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(part.text or "") for part in content)
    return total


def _outcome(make: Callable[[], list[list[int]]]) -> Prepared:
    try:
        return Prepared(make(), None)
    except OpenAIError as exc:
        return Prepared([], exc)


async def prepare_completion(tokenizer: TextTokenizer, body: CompletionRequest) -> Prepared | None:
    """A long text prompt's token ids, computed in a thread (None: short enough for the
    loop)."""
    if _chars(body.prompt) < UNLOCKED_CHARS:
        return None
    return await asyncio.to_thread(_outcome, lambda: completion_prompts(tokenizer, body.prompt))


async def prepare_chat(tokenizer: TextTokenizer, body: ChatCompletionRequest) -> Prepared | None:
    """A long chat's rendered token ids, computed in a thread (None: short enough)."""
    if _message_chars(body) < UNLOCKED_CHARS:
        return None
    return await asyncio.to_thread(_outcome, lambda: [chat_prompt(tokenizer, body)])
