"""The two generation routes served straight from the ASGI scope; FastAPI only when needed.

FastAPI's way to a generation endpoint (nine middleware and router layers, a Request
object, dependency solving, the body read and parsed through them) cost about a tenth of
the server's time in a 500-stream run of 200-token streams, more than the endpoint itself,
and most of a short request's handling. A POST to `/v1/completions` or
`/v1/chat/completions` whose body is a JSON object the request model accepts is served
here: the same model, the same serving call, the same responses and error handlers' output.
Anything else (a body that is not JSON or does not validate, another content type, a client
gone while sending) goes to the FastAPI app with its body handed back, so every error a
client can make is answered by the one path that always answered it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope

from mocker.api.asgi_send import StartWatch
from mocker.api.auth import check_bearer
from mocker.api.chat_bodies import ChatCompletionRequest
from mocker.api.completion_bodies import CompletionRequest
from mocker.api.dependencies import check_accepting
from mocker.api.errors import OpenAIError, openai_error_response, unexpected_error_response
from mocker.api.headers import RequestHeaders
from mocker.api.json_body import loads
from mocker.api.lifecycle import OpenResponses
from mocker.api.prepare import Prepared, prepare_chat, prepare_completion
from mocker.api.state import ServerState
from mocker.tokenizer import TextTokenizer

__all__ = ["DirectRoutes"]

Handler = Callable[[Any, RequestHeaders, Prepared | None], Response]
Preparer = Callable[[TextTokenizer, Any, OpenResponses], Awaitable[Prepared | None]]


class _Route(NamedTuple):
    model: type[BaseModel]
    handle: Handler
    prepare: Preparer  # a long input's tokens, computed off the loop


def _json_content(content_type: bytes | None) -> bool:
    """Whether FastAPI parses the body as JSON: a Content-Type of application/json or
    application/*+json, parameters allowed (none at all: not, its strict_content_type)."""
    if not content_type:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    if media.count(b"/") != 1:  # the email parser FastAPI uses calls that text/plain
        return False
    return media == b"application/json" or (
        media.startswith(b"application/") and media.endswith(b"+json")
    )


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body, or None if the client went away while sending it."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # http.disconnect
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body already read given back first, for the FastAPI app."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class DirectRoutes:
    """Serves the generation POSTs of a server state; `route` says which requests it takes."""

    __slots__ = ("_api_key", "_routes", "_state")

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._api_key = state.settings.api_key or None  # (create_app: only a set key)
        serving = state.serving
        self._routes = {
            "/v1/completions": _Route(CompletionRequest, serving.completions, prepare_completion),
            "/v1/chat/completions": _Route(ChatCompletionRequest, serving.chat, prepare_chat),
        }

    def route(self, scope: Scope) -> _Route | None:
        if scope["method"] != "POST":
            return None
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        if root and path.startswith(root + "/"):
            path = path[len(root) :]  # behind a proxy's root_path, as Starlette routes it
        return self._routes.get(path)

    async def serve(
        self,
        route: _Route,
        scope: Scope,
        receive: Receive,
        send: StartWatch,
        app: ASGIApp,
    ) -> None:
        """Serve one request `route` took; `app` (FastAPI) answers what this does not."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of each, as Starlette's Headers.get
        body = await _read_body(receive)
        if body is None:
            return  # gone before the request was whole: nobody to answer
        try:
            if not body or not _json_content(headers.get(b"content-type")):
                raise ValueError("not for the direct path")
            # As FastAPI parses it (json_body: the stdlib's values, orjson's speed).
            request = route.model.model_validate(loads(body), from_attributes=True)
        except Exception:
            # Whatever FastAPI makes of it (a 400 naming the field, a 415...), it answers.
            await app(scope, _replaying(body, receive), send)
            return
        try:
            response = await self._respond(route, request, headers)
            await response(scope, receive, send)
        except OpenAIError as exc:
            if not send.started:
                await openai_error_response(exc)(scope, receive, send)
                return
            unexpected_error_response("POST", scope["path"], exc)  # logged, as Starlette does
            raise
        except Exception as exc:
            # As Starlette's error middleware: logged and answered with a 500 if nothing was
            # sent yet, then raised, so that the server closes the connection.
            reply = unexpected_error_response("POST", scope["path"], exc)
            if not send.started:
                await reply(scope, receive, send)
            raise

    async def _respond(
        self, route: _Route, request: BaseModel, headers: dict[bytes, bytes]
    ) -> Response:
        if self._api_key is not None:
            check_bearer(_text(headers.get(b"authorization")), self._api_key, "API key")
        check_accepting(self._state)
        serving = self._state.serving
        prepared = await route.prepare(serving.tokenizer, request, serving.open)
        return route.handle(
            request,
            RequestHeaders(
                _text(headers.get(b"x-request-id")) or None,
                _text(headers.get(b"x-data-parallel-rank")),
                _text(headers.get(b"x-mocker-fail")),
                _text(headers.get(b"x-session-id")),
            ),
            prepared,
        )


def _text(value: bytes | None) -> str | None:
    """A header value as Starlette decodes it (latin-1)."""
    return None if value is None else value.decode("latin-1")
