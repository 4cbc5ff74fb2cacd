"""Tokenizer routes, as vLLM's: POST /tokenize and POST /detokenize."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from mocker.api.dependencies import State
from mocker.api.errors import OpenAIError
from mocker.api.inputs import check_model, check_token_ids, message_dicts, template_kwargs
from mocker.api.prepare import off_loop_if_long
from mocker.api.responses import json_response
from mocker.api.tokenizer_bodies import DetokenizeRequest, TokenizeRequest
from mocker.tokenizer import ChatTemplateError, TextTokenizer

__all__ = ["router"]

router = APIRouter()


def _chat_ids(tok: TextTokenizer, body: TokenizeRequest) -> list[int]:
    assert body.messages is not None
    try:
        text = tok.render_chat(
            message_dicts(body.messages),
            add_generation_prompt=body.add_generation_prompt,
            template_kwargs=template_kwargs(body.tools, None),
        )
    except ChatTemplateError as exc:
        raise OpenAIError(400, str(exc), "messages") from None
    # As vLLM: a rendered chat gets no special tokens added unless asked (the template
    # writes its own, as completions render it).
    return tok.encode(text, add_special_tokens=bool(body.add_special_tokens))


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, state: State) -> Response:
    check_model(state.settings, body.model)
    tok = state.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise OpenAIError(400, "Give exactly one of 'prompt' or 'messages'.", "prompt")

    def count() -> tuple[list[int], list[str | None] | None]:
        if body.messages is not None:
            ids = _chat_ids(tok, body)
        else:
            add = True if body.add_special_tokens is None else body.add_special_tokens
            ids = tok.encode(body.prompt or "", add_special_tokens=add)
        return ids, ([tok.id_to_token(t) for t in ids] if body.return_token_strs else None)

    ids, strs = await off_loop_if_long((body.prompt, body.messages), count)
    return json_response(
        {
            "count": len(ids),
            "max_model_len": state.config.scheduler.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }
    )


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, state: State) -> Response:
    check_model(state.settings, body.model)
    check_token_ids(state.tokenizer, body.tokens, "tokens")
    return json_response({"prompt": state.tokenizer.decode(body.tokens)})
