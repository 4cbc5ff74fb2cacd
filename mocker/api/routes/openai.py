"""OpenAI routes under /v1: completions, chat completions (and vLLM's render of each), responses,
models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from mocker.api.chat_bodies import ChatCompletionRequest, ResponsesRequest
from mocker.api.completion_bodies import CompletionRequest
from mocker.api.dependencies import (
    HEADER_PARAMETERS,
    SESSION_HEADER_PARAMETERS,
    State,
    check_accepting,
    request_headers,
    server_state,
)
from mocker.api.prepare import prepare_chat, prepare_completion, prepare_responses
from mocker.api.response_schemas import ModelCard
from mocker.api.responses import json_response

__all__ = ["router"]

# With --api-key, create_app adds `require_api_key` to every route here.
router = APIRouter(prefix="/v1")


@router.post("/completions", openapi_extra=SESSION_HEADER_PARAMETERS)
async def completions(body: CompletionRequest, request: Request) -> Response:
    state = server_state(request)
    check_accepting(state)
    prepared = await prepare_completion(state.serving.tokenizer, body, state.serving.open)
    return state.serving.completions(body, request_headers(request), prepared)


@router.post("/chat/completions", openapi_extra=SESSION_HEADER_PARAMETERS)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state = server_state(request)
    check_accepting(state)
    prepared = await prepare_chat(state.serving.tokenizer, body, state.serving.open)
    return state.serving.chat(body, request_headers(request), prepared)


@router.post("/responses", openapi_extra=SESSION_HEADER_PARAMETERS)
async def responses(body: ResponsesRequest, request: Request) -> Response:
    state = server_state(request)
    check_accepting(state)
    prepared = await prepare_responses(state.serving.tokenizer, body, state.serving.open)
    return state.serving.responses(body, request_headers(request), prepared)


@router.post("/completions/render", openapi_extra=HEADER_PARAMETERS)
async def render_completions(body: CompletionRequest, request: Request) -> Response:
    serving = server_state(request).serving
    prepared = await prepare_completion(serving.tokenizer, body, serving.open)
    return serving.render_completions(body, request_headers(request), prepared)


@router.post("/chat/completions/render", openapi_extra=HEADER_PARAMETERS)
async def render_chat(body: ChatCompletionRequest, request: Request) -> Response:
    serving = server_state(request).serving
    prepared = await prepare_chat(serving.tokenizer, body, serving.open)
    return serving.render_chat(body, request_headers(request), prepared)


@router.get("/models")
async def models(state: State) -> Response:
    settings = state.settings
    cards = [
        ModelCard(
            id=name,
            created=state.created,
            root=settings.model,
            max_model_len=state.config.scheduler.max_model_len,
        ).model_dump()
        for name in settings.served_model_names
    ]
    cards += state.serving.loras.cards(state.created)
    return json_response({"object": "list", "data": cards})
