"""Operations routes: health, ping, version, metrics, KV-event sources, prefix-cache reset."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from mocker import __version__
from mocker.api.dependencies import State
from mocker.api.errors import OpenAIError
from mocker.api.responses import json_response
from mocker.api.state import ServerState
from mocker.engine.live import EngineDeadError
from mocker.kvevents.config import advertised_host, connectable

__all__ = ["kv_event_sources", "router"]

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
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)


def kv_event_sources(state: ServerState) -> dict[str, object]:
    """Where a consumer subscribes to this server's KV events (GET /kv_event_sources)."""
    settings, publishers = state.settings, state.publishers
    host = advertised_host(settings.host)
    sources = [
        {
            "data_parallel_rank": publisher.rank,
            "endpoint": publisher.endpoint,
            # bind: subscribe by connecting to `connect`; connect: the engine dials the
            # consumer's own bound socket at `endpoint`.
            "mode": "bind" if publisher.binds else "connect",
            "connect": connectable(publisher.endpoint, host) if publisher.binds else None,
            "replay_endpoint": publisher.replay_endpoint,
            "replay_connect": connectable(publisher.replay_endpoint, host)
            if publisher.replay_endpoint is not None
            else None,
            "topic": publisher.topic,
            "next_seq": publisher.next_seq,
        }
        for publisher in publishers
    ]
    return {
        "enabled": bool(publishers),
        "publisher": settings.kv_events.publisher if publishers else "null",
        "format": settings.kv_events_format.value,
        "model": settings.model_name,
        "block_size": state.config.block_size,
        "data_parallel_size": len(state.engines),
        "sources": sources,
    }


@router.get("/kv_event_sources")
async def event_sources(state: State) -> Response:
    return json_response(kv_event_sources(state))


@router.post("/reset_prefix_cache")
async def reset_prefix_cache(state: State) -> Response:
    try:
        cleared = await state.engines.reset_prefix_cache()
    except EngineDeadError as exc:
        raise OpenAIError(503, f"The engine is not running: {exc}") from None
    return json_response({"cleared_blocks": cleared})
