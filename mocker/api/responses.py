"""ASGI responses: bodies fed by the engine loop (watching for a disconnect), and plain JSON."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from types import CoroutineType
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from mocker.api.asgi_send import RAW_SEND
from mocker.api.direct_write import DirectBody, direct_body

__all__ = ["DeferredResponse", "Emitter", "EventStreamResponse", "json_response"]


async def _watch(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    """Wait for `http.disconnect`, then tell the engine (its request is aborted)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


async def _awaited(awaitable: Awaitable[None]) -> None:
    await awaitable


class Emitter:
    """Writes body chunks of one response from plain (non-async) code, in order.

    The engine loop calls `emit` for every stream it has output for. A server's
    `send` normally completes without suspending (the transport buffers the
    bytes), so it is driven to completion right here: no task and no wake-up
    per chunk. Only when it must wait (flow control: a slow reader) does a task
    take over that one stream, queueing its later chunks behind the blocked one.
    """

    __slots__ = (
        "_backlog", "_direct", "_ended", "_on_error", "_pending", "_send", "closed", "writer"
    )  # fmt: skip

    def __init__(self, send: Send, on_error: Callable[[], None]) -> None:
        self._send = send
        self._on_error = on_error
        self._backlog: deque[Message] = deque()
        self._pending: asyncio.Task[None] | None = None
        self._ended = False  # the last message is written or queued: nothing may follow it
        self._direct: DirectBody | None = None
        # The direct writer while a body chunk may go straight to it (started, nothing
        # queued behind a blocked send, not ended): the renderer's per-token path writes
        # through it without a call of `emit` (None: call `emit`).
        self.writer: DirectBody | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def started(self) -> None:
        """The response's start is written: from now on, body chunks go straight to uvicorn's
        transport when it can take them (direct_write.py)."""
        self._direct = self.writer = direct_body(self._send)

    def emit(
        self, chunk: bytes, *, last: bool = False, on_sent: Callable[[], None] | None = None
    ) -> None:
        """Write a chunk (or queue it behind a blocked one); `on_sent` is called if it is
        accepted, i.e. the response was still open."""
        if self._ended or self.closed.done():
            return
        self._ended = last
        if on_sent is not None:
            on_sent()
        writer = self.writer
        if last:
            self.writer = None
        elif writer is not None:
            try:
                if writer.write(chunk):
                    return
            except Exception:  # as from `send`: e.g. the transport closed under us
                self.fail()
                return
        message = {"type": "http.response.body", "body": chunk, "more_body": not last}
        if self._pending is not None:
            self._backlog.append(message)
            return
        sending = self._send(message)
        # Servers' `send` is an `async def` (uvicorn's is): a coroutine, stepped right here.
        # (The concrete coroutine type, not the Coroutine ABC: this runs once per chunk.)
        coro = sending if isinstance(sending, CoroutineType) else _awaited(sending)
        try:
            waiting_on = coro.send(None)
        except StopIteration:
            if last:
                self.close()
            return
        except Exception:  # e.g. OSError: the client has gone (ASGI 2.4 servers)
            self.fail()
            return
        self.writer = None  # later chunks queue behind this one
        self._pending = asyncio.get_running_loop().create_task(self._resume(coro, waiting_on, last))

    def close(self) -> None:
        self.writer = None
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self) -> None:
        """A write raised (the transport closed under it): the response is over."""
        self.close()
        self._on_error()

    async def _resume(self, coro: Coroutine[Any, Any, None], waiting_on: Any, last: bool) -> None:
        """Finish a suspended send the way a Task would, then flush what queued behind it."""
        try:
            while True:
                if isinstance(waiting_on, asyncio.Future):
                    await asyncio.wait((waiting_on,))
                else:
                    await asyncio.sleep(0)
                try:
                    waiting_on = coro.send(None)
                except StopIteration:
                    break
            while self._backlog:
                message = self._backlog.popleft()
                await self._send(message)
                last = last or not message["more_body"]
        except asyncio.CancelledError:
            coro.close()
            raise
        except Exception:
            self.fail()
            return
        finally:
            self._pending = None
            if not self._ended and not self.closed.done():
                self.writer = self._direct  # the backlog is out: direct writes again
        if last:
            self.close()

    async def drain(self) -> None:
        """Wait until no write is in flight (before the response returns)."""
        while self._pending is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._pending)


class EventStreamResponse(Response):
    """Server-sent events pushed by the engine loop through an `Emitter`.

    `start(emitter)` attaches the request's outputs to the emitter; the response
    task then just waits for the last chunk, with one watcher task per request
    for the client going away (`on_disconnect` aborts the engine request).
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        start: Callable[[Emitter], None],
        on_disconnect: Callable[[], None],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(None, 200, headers, self.media_type)
        # No content-length: the body is open-ended (Response adds "0" for no content).
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.raw_headers.append((b"cache-control", b"no-cache"))
        self.start = start
        self.on_disconnect = on_disconnect

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Body chunks go to the server's own send when the app provides it (raw_send.py).
        emitter = Emitter(scope.get(RAW_SEND, send), self.on_disconnect)

        def gone() -> None:
            self.on_disconnect()
            emitter.close()  # also ends a response whose last chunks are still held back

        watcher = asyncio.get_running_loop().create_task(_watch(receive, gone))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            emitter.started()
            self.start(emitter)
            await emitter.closed
            await emitter.drain()
        except OSError:  # the server reports a closed connection on send (ASGI 2.4)
            self.on_disconnect()
        finally:
            emitter.close()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            # Whatever ended the response (disconnect, cancellation, error), the engine
            # request must not outlive it: on_disconnect aborts it (a no-op once finished).
            self.on_disconnect()


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
            self.on_disconnect()  # aborts the request unless it finished (e.g. cancelled)
        with contextlib.suppress(OSError):
            await response(scope, receive, send)


def json_response(data: object, status: int = 200) -> Response:
    """A JSON body encoded with orjson (the routes' plain answers)."""
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")
