"""What routes get per request: the server state, the headers, the intake gate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from mocker.api.errors import OpenAIError
from mocker.api.headers import RequestHeaders
from mocker.api.state import ServerState

__all__ = [
    "HEADER_PARAMETERS",
    "SESSION_HEADER_PARAMETERS",
    "State",
    "check_accepting",
    "get_state",
    "request_headers",
    "server_state",
]


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


def request_headers(request: Request) -> RequestHeaders:
    """The headers a generation route reads, taken from the request itself: as a FastAPI
    dependency with three Header() parameters they cost each request about a tenth of
    its whole handling (each one solved and validated on its own)."""
    get = request.headers.get
    return RequestHeaders(
        get("x-request-id") or None,
        get("x-data-parallel-rank"),
        get("x-mocker-fail"),
        get("x-session-id"),
    )


def _header(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "description": description,
    }


# The same headers in a generation route's OpenAPI operation (openapi_extra): documented as
# FastAPI would document Header() parameters.
HEADER_PARAMETERS: dict[str, Any] = {
    "parameters": [
        _header("x-request-id", "The request id (echoed back; vLLM's X-Request-Id)."),
        _header(
            "x-data-parallel-rank",
            "Pins the request to this data-parallel rank (vLLM's header).",
        ),
        _header("x-mocker-fail", "An injected fault for this request (docs/fault-injection.md)."),
    ]
}
# The routes that read a session (completions, chat, responses, generate), as vLLM 0.34's.
SESSION_HEADER_PARAMETERS: dict[str, Any] = {
    "parameters": [
        *HEADER_PARAMETERS["parameters"],
        _header("x-session-id", "The session of related requests (vLLM 0.34's header)."),
    ]
}


def check_accepting(state: ServerState) -> None:
    """503 for new generation work while the server drains or is still starting."""
    if state.draining:
        raise OpenAIError(503, "The server is shutting down; send the request elsewhere.")
    if state.starting:
        raise OpenAIError(503, "The server is starting up (--startup-delay); retry shortly.")
