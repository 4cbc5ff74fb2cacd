"""Long prompts and chats tokenized in a worker thread before their route runs, as vLLM's API
server tokenizes off its serving loop: one 10 MB prompt never stalls every other stream."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel

from mocker.api import responses_api
from mocker.api.chat_bodies import ChatCompletionRequest, ResponsesRequest
from mocker.api.completion_bodies import CompletionRequest
from mocker.api.errors import OpenAIError
from mocker.api.inputs import chat_prompt, completion_prompts
from mocker.api.lifecycle import OpenResponses
from mocker.tokenizer import UNLOCKED_CHARS, TextTokenizer

__all__ = [
    "Prepared",
    "is_long",
    "off_loop_if_long",
    "prepare_chat",
    "prepare_completion",
    "prepare_responses",
]

T = TypeVar("T")


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
    """The characters of text a prompt, an input or a message list carries (token ids count
    none)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(_chars(v) for v in value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, BaseModel):
        return sum(_chars(v) for v in value.__dict__.values()) + _chars(value.model_extra)
    return 0


def is_long(value: Any) -> bool:
    """Whether tokenizing this text belongs off the event loop."""
    return _chars(value) >= UNLOCKED_CHARS


def _outcome(make: Callable[[], list[list[int]]]) -> Prepared:
    try:
        return Prepared(make(), None)
    except OpenAIError as exc:
        return Prepared([], exc)


async def _off_loop(open_responses: OpenResponses, make: Callable[[], list[list[int]]]) -> Prepared:
    # Accepted work from here on: a drain waits for it as for an open response.
    open_responses.count += 1
    try:
        return await asyncio.to_thread(_outcome, make)
    finally:
        open_responses.count -= 1


async def prepare_completion(
    tokenizer: TextTokenizer, body: CompletionRequest, open_responses: OpenResponses
) -> Prepared | None:
    """A long text prompt's token ids, computed in a thread (None: short enough for the
    loop)."""
    if not is_long(body.prompt):
        return None
    return await _off_loop(open_responses, lambda: completion_prompts(tokenizer, body.prompt))


async def prepare_chat(
    tokenizer: TextTokenizer, body: ChatCompletionRequest, open_responses: OpenResponses
) -> Prepared | None:
    """A long chat's rendered token ids, computed in a thread (None: short enough)."""
    if not is_long(body.messages):
        return None
    return await _off_loop(open_responses, lambda: [chat_prompt(tokenizer, body)])


async def prepare_responses(
    tokenizer: TextTokenizer, body: ResponsesRequest, open_responses: OpenResponses
) -> Prepared | None:
    """A long Responses input's rendered token ids (None: short enough, or an input the
    route refuses on its own, in its usual order)."""
    if not is_long(body.input):
        return None

    def render() -> list[list[int]]:
        try:
            with responses_api.named_as_sent():
                chat = ChatCompletionRequest.model_validate(responses_api.chat_fields(body))
        except Exception:
            return []  # (refused on the loop as usual: nothing to prepare)
        return [chat_prompt(tokenizer, chat)]

    prepared = await _off_loop(open_responses, render)
    return prepared if prepared.prompts or prepared.error is not None else None


async def off_loop_if_long(value: Any, make: Callable[[], T]) -> T:
    """`make()` in a worker thread if `value` is long text, else here (tokenize's way)."""
    if not is_long(value):
        return make()
    return await asyncio.to_thread(make)
