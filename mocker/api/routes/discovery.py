"""What routers probe on a worker beyond vLLM's OpenAI routes: server and model info, load, and
a cache flush, in the shapes vllm-router, sglang-router and the SGLang server use.

vLLM serves /server_info (in dev mode) and /kv_event_sources (mocker.api.routes.operations);
/get_server_info, /model_info, /get_model_info, /get_load and /flush_cache are the SGLang
server's, added for compatibility: both routers call them.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from starlette.responses import PlainTextResponse, Response

from mocker.api.dependencies import State
from mocker.api.responses import json_response
from mocker.api.routes.operations import reset_cache
from mocker.api.server_info import model_info, server_info, sglang_load, total_load

__all__ = ["router"]

router = APIRouter()

# The SGLang server's answer to a flush (plain text).
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)


@router.get("/server_info")
@router.get("/get_server_info")
async def get_server_info(
    state: State, config_format: Literal["text", "json"] = "text"
) -> Response:
    return json_response(server_info(state, config_format))


@router.get("/model_info")
@router.get("/get_model_info")
async def get_model_info(state: State) -> Response:
    return json_response(model_info(state))


@router.get("/get_load")
async def get_load(state: State) -> Response:
    """vllm-router's `{"load": n}` (running + waiting requests), or with --get-load-format
    sglang the SGLang server's list, one entry per rank (sglang-router sums `num_tokens`).
    Both routers send the same bare GET, so the flag decides."""
    if state.settings.get_load_format == "sglang":
        return json_response(sglang_load(state))
    return json_response({"load": total_load(state)})


@router.post("/flush_cache")
@router.get("/flush_cache")
async def flush_cache(state: State) -> Response:
    """As POST /reset_prefix_cache (blocks nobody references are dropped), answered as SGLang."""
    await reset_cache(state)
    return PlainTextResponse(FLUSHED)
