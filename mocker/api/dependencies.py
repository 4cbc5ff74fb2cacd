"""What routes get per request: the server state, the headers, the intake gate."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from mocker.api.errors import OpenAIError
from mocker.api.serving import RequestHeaders
from mocker.api.state import ServerState

__all__ = ["Headers", "State", "check_accepting", "get_state", "server_state"]


def server_state(request: Request) -> ServerState:
    """The state create_app put on the app (the generation routes read it so, directly:
    every dependency FastAPI solves costs each request tens of microseconds)."""
    state: ServerState = request.app.state.mocker
    return state


async def get_state(request: Request) -> ServerState:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a thread hop (and GIL
    # contention with the engine loop) on every request.
    return server_state(request)


State = Annotated[ServerState, Depends(get_state)]


async def request_headers(
    x_request_id: Annotated[str | None, Header()] = None,
    x_data_parallel_rank: Annotated[str | None, Header()] = None,
    x_mocker_fail: Annotated[str | None, Header()] = None,
) -> RequestHeaders:
    return RequestHeaders(x_request_id or None, x_data_parallel_rank, x_mocker_fail)


# The headers a generation route reads, as one dependency.
Headers = Annotated[RequestHeaders, Depends(request_headers)]


def check_accepting(state: ServerState) -> None:
    """503 for new generation work while the server drains or is still starting."""
    if state.draining:
        raise OpenAIError(503, "The server is shutting down; send the request elsewhere.")
    if state.starting:
        raise OpenAIError(503, "The server is starting up (--startup-delay); retry shortly.")
