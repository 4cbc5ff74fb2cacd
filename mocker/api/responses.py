"""ASGI responses that watch for a client disconnect while the engine works on the request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

__all__ = ["DeferredResponse", "EventStreamResponse"]


async def _watch(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    """Wait for `http.disconnect`, then tell the engine (its request is aborted)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


class EventStreamResponse(Response):
    """Server-sent events from an async iterator of ready-made byte chunks.

    One `send` per chunk (the iterator yields one chunk per engine pass), and one
    watcher task per request — nothing per token. A disconnect calls
    `on_disconnect`, which aborts the engine request; the iterator then ends.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        on_disconnect: Callable[[], None],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(None, 200, headers, self.media_type)
        # No content-length: the body is open-ended (Response adds "0" for no content).
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.raw_headers.append((b"cache-control", b"no-cache"))
        self.chunks = chunks
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.get_running_loop().create_task(_watch(receive, self.on_disconnect))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the server reports a closed connection on send (ASGI 2.4)
            self.on_disconnect()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()  # runs the generator's cleanup (abort) if it did not finish


class DeferredResponse(Response):
    """A response computed after the headers are due: the body awaits the engine while a
    watcher aborts the request if the client leaves first."""

    def __init__(
        self,
        produce: Callable[[], Awaitable[Response]],
        on_disconnect: Callable[[], None],
    ) -> None:
        super().__init__(None, 200)
        self.produce = produce
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.get_running_loop().create_task(_watch(receive, self.on_disconnect))
        try:
            response = await self.produce()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        with contextlib.suppress(OSError):
            await response(scope, receive, send)
