"""vLLM's sleep-mode development routes (with VLLM_SERVER_DEV_MODE=1): /sleep, /wake_up,
/is_sleeping."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from mocker.api.dependencies import State
from mocker.api.errors import OpenAIError
from mocker.api.responses import json_response
from mocker.engine.stream import EngineDeadError

__all__ = ["dev_mode", "router"]

router = APIRouter()


def dev_mode() -> bool:
    """vLLM's VLLM_SERVER_DEV_MODE (an integer, non-zero: the development routes are served)."""
    try:
        return bool(int(os.environ.get("VLLM_SERVER_DEV_MODE", "0")))
    except ValueError:
        return False


@router.post("/sleep")
async def sleep(
    state: State,
    level: Annotated[int, Query(ge=0, le=2)] = 1,
    mode: Annotated[Literal["abort", "wait", "keep"], Query()] = "abort",
    reset_connector: Annotated[bool, Query()] = True,
) -> Response:
    """Pause scheduling (level 0), and from level 1 drop the KV cache; new requests wait."""
    try:
        await state.engines.fall_asleep(level, mode)
    except EngineDeadError as exc:
        raise OpenAIError(503, f"The engine is not running: {exc}") from None
    return json_response({"status": "sleeping", "level": level})


@router.post("/wake_up")
async def wake_up(request: Request, state: State) -> Response:
    """Wake the memory named by `tags` (all without any); scheduling resumes when all is."""
    tags: list[str] | None = request.query_params.getlist("tags") or None
    fully_awake = state.engines.wake_up(tags)
    return json_response({"status": "awake" if fully_awake else "sleeping", "tags": tags})


@router.get("/is_sleeping")
async def is_sleeping(state: State) -> Response:
    return json_response({"is_sleeping": state.engines.is_sleeping})
