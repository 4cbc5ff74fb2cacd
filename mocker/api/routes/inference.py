"""vLLM's token-in/token-out route: POST /inference/v1/generate (llm-d sends token ids)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from mocker.api.completion_bodies import GenerateRequest
from mocker.api.dependencies import (
    SESSION_HEADER_PARAMETERS,
    check_accepting,
    request_headers,
    server_state,
)

__all__ = ["router"]

# With --api-key, create_app adds `require_api_key` here too.
router = APIRouter(prefix="/inference/v1")


@router.post("/generate", openapi_extra=SESSION_HEADER_PARAMETERS)
async def generate(body: GenerateRequest, request: Request) -> Response:
    state = server_state(request)
    check_accepting(state)
    return state.serving.generate(body, request_headers(request))
