"""direct_write: body chunks framed and written exactly as uvicorn's own send would, and only
when its send would write them at once (else the send path, with its flow control)."""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, cast

import pytest
from starlette.types import Send
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from mocker.api import direct_write
from mocker.api.direct_write import DirectBody, direct_body
from mocker.api.responses import Emitter

START: dict[str, Any] = {"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]}
# Empty, short, and either side of the length where DirectBody stops looking its frame's
# head up and formats it.
CHUNKS = [b"data: {}\n\n", b"", b"x" * 300, "data: \u00e9\n\n".encode(), b"y" * 4095,
          b"z" * 4096, b"w" * 70_000]  # fmt: skip


class Transport(asyncio.Transport):
    """Records what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def send_of(cycle: RequestResponseCycle) -> Send:
    """The cycle's `send` as the app is handed it: an ASGI `Send` (uvicorn types its own
    messages as TypedDicts, the app's are plain mappings)."""
    return cast("Send", cycle.send)


def _cycle(method: str = "POST") -> tuple[RequestResponseCycle, Transport]:
    transport = Transport()
    scope: Any = {"type": "http", "method": method, "path": "/", "headers": []}
    cycle = RequestResponseCycle(
        scope, transport, FlowControl(transport), logging.getLogger("t"), logging.getLogger("t"),
        False, [], asyncio.Event(), False, True, lambda: None,
    )  # fmt: skip
    return cycle, transport


async def test_the_bytes_are_those_uvicorns_send_writes() -> None:
    sent, sent_transport = _cycle()
    direct, direct_transport = _cycle()
    for cycle in (sent, direct):
        await send_of(cycle)(START)
    body = direct_body(send_of(direct))
    assert isinstance(body, DirectBody)
    for chunk in CHUNKS:
        await send_of(sent)({"type": "http.response.body", "body": chunk, "more_body": True})
        assert body.write(chunk)
    # (uvicorn writes b"" for the empty chunk, DirectBody nothing: the same bytes.)
    assert b"".join(direct_transport.written) == b"".join(sent_transport.written)
    assert [w for w in direct_transport.written if w] == [w for w in sent_transport.written if w]
    assert len(direct_transport.written) == len(CHUNKS)  # the start and one write per chunk


async def test_it_declines_what_the_send_path_must_take() -> None:
    cycle, transport = _cycle()
    assert direct_body(send_of(cycle)) is None  # the response has not started
    await send_of(cycle)(START)
    body = direct_body(send_of(cycle))
    assert body is not None
    cycle.flow.pause_writing()  # the client reads slowly: the send path waits for it
    assert not body.write(b"a")
    cycle.flow.resume_writing()
    assert body.write(b"a")
    cycle.disconnected = True
    assert not body.write(b"b")
    cycle.disconnected = False
    await send_of(cycle)({"type": "http.response.body", "body": b"", "more_body": False})
    assert not body.write(b"c")  # the response has ended
    assert transport.written[1:] == [b"1\r\na\r\n", b"0\r\n\r\n"]  # "a" once, then the end


async def test_only_a_started_chunked_body_of_uvicorns_httptools_cycle() -> None:
    head, _ = _cycle("HEAD")
    await send_of(head)(START)
    assert direct_body(send_of(head)) is None
    sized, _ = _cycle()
    await send_of(sized)({**START, "headers": [(b"content-length", b"3")]})
    assert direct_body(send_of(sized)) is None

    async def other_server(message: Any) -> None:
        pass

    assert direct_body(other_server) is None


async def test_a_uvicorn_whose_cycle_reads_differently_is_left_to_its_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cycle class lacking an attribute the direct path reads (a later uvicorn that renamed
    it) gets no direct writer, so every chunk goes through its own `send`."""

    class Renamed(RequestResponseCycle):
        def __getattribute__(self, name: str) -> Any:
            if name == "response_complete":  # as if renamed
                raise AttributeError(name)
            return super().__getattribute__(name)

    monkeypatch.setattr(direct_write, "_CYCLES", (RequestResponseCycle, Renamed))
    monkeypatch.setattr(direct_write, "_COMPATIBLE", {})
    cycle, _ = _cycle()
    cycle.__class__ = Renamed
    await cast("Send", partial(RequestResponseCycle.send, cycle))(START)
    assert direct_body(send_of(cycle)) is None
    plain, _ = _cycle()
    await send_of(plain)(START)
    assert isinstance(direct_body(send_of(plain)), DirectBody)  # the installed uvicorn's: direct
    compatible = direct_write._COMPATIBLE
    assert compatible == {Renamed: False, RequestResponseCycle: True}


@pytest.mark.parametrize("paused", [False, True])
async def test_the_emitter_writes_directly_unless_the_transport_is_paused(paused: bool) -> None:
    cycle, transport = _cycle()
    emitter = Emitter(send_of(cycle), lambda: None)
    await send_of(cycle)(START)
    emitter.started()
    if paused:
        cycle.flow.pause_writing()
    for chunk in CHUNKS[:-1]:
        emitter.emit(chunk)
    if paused:  # the first chunk waits in uvicorn's send, the others behind it
        assert len(transport.written) == 1
        cycle.flow.resume_writing()
    emitter.emit(CHUNKS[-1], last=True)
    await emitter.drain()
    await asyncio.wait_for(emitter.closed, 5)
    expected, expected_transport = _cycle()
    await send_of(expected)(START)
    for i, chunk in enumerate(CHUNKS):
        last = i == len(CHUNKS) - 1
        await send_of(expected)(
            {"type": "http.response.body", "body": chunk, "more_body": not last}
        )
    assert b"".join(transport.written) == b"".join(expected_transport.written)
    assert cycle.response_complete


async def test_a_failing_direct_write_ends_the_response_as_a_failing_send_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cycle, _ = _cycle()
    failed: list[bool] = []
    emitter = Emitter(send_of(cycle), lambda: failed.append(True))
    await send_of(cycle)(START)
    emitter.started()

    def closed(data: Any) -> None:
        raise RuntimeError("unable to perform operation: the handler is closed")

    monkeypatch.setattr(cycle.transport, "write", closed)
    emitter.emit(CHUNKS[0])
    assert failed == [True] and emitter.closed.done()
    emitter.emit(CHUNKS[1])  # nothing more is attempted
    assert failed == [True]


async def test_the_emitters_writer_is_offered_only_while_a_chunk_may_go_straight_out() -> None:
    # The renderer writes token chunks through `emitter.writer` without calling `emit`: it
    # must be None while chunks queue behind a blocked send, come back once they are out,
    # and go for good when the response ends.
    cycle, transport = _cycle()
    emitter = Emitter(send_of(cycle), lambda: None)
    assert emitter.writer is None  # not started
    await send_of(cycle)(START)
    emitter.started()
    assert isinstance(emitter.writer, DirectBody)
    cycle.flow.pause_writing()
    emitter.emit(b"one")  # waits in uvicorn's send
    assert emitter.writer is None
    emitter.emit(b"two")  # queued behind it
    cycle.flow.resume_writing()
    await emitter.drain()
    writer = emitter.writer
    assert isinstance(writer, DirectBody) and writer.write(b"three")
    emitter.emit(b"four", last=True)
    assert emitter.writer is None
    await asyncio.wait_for(emitter.closed, 5)
    assert emitter.writer is None
    expected = [b"%x\r\n%b\r\n" % (len(c), c) for c in (b"one", b"two", b"three", b"four")]
    assert b"".join(transport.written[1:]) == b"".join(expected) + b"0\r\n\r\n"


async def test_a_framed_chunk_goes_out_as_given_and_only_when_write_would_write() -> None:
    """write_framed: the text table's framed chunk, written as is, declined as `write`."""
    sent, sent_transport = _cycle()
    direct, direct_transport = _cycle()
    for cycle in (sent, direct):
        await send_of(cycle)(START)
    body = direct_body(send_of(direct))
    assert body is not None
    for chunk in CHUNKS[:1] + CHUNKS[2:]:  # (never an empty one: its frame ends the body)
        await send_of(sent)({"type": "http.response.body", "body": chunk, "more_body": True})
        assert body.write_framed(b"%x\r\n%b\r\n" % (len(chunk), chunk))
    assert direct_transport.written == sent_transport.written
    direct.flow.pause_writing()
    assert not body.write_framed(b"1\r\na\r\n")
    direct.flow.resume_writing()
    direct.disconnected = True
    assert not body.write_framed(b"1\r\na\r\n")
    direct.disconnected = False
    await send_of(direct)({"type": "http.response.body", "body": b"", "more_body": False})
    assert not body.write_framed(b"1\r\na\r\n")
    assert direct_transport.written[-1] == b"0\r\n\r\n"  # nothing after the end
