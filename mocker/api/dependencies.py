"""What routes get from FastAPI per request: the server state, the headers, the intake gate."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from mocker.api.errors import OpenAIError
from mocker.api.serving import RequestHeaders
from mocker.api.state import ServerState

__all__ = ["Headers", "State", "accepting", "get_state"]


async def get_state(request: Request) -> ServerState:
    # async: FastAPI runs a plain `def` dependency in a worker thread, a thread hop (and GIL
    # contention with the engine loop) on every request.
    state: ServerState = request.app.state.mocker
    return state


State = Annotated[ServerState, Depends(get_state)]


async def request_headers(
    x_request_id: Annotated[str | None, Header()] = None,
    x_data_parallel_rank: Annotated[str | None, Header()] = None,
    x_mocker_fail: Annotated[str | None, Header()] = None,
) -> RequestHeaders:
    return RequestHeaders(x_request_id or None, x_data_parallel_rank, x_mocker_fail)


# The headers a generation route reads, as one dependency.
Headers = Annotated[RequestHeaders, Depends(request_headers)]


async def accepting(state: State) -> None:
    """503 for new generation work while the server drains or is still starting."""
    if state.draining:
        raise OpenAIError(503, "The server is shutting down; send the request elsewhere.")
    if state.starting:
        raise OpenAIError(503, "The server is starting up (--startup-delay); retry shortly.")
