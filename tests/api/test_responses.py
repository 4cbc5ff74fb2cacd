"""Disconnects over a real socket: a client that leaves mid-request frees what it held."""

from __future__ import annotations

import time

import httpx

from tests.api.conftest import ServerThread, make_app


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
        # Within a pass or two of the disconnect, not at the request's natural end (~12 s).
        assert time.monotonic() - t0 < 2.0
        assert metrics.finished["abort"] == 1


def test_disconnect_while_waiting_for_a_full_response() -> None:
    with ServerThread(make_app(speedup_ratio=1.0)) as server:
        engine = server.app.state.mocker.engines[0]
        try:
            httpx.post(
                server.url + "/v1/completions",
                json={"prompt": "x", "max_tokens": 2000},
                timeout=0.3,
            )
        except httpx.TimeoutException:
            pass
        else:
            raise AssertionError("the request should still be running")
        assert engine.core.requests or engine.num_waiting
        _wait_idle(server)
