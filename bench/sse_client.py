"""The benchmarks' streaming client: completions on raw asyncio sockets, parsed only as needed."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

TEXT_KEY = b'"text":"'
DATA_KEY = b"data: "
# The end of a chunked body as it follows the last event: the event's chunk ends in "\r\n",
# then the zero-size chunk.
BODY_END = b"\r\n0\r\n\r\n"


def completion_body(prompt: list[int], max_tokens: int) -> bytes:
    """A streamed /v1/completions body that runs to max_tokens and ends with a usage chunk."""
    return orjson.dumps(
        {
            "model": "mocker",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


def completion_request(host: str, port: int, body: bytes, keep_alive: bool = False) -> bytes:
    """The whole HTTP/1.1 request, encoded once ahead of the measurement."""
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(slots=True)
class Stream:
    """What the client saw of one streamed completion (perf_counter times)."""

    sent_at: float = 0.0
    status_ok: bool | None = None
    times: list[float] = field(default_factory=list)  # arrival of each token chunk
    tokens: list[int] = field(default_factory=list)  # tokens in each token chunk
    chunk_bytes: int = 0  # SSE bytes of the token chunks
    usage: dict[str, Any] | None = None
    done_at: float | None = None  # "data: [DONE]" arrived
    ended_at: float | None = None  # the response (or the connection) ended
    error: str | None = None

    @property
    def ok(self) -> bool:
        done = self.done_at is not None and self.usage is not None
        return bool(self.status_ok) and bool(self.times) and done

    @property
    def failure(self) -> str | None:
        """Why the stream is not a complete completion; None when it is."""
        if self.error is not None:
            return self.error
        return None if self.ok else "stream ended without a token or usage"

    @property
    def usage_tokens(self) -> int | None:
        return None if self.usage is None else int(self.usage["completion_tokens"])

    @property
    def prompt_tokens(self) -> int:
        return 0 if self.usage is None else int(self.usage["prompt_tokens"])

    @property
    def cached_tokens(self) -> int:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        return int(details.get("cached_tokens") or 0)

    @property
    def ttft_ms(self) -> float | None:
        return (self.times[0] - self.sent_at) * 1000 if self.times else None

    @property
    def latency_ms(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.sent_at) * 1000


class SseConnection(asyncio.Protocol):
    """One connection that streams one completion at a time (several if kept alive).

    The body is chunked; each SSE event ends in "\\n\\n" and the chunk framing is "\\r\\n"
    only, so splitting the raw bytes on "\\n\\n" yields whole events (with a chunk-size line
    in front, which the key lookups skip). Every generated token is one " word" of
    lowercase letters, so the spaces in "text" count the tokens a chunk carries.
    """

    def __init__(self, read_batch: int = 0) -> None:
        """Made inside the running loop (the end of each response is one of its futures)."""
        self.read_batch = read_batch
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.stream = Stream()
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport but have its interface.
        self.transport = cast(asyncio.Transport, transport)
        if self.read_batch > 1:
            # The kernel reports the socket readable only once this many bytes are queued
            # (or at EOF), so one read carries many chunks instead of one.
            sock = transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, self.read_batch)

    @property
    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def abort(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def send(self, request: bytes) -> Stream:
        """Write one request (from completion_request); `ended` resolves when it is answered."""
        assert self.transport is not None
        self.stream = Stream()
        self.buf = b""
        if self.ended.done():
            self.ended = asyncio.get_running_loop().create_future()
        self.stream.sent_at = time.perf_counter()
        self.transport.write(request)
        return self.stream

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()  # one stamp per read: events read together arrived together
        stream = self.stream
        if stream.status_ok is None:
            stream.status_ok = data.startswith(b"HTTP/1.1 200")
            if not stream.status_ok:
                # Not a stream; its framing is not parsed here, so the connection goes.
                stream.error = data[:300].decode(errors="replace")
                assert self.transport is not None
                self.transport.close()
                return
        *events, self.buf = (self.buf + data).split(b"\n\n")
        for event in events:
            self._event(stream, event, now)
        if stream.done_at is not None and self.buf.endswith(BODY_END):
            self._end(now)

    def _event(self, stream: Stream, event: bytes, now: float) -> None:
        start = event.find(TEXT_KEY)
        if start >= 0:
            start += len(TEXT_KEY)
            stream.times.append(now)
            stream.tokens.append(event.count(b" ", start, event.find(b'"', start)))
            stream.chunk_bytes += len(event) - event.find(DATA_KEY) + 2
        elif b'"usage":' in event:
            stream.usage = orjson.loads(event[event.find(DATA_KEY) + len(DATA_KEY) :])["usage"]
        elif event.endswith(b"data: [DONE]"):
            stream.done_at = now
        elif b'"error"' in event and stream.error is None:
            stream.error = event[event.find(DATA_KEY) :][:300].decode(errors="replace")

    def _end(self, now: float) -> None:
        if self.stream.ended_at is None:
            self.stream.ended_at = now
        if not self.ended.done():
            self.ended.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self.stream.error is None:
            self.stream.error = repr(exc)
        self._end(time.perf_counter())


async def connect(host: str, port: int, read_batch: int = 0) -> SseConnection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(lambda: SseConnection(read_batch), host, port)
    return conn


class KeepAliveClient:
    """One kept-alive connection, opened on first use and again after it is lost."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.conn: SseConnection | None = None

    async def stream(self, request: bytes, timeout: float) -> Stream:
        """One streamed completion (a keep-alive completion_request); a failure (refused,
        timed out) is the stream's error."""
        sent = time.perf_counter()
        try:
            if self.conn is None or self.conn.closing:
                self.conn = await connect(self.host, self.port)
            stream = self.conn.send(request)
            await asyncio.wait_for(self.conn.ended, timeout)
            return stream
        except Exception as exc:
            self.close()
            return Stream(sent_at=sent, error=repr(exc)[:200])

    def close(self) -> None:
        if self.conn is not None:
            self.conn.abort()
        self.conn = None
