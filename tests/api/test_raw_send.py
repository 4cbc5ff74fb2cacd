"""The raw-send wrapper: what it assumes about how Starlette calls `send`, checked.

Streamed body chunks go to the server's `send` straight from the Emitter, past Starlette's
per-message `send` wrappers; only the start message goes through them. That is sound while
(1) the server's `send` reaches the response through the scope, (2) the start message still
passes the error middleware's wrapper, which is how it learns that the response started,
and (3) that is all it needs: an error after the start must not make it send a second
start. If Starlette changes any of this, these tests fail.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from starlette.types import Message

from mocker.api.asgi_send import RAW_SEND
from mocker.api.raw_send import RawSendApp
from mocker.api.responses import Emitter, EventStreamResponse

CHUNKS = [b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"]


class Boom(Exception):
    pass


def _app() -> RawSendApp:
    app = RawSendApp()

    def emit_all(emitter: Emitter) -> None:
        for i, chunk in enumerate(CHUNKS):
            emitter.emit(chunk, last=i == len(CHUNKS) - 1)

    def emit_then_fail(emitter: Emitter) -> None:
        emitter.emit(CHUNKS[0])
        raise Boom("after the start")

    @app.get("/stream")
    async def stream() -> EventStreamResponse:
        return EventStreamResponse(emit_all, lambda: None)

    @app.get("/boom")
    async def boom() -> EventStreamResponse:
        return EventStreamResponse(emit_then_fail, lambda: None)

    return app


Sent = list[tuple[Message, list[str]]]


async def _call(app: RawSendApp, path: str, sent: Sent) -> None:
    """Run one GET through the app as a server would; each message sent goes into `sent`,
    with the modules of the frames that called `send` (innermost first)."""

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        callers = [str(f.frame.f_globals.get("__name__")) for f in inspect.stack()[1:8]]
        sent.append((message, callers))

    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    assert RAW_SEND not in scope
    try:
        await app(scope, receive, send)
    finally:
        # (1) the server's send rode in the scope (the callers below show it was used
        # directly), and is gone once the request ends: uvicorn's cycle holds the scope,
        # so a send left in it would make a reference cycle for the GC.
        assert RAW_SEND not in scope


async def test_body_chunks_reach_the_server_send_straight_from_the_emitter() -> None:
    sent: Sent = []
    await _call(_app(), "/stream", sent)
    kinds = [m["type"] for m, _ in sent]
    assert kinds == ["http.response.start"] + ["http.response.body"] * len(CHUNKS)
    assert [m["body"] for m, _ in sent[1:]] == CHUNKS
    assert [m["more_body"] for m, _ in sent[1:]] == [True, True, False]
    for message, callers in sent[1:]:
        assert callers[0] == "mocker.api.responses", (message, callers)  # no wrapper between
    # (2) The start went through Starlette's error middleware on its way out.
    start_callers = sent[0][1]
    assert "starlette.middleware.errors" in start_callers, start_callers


async def test_an_error_after_the_start_sends_no_second_start() -> None:
    sent: Sent = []
    with pytest.raises(Boom):
        await _call(_app(), "/boom", sent)
    # (3) The middleware knew the response had started (the start passed it), so it
    # re-raised instead of answering 500 with a second start.
    assert [m["type"] for m, _ in sent] == ["http.response.start", "http.response.body"]
    assert sent[0][0]["status"] == 200 and sent[1][0]["body"] == CHUNKS[0]
