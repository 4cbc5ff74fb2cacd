"""The app's ASGI entry: hands streamed responses the server's own `send`, past the wrappers.

Starlette's error middlewares wrap `send` per message only to learn whether the response
has started; the start message, sent through them, already tells them. Body chunks of a
stream go to the server's `send` directly (scope[RAW_SEND]): several microseconds less per
token. tests/api/test_raw_send.py fails if the framework starts to need the body messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from mocker.api.asgi_send import RAW_SEND, StartWatch
from mocker.api.errors import error_response

if TYPE_CHECKING:
    from mocker.api.direct_routes import DirectRoutes

__all__ = ["RawSendApp"]


class RawSendApp(FastAPI):
    """FastAPI that puts the server's `send` in the scope, serves the generation POSTs past
    its stack (`direct`, once set: mocker.api.direct_routes), and ends a request cancelled
    by the server after a drain with a 503 instead of a logged traceback."""

    direct: DirectRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope[RAW_SEND] = send
        watch = StartWatch(send)
        direct = self.direct
        route = None if direct is None else direct.route(scope)
        try:
            if route is not None:
                assert direct is not None
                await direct.serve(route, scope, receive, watch, super().__call__)
            else:
                await super().__call__(scope, receive, watch)
        except asyncio.CancelledError:
            if not self.is_draining():
                raise
            # After a drain, uvicorn cancels what is still running once its graceful timeout
            # has passed (say, a client stalled mid-upload): end it with a 503 rather than the
            # traceback uvicorn would log for the cancellation.
            if not watch.started:
                with contextlib.suppress(Exception):
                    reply = error_response(503, "The server is shutting down.")
                    await reply(scope, receive, send)
        finally:
            # uvicorn's cycle holds the scope, and the scope would hold the cycle's send: a
            # reference cycle (with everything the request hung on the scope) for the GC.
            scope.pop(RAW_SEND, None)

    def is_draining(self) -> bool:
        """The server state says so (set on SIGTERM); no state yet: not draining."""
        state = getattr(self.state, "mocker", None)
        return bool(getattr(state, "draining", False))
