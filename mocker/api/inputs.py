"""Request bodies to engine inputs: the served model name, prompts as token ids, chat messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mocker.api.chat_bodies import ChatCompletionRequest, ChatMessage
from mocker.api.errors import OpenAIError
from mocker.settings import ServerSettings
from mocker.tokenizer import ChatTemplateError, TextTokenizer

__all__ = [
    "chat_prompt",
    "check_model",
    "check_token_ids",
    "completion_prompts",
    "message_dicts",
    "template_kwargs",
]


def check_model(settings: ServerSettings, model: str | None) -> str:
    """The served name to answer with; 404 for a model this server does not serve."""
    names = settings.served_model_names
    if model is None or model == "":
        return names[0]
    if model not in names and model != settings.model:
        raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")
    return model if model in names else names[0]


def check_token_ids(tokenizer: TextTokenizer, ids: Sequence[int], param: str) -> None:
    vocab = tokenizer.vocab_size
    for t in ids:
        if not 0 <= t < vocab:
            raise OpenAIError(
                400, f"Token id {t} is out of vocabulary (vocab size {vocab}).", param=param
            )


def completion_prompts(tokenizer: TextTokenizer, prompt: Any) -> list[list[int]]:
    """A completion's prompt (a string, strings, token ids or lists of them): one token-id
    list per choice. Token ids are used exactly as sent (no BOS added)."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise OpenAIError(400, "The prompt must not be empty.", "prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    out: list[list[int]] = []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise OpenAIError(400, "The prompt must not be empty.", "prompt")
            ids = tokenizer.encode(p)
            if not ids:
                raise OpenAIError(400, "The prompt encodes to no tokens.", "prompt")
        else:
            ids = list(p)
            check_token_ids(tokenizer, ids, "prompt")
        out.append(ids)
    return out


def _message_dict(message: ChatMessage, i: int) -> dict[str, Any]:
    content = message.content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if part.type not in ("text", "input_text") or part.text is None:
                raise OpenAIError(
                    400,
                    f"messages[{i}]: content part type {part.type!r} is not supported "
                    "(text parts only).",
                    "messages",
                )
            texts.append(part.text)
        content = "\n".join(texts)
    out = dict(message.model_extra or {})
    out.update(role=message.role, content=content or "")
    if message.name is not None:
        out["name"] = message.name
    return out


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as a chat template sees them (text content parts joined)."""
    return [_message_dict(m, i) for i, m in enumerate(messages)]


def template_kwargs(
    tools: list[dict[str, Any]] | None, extra: dict[str, Any] | None
) -> dict[str, Any] | None:
    """What the chat template gets besides the messages: the tools (as vLLM passes them)
    and the request's chat_template_kwargs."""
    if tools is None:
        return extra
    return {"tools": tools, **(extra or {})}


def chat_prompt(tokenizer: TextTokenizer, body: ChatCompletionRequest) -> list[int]:
    """The token ids of a chat request's rendered messages."""
    try:
        prompt = tokenizer.encode_chat(
            message_dicts(body.messages),
            add_generation_prompt=body.add_generation_prompt and not body.continue_final_message,
            template_kwargs=template_kwargs(body.tools, body.chat_template_kwargs),
        )
    except ChatTemplateError as exc:
        raise OpenAIError(400, str(exc), "messages") from None
    if not prompt:
        raise OpenAIError(400, "The messages render to an empty prompt.", "messages")
    return prompt
