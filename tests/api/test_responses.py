"""Disconnects over a real socket: a client that leaves mid-request frees what it held."""

from __future__ import annotations

import asyncio
import gc
import time

import httpx
from starlette.types import Message

from mocker.api.choice import Choice
from mocker.api.responses import Emitter
from mocker.api.stream import StreamRenderer
from mocker.engine.stream import RequestStream
from tests.support.servers import ServerThread, make_app


def _wait_idle(server: ServerThread, timeout: float = 10.0) -> None:
    engine = server.app.state.mocker.engines[0]
    deadline = time.monotonic() + timeout
    while engine.num_running or engine.core.pool.num_used or engine.core.requests:
        assert time.monotonic() < deadline, "the aborted request still holds engine state"
        time.sleep(0.005)


def test_disconnect_mid_stream_aborts_and_frees_blocks() -> None:
    # Speedup 1: each decode pass takes ~6 ms, so the request is still running when we leave.
    with ServerThread(make_app(speedup_ratio=1.0)) as server:
        engine = server.app.state.mocker.engines[0]
        metrics = server.app.state.mocker.metrics[0]
        with (
            httpx.Client(base_url=server.url, timeout=10) as http,
            http.stream(
                "POST",
                "/v1/completions",
                json={"prompt": list(range(200)), "max_tokens": 2000, "stream": True},
            ) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert engine.num_running == 1 and engine.core.pool.num_used > 0
        t0 = time.monotonic()
        _wait_idle(server)
        # Soon after the disconnect (a pass or two, plus a loaded machine's delays), not at
        # the request's natural end (12 s or more).
        assert time.monotonic() - t0 < 6.0
        assert metrics.finished["abort"] == 1


def test_disconnect_mid_stream_aborts_every_choice_of_n() -> None:
    with ServerThread(make_app(speedup_ratio=1.0)) as server:
        engine = server.app.state.mocker.engines[0]
        metrics = server.app.state.mocker.metrics[0]
        body = {"prompt": list(range(64)), "max_tokens": 2000, "stream": True, "n": 3}
        with (
            httpx.Client(base_url=server.url, timeout=10) as http,
            http.stream("POST", "/v1/completions", json=body) as r,
        ):
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert len(engine.core.requests) == 3
        _wait_idle(server)  # every child's blocks freed, none left in the engine
        assert metrics.finished["abort"] == 3 and metrics.finished["length"] == 0
        assert metrics.request_params_n.count == 1  # the request, once its last child ended


def test_disconnect_while_waiting_for_a_full_response() -> None:
    with ServerThread(make_app(speedup_ratio=1.0)) as server:
        metrics = server.app.state.mocker.metrics[0]
        try:
            # The client gives up after 2 s (long enough for a loaded server to have taken
            # the request in), long before the request's natural end (12 s or more).
            httpx.post(
                server.url + "/v1/completions",
                json={"prompt": "x", "max_tokens": 2000},
                timeout=httpx.Timeout(30, read=2.0),
            )
        except httpx.TimeoutException:
            pass
        else:
            raise AssertionError("the request should still be running")
        _wait_idle(server)
        # It was in the engine when the client left (the server may already have noticed by
        # the time the exception reaches us), and it ended by abort, not by running out.
        assert metrics.finished["abort"] == 1


async def test_nothing_is_written_after_the_last_message_even_behind_a_slow_reader() -> None:
    # A slow reader: the first send waits (flow control), so later chunks queue behind it.
    sent: list[Message] = []
    gate = asyncio.get_running_loop().create_future()

    async def send(message: Message) -> None:
        if not sent and not gate.done():
            await gate
        if sent and not sent[-1]["more_body"]:
            raise RuntimeError("a message after the response ended")  # as a server refuses
        sent.append(message)

    failures: list[str] = []
    emitter = Emitter(send, on_error=lambda: failures.append("send failed"))
    emitter.emit(b"one")
    emitter.emit(b"error + [DONE]", last=True)  # e.g. one prompt's engine-death event
    emitter.emit(b"error + [DONE] again", last=True)  # another prompt of the same request
    emitter.emit(b"late")
    gate.set_result(None)
    await asyncio.wait_for(emitter.closed, 5)
    await emitter.drain()
    assert [m["body"] for m in sent] == [b"one", b"error + [DONE]"]
    assert failures == []  # the extra messages were dropped, not refused by the server


def _alive(kinds: tuple[type, ...]) -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, kinds))


def test_a_streamed_response_leaves_no_reference_cycle_behind() -> None:
    # With the cyclic GC off, only reference counting frees: a response whose objects hang
    # in a cycle (the renderer holds the stream, the stream its listener; uvicorn's cycle
    # holds the scope, the scope the cycle's send) would stay alive here until a full
    # collection, the pause every stream then waits through.
    kinds = (StreamRenderer, Emitter, Choice, RequestStream)
    body = {"prompt": "hello there", "max_tokens": 6, "stream": True, "n": 1}
    with ServerThread(make_app()) as server, httpx.Client(base_url=server.url) as http:
        for path, payload in (("/v1/completions", body), ("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
        })):  # fmt: skip
            with http.stream("POST", path, json=payload) as r:  # warm-up: lazy imports
                r.read()
        gc.collect()
        gc.disable()
        try:
            before = _alive(kinds)
            for i in range(6):
                path, payload = ("/v1/completions", body) if i % 2 else (
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                     "stream": True},
                )  # fmt: skip
                with http.stream("POST", path, json=payload) as r:
                    assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
            _wait_idle(server)
            deadline = time.monotonic() + 10
            while _alive(kinds) > before:  # the handlers' last steps, on the server's thread
                assert time.monotonic() < deadline, f"{_alive(kinds) - before} objects kept"
                time.sleep(0.01)
        finally:
            gc.enable()
