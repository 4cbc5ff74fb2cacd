"""Admin routes (only with --admin-token): read and change fault settings at runtime."""

from __future__ import annotations

import logging

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from mocker.api.auth import require_admin_token
from mocker.api.dependencies import State
from mocker.api.errors import OpenAIError
from mocker.api.responses import json_response

__all__ = ["router"]

logger = logging.getLogger("uvicorn.error")

router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin_token)])


@router.get("/config")
async def admin_config(state: State) -> Response:
    return json_response(state.faults.config.as_json())


@router.post("/config")
async def admin_set_config(request: Request, state: State) -> Response:
    try:
        changes = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(changes, dict):
        raise OpenAIError(400, "the request body must be a JSON object of settings")
    try:
        state.faults.config = state.faults.config.with_changes(changes)
    except (TypeError, ValueError) as exc:
        raise OpenAIError(400, str(exc)) from None
    logger.info("admin: fault settings now %s", state.faults.config.as_json())
    return json_response(state.faults.config.as_json())
