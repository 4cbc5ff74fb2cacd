"""OpenAI-shaped errors: one exception type, and handlers that turn every failure into one."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

__all__ = [
    "OpenAIError",
    "error_body",
    "error_response",
    "install_error_handlers",
    "openai_error_response",
    "unexpected_error_response",
]

logger = logging.getLogger(__name__)

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    """A failure to report as `{"error": {message, type, param, code}}` with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        *,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.error_type = error_type  # vLLM's own `type` where it differs (InvalidUserInput)


def error_body(
    status: int, message: str, param: str | None = None, error_type: str | None = None
) -> dict[str, Any]:
    kind = error_type or _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
    error_type: str | None = None,
) -> Response:
    try:
        body = orjson.dumps(error_body(status, message, param, error_type))
    except TypeError:  # e.g. a lone surrogate echoed from the request
        safe = message.encode("utf-8", "replace").decode()
        body = orjson.dumps(error_body(status, safe, None))
    return Response(
        body,
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def openai_error_response(exc: OpenAIError) -> Response:
    return error_response(exc.status, exc.message, exc.param, error_type=exc.error_type)


def unexpected_error_response(method: str, path: str, exc: Exception) -> Response:
    """A bug, not the client's fault: logged, answered in the OpenAI shape, no traceback out."""
    logger.exception("unhandled error on %s %s", method, path, exc_info=exc)
    return error_response(500, f"internal error: {type(exc).__name__}")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable line per problem, e.g. `max_tokens: Input should be greater than 0`."""
    lines: list[str] = []
    param: str | None = None
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc)
        if err.get("type") == "json_invalid":
            ctx = err.get("ctx") or {}
            lines.append(f"the request body is not valid JSON: {ctx.get('error', 'invalid')}")
            continue
        if not loc and err.get("type") in ("missing", "model_attributes_type", "dict_type"):
            lines.append(
                "the request body must be a JSON object (send Content-Type: application/json)"
            )
            continue
        if param is None and loc:
            param = loc[0]
        lines.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
    return "; ".join(lines) or "invalid request", param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> Response:
        return openai_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        return unexpected_error_response(request.method, request.url.path, exc)
