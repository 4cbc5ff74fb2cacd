"""The server's own `send` kept in the scope (RAW_SEND), and a `send` that notes a start."""

from __future__ import annotations

from starlette.types import Message, Send

__all__ = ["RAW_SEND", "StartWatch"]

RAW_SEND = "mocker.send"


class StartWatch:
    """A request's `send` that notes whether the response has started (one wrapper for the
    app and the direct routes: each layer costs every message a coroutine)."""

    __slots__ = ("_send", "started")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if not self.started:
            self.started = message["type"] == "http.response.start"
        await self._send(message)
