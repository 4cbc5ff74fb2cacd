"""Bare SSE floor: a raw ASGI app whose one ticker task feeds pre-encoded chunks to every stream."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

# Run as `python bench/sse_baseline.py [HOST]`: it binds a free port on HOST (127.0.0.1) and
# names it on stderr, as `mocker serve --port 0` does; or as an app, `uvicorn --app-dir bench
# sse_baseline:app --loop uvloop --http httptools`.
# POST /v1/completions streams max_tokens token chunks shaped and sized like mocker's
# (same id, created, model and field layout; every token is one word), then a usage chunk
# and [DONE]. There is no engine and no per-request task beyond the ASGI handler itself:
# the cost left is uvicorn + httptools + the socket writes, i.e. the floor any SSE server
# on this stack pays per chunk.

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Any  # Callable[[], Awaitable[Message]]; kept loose so the app has no typing deps
Send = Any  # Callable[[Message], Awaitable[None]]

# Mocker's words are 2-12 lowercase letters; 8 letters keeps the chunk near its mean size.
WORD = b" baseline"
DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class _Stream:
    """One open response: its pre-encoded chunks and how many token chunks are still due."""

    send: Send
    chunk: bytes
    last: bytes
    usage: bytes
    left: int
    finished: asyncio.Future[None]


def _chunks(model: str, prompt_tokens: int, max_tokens: int) -> tuple[bytes, bytes, bytes]:
    """The token chunk, the final (finish_reason "length") chunk and the usage chunk."""
    head = (
        b'data: {"id":"cmpl-'
        + uuid.uuid4().hex.encode()
        + b'","object":"text_completion","created":'
        + str(int(time.time())).encode()
        + b',"model":'
        + orjson.dumps(model)
        + b',"choices":['
    )
    token = b'{"index":0,"text":"' + WORD + b'","logprobs":null,"finish_reason":'
    tail = b',"stop_reason":null}]}\n\n'
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + max_tokens,
        "completion_tokens": max_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    return (
        head + token + b"null" + tail,
        head + token + b'"length"' + tail,
        head + b'],"usage":' + orjson.dumps(usage) + b"}\n\n",
    )


@dataclass(slots=True)
class _Ticker:
    """The single writer: one pass over the open streams per tick, then yield to the loop."""

    streams: list[_Stream] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def add(self, stream: _Stream) -> None:
        self.streams.append(stream)
        self.wake.set()
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            if not self.streams:
                # Idle: sleep instead of spinning so an idle floor costs no CPU.
                self.wake.clear()
                await self.wake.wait()
                continue
            still_open: list[_Stream] = []
            for s in self.streams:
                if await _feed(s):
                    still_open.append(s)
            # A stream added while a send awaited (a full socket buffer) is appended to the
            # list being iterated, so the loop still reaches it and it is kept.
            self.streams = still_open
            await asyncio.sleep(0)  # let uvicorn accept and parse new requests


async def _feed(s: _Stream) -> bool:
    """One token chunk to `s` (the whole ending on its last one); False once it is closed."""
    s.left -= 1
    try:
        if s.left > 0:
            await s.send({"type": "http.response.body", "body": s.chunk, "more_body": True})
            return True
        # One send per event, as mocker does: last token, usage, [DONE], end of body.
        for body in (s.last, s.usage, DONE):
            await s.send({"type": "http.response.body", "body": body, "more_body": True})
        await s.send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:  # the client went away (uvicorn raises on send to a closed socket)
        pass
    if not s.finished.done():
        s.finished.set_result(None)
    return False


_ticker: _Ticker | None = None


def _get_ticker() -> _Ticker:
    # Created lazily: the Event and the task must belong to uvicorn's running loop.
    global _ticker
    if _ticker is None:
        _ticker = _Ticker()
    return _ticker


async def _read_body(receive: Receive) -> bytes:
    body = b""
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def _plain(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _completions(receive: Receive, send: Send) -> None:
    request = orjson.loads(await _read_body(receive))
    prompt = request.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else 1
    max_tokens = max(1, int(request.get("max_tokens") or 16))
    chunk, last, usage = _chunks(str(request.get("model", "mocker")), prompt_tokens, max_tokens)
    request_id = uuid.uuid4().hex.encode()
    headers = [
        (b"x-request-id", request_id),
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _get_ticker().add(_Stream(send, chunk, last, usage, max_tokens, finished))
    await finished


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            task = _ticker.task if _ticker is not None else None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI entry point: /health, POST /v1/completions (streaming only), else 404."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] != "http":
        return
    elif scope["path"] == "/health":
        await _plain(send, 200, b"")
    elif scope["path"] == "/v1/completions" and scope["method"] == "POST":
        await _completions(receive, send)
    else:
        await _plain(send, 404, b"not found")


def main() -> int:
    """Serve `app` on uvicorn (uvloop, httptools) on a port the system picks, and name it."""
    import uvicorn

    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    # Bound here, as mocker does, so the port is taken before it is named (backlog as uvicorn's).
    listener = socket.create_server((host, 0), backlog=2048)
    port = listener.getsockname()[1]
    print(f"sse_baseline: serving mocker at http://{host}:{port}/v1", file=sys.stderr, flush=True)
    config = uvicorn.Config(
        app, loop="uvloop", http="httptools", log_level="warning", access_log=False
    )
    uvicorn.Server(config).run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
