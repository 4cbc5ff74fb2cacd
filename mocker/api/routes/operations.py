"""Operations routes: health, ping, version, metrics, KV-event sources, prefix-cache reset."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from mocker import __version__
from mocker.api.dependencies import State
from mocker.api.errors import OpenAIError
from mocker.api.responses import json_response
from mocker.api.server_info import kv_event_sources
from mocker.api.state import ServerState
from mocker.engine.live import EngineDeadError

__all__ = ["reset_cache", "router"]

router = APIRouter()


def _health(state: ServerState) -> Response:
    """200 with an empty body; 503 once an engine is dead, while draining or starting."""
    if state.engines.is_dead or state.draining or state.starting:
        return Response(status_code=503)
    return Response(status_code=200)


@router.get("/health")
async def health(state: State) -> Response:
    return _health(state)


@router.get("/ping")
async def ping(state: State) -> Response:
    return _health(state)


@router.post("/ping")
async def ping_post(state: State) -> Response:
    return _health(state)


@router.get("/version")
async def version() -> Response:
    return json_response({"version": __version__})


@router.get("/metrics")
async def metrics(state: State) -> Response:
    return Response(state.exposition.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/kv_event_sources")
async def event_sources(state: State) -> Response:
    return json_response(kv_event_sources(state))


async def reset_cache(
    state: ServerState, *, whole: bool = False, reset_running: bool = False
) -> tuple[bool, int]:
    """Drop every device block nobody references, on every rank (`whole`: all or nothing,
    as vLLM 0.34); whether every rank's reset succeeded, and how many blocks went."""
    try:
        return await state.engines.reset_prefix_cache(whole=whole, reset_running=reset_running)
    except EngineDeadError as exc:
        raise OpenAIError(503, f"The engine is not running: {exc}") from None


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(
    state: State,
    reset_running_requests: Annotated[bool, Query()] = False,
    reset_external: Annotated[bool, Query()] = False,
) -> Response:
    """vLLM 0.34's: the device prefix cache cleared only when no block is referenced (else
    `success` false, nothing cleared), after preempting the running requests with
    `reset_running_requests`; `cleared_blocks` is mocker's. (`reset_external`, vLLM's
    connector reset, is accepted: the tiers keep what they hold.)"""
    ok, cleared = await reset_cache(state, whole=True, reset_running=reset_running_requests)
    return json_response({"success": ok, "cleared_blocks": cleared})
