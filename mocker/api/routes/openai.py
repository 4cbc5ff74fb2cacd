"""OpenAI routes under /v1: completions, chat completions (and vLLM's render of each), models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from mocker.api.dependencies import Headers, State, check_accepting, server_state
from mocker.api.protocol import ChatCompletionRequest, CompletionRequest, ModelCard
from mocker.api.responses import json_response

__all__ = ["router"]

# With --api-key, create_app adds `require_api_key` to every route here.
router = APIRouter(prefix="/v1")


@router.post("/completions")
async def completions(body: CompletionRequest, headers: Headers, request: Request) -> Response:
    state = server_state(request)
    check_accepting(state)
    return state.serving.completions(body, headers)


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, headers: Headers, request: Request
) -> Response:
    state = server_state(request)
    check_accepting(state)
    return state.serving.chat(body, headers)


@router.post("/completions/render")
async def render_completions(body: CompletionRequest, headers: Headers, state: State) -> Response:
    return state.serving.render_completions(body, headers)


@router.post("/chat/completions/render")
async def render_chat(body: ChatCompletionRequest, headers: Headers, state: State) -> Response:
    return state.serving.render_chat(body, headers)


@router.get("/models")
async def models(state: State) -> Response:
    settings = state.settings
    cards = [
        ModelCard(
            id=name,
            created=state.created,
            root=settings.model,
            max_model_len=state.config.max_model_len,
        ).model_dump()
        for name in settings.served_model_names
    ]
    cards += state.serving.loras.cards(state.created)
    return json_response({"object": "list", "data": cards})
