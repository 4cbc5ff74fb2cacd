"""vLLM's sleep mode (VLLM_SERVER_DEV_MODE=1): /sleep, /wake_up, /is_sleeping and
vllm:engine_sleep_state, through the ASGI app with the engine running."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.servers import AppClient, make_app


def _sleep_state(metrics: str) -> dict[str, float]:
    found = re.findall(r'vllm:engine_sleep_state\{[^}]*sleep_state="(\w+)"\} ([\d.]+)', metrics)
    return {state: float(value) for state, value in found}


async def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(10):
            while not predicate():
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"not {what} within 10 s") from None


async def _in_flight(c: AppClient, max_tokens: int) -> asyncio.Future[Any]:
    """A completion running in the engine (its response's future)."""
    body = {"prompt": [1, 2, 3], "max_tokens": max_tokens, "ignore_eos": True}
    running = asyncio.ensure_future(c.http.post("/v1/completions", json=body))
    engine = c.state.engines[0]
    await _wait_for(lambda: engine.num_running == 1, "running")
    return running


async def test_the_routes_need_dev_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    async with AppClient(make_app()) as c:
        assert (await c.http.post("/sleep")).status_code == 404
        metrics = (await c.http.get("/metrics")).text
    assert _sleep_state(metrics) == {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0}


async def test_sleep_aborts_drops_the_cache_and_holds_new_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    # A tenth of real time: the first request runs for ~25 s, certainly in flight at /sleep.
    async with AppClient(make_app(speedup_ratio=0.1)) as c:
        engine = c.state.engines[0]
        cached = {"prompt": list(range(100, 180)), "max_tokens": 1}  # 80 tokens: 5 blocks
        assert (await c.http.post("/v1/completions", json=cached)).status_code == 200
        assert engine.core.pool.cached_hashes() != {}
        running = await _in_flight(c, 400)
        r = await c.http.post("/sleep", params={"level": 1})
        assert r.status_code == 200 and r.json() == {"status": "sleeping", "level": 1}
        done = await running  # mode "abort": it ends as an aborted request does
        assert done.status_code == 503 and "aborted" in done.json()["error"]["message"]
        assert (await c.http.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert engine.core.pool.cached_hashes() == {}  # level 1: the KV cache is dropped
        metrics = (await c.http.get("/metrics")).text
        assert _sleep_state(metrics) == {"awake": 0.0, "weights_offloaded": 1.0,
                                         "discard_all": 0.0}  # fmt: skip
        # A request sent while asleep waits: nothing runs.
        short_body = {"prompt": "x", "max_tokens": 2}
        short = asyncio.ensure_future(c.http.post("/v1/completions", json=short_body))
        await _wait_for(lambda: engine.num_waiting == 1, "waiting")
        await asyncio.sleep(0.05)
        assert not short.done() and engine.num_running == 0
        # The weights wake first: still asleep; then the KV cache: awake, and it runs.
        r = await c.http.post("/wake_up", params={"tags": "weights"})
        assert r.json() == {"status": "sleeping", "tags": ["weights"]}
        assert (await c.http.get("/is_sleeping")).json() == {"is_sleeping": True}
        r = await c.http.post("/wake_up", params={"tags": "kv_cache"})
        assert r.json() == {"status": "awake", "tags": ["kv_cache"]}
        answer = await short
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
        assert (await c.http.get("/is_sleeping")).json() == {"is_sleeping": False}
        metrics = (await c.http.get("/metrics")).text
        assert _sleep_state(metrics)["awake"] == 1.0


async def test_keep_freezes_what_is_in_flight_until_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    async with AppClient(make_app(speedup_ratio=0.1)) as c:
        engine = c.state.engines[0]
        running = await _in_flight(c, 400)  # (~25 s of passes: in flight throughout)
        r = await c.http.post("/sleep", params={"level": 0, "mode": "keep"})
        assert r.status_code == 200
        (request,) = engine.core.requests.values()
        computed = request.num_computed_tokens
        await asyncio.sleep(0.3)  # (several passes' worth at this speed: none runs)
        assert request.num_computed_tokens == computed and not running.done()
        metrics = (await c.http.get("/metrics")).text
        assert _sleep_state(metrics) == {"awake": 0.0, "weights_offloaded": 0.0,
                                         "discard_all": 0.0}  # fmt: skip
        r = await c.http.post("/wake_up", params={"tags": "scheduling"})
        assert r.json()["status"] == "awake"
        await _wait_for(lambda: request.num_computed_tokens > computed, "running again")
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_bad_sleep_parameters_are_400(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    async with AppClient(make_app()) as c:
        for params in ({"level": 3}, {"mode": "later"}, {"level": "x"}):
            r = await c.http.post("/sleep", params=params)
            assert 400 <= r.status_code < 500, params
        assert (await c.http.get("/is_sleeping")).json() == {"is_sleeping": False}


async def test_wait_lets_what_is_in_flight_finish_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    async with AppClient(make_app(speedup_ratio=0.1)) as c:
        engine = c.state.engines[0]
        running = await _in_flight(c, 40)  # (~2.5 s of passes)
        assert engine.core.has_unfinished_requests()
        r = await c.http.post("/sleep", params={"level": 0, "mode": "wait"})
        assert r.status_code == 200 and not engine.core.has_unfinished_requests()
        done = await running
        assert done.json()["choices"][0]["finish_reason"] == "length"
        assert (await c.http.get("/is_sleeping")).json() == {"is_sleeping": True}
        assert (await c.http.post("/wake_up")).json() == {"status": "awake", "tags": None}


async def test_a_request_ended_while_asleep_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # A request that waits for the engine to wake and is aborted meanwhile (its client went)
    # leaves nothing behind: not counted waiting, its prompt not in the prefill backlog, its
    # id free; the request sent again under that id is the only one that runs.
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")
    async with AppClient(make_app(speedup_ratio=0.1)) as c:
        engine = c.state.engines[0]
        assert (await c.http.post("/sleep", params={"level": 0})).status_code == 200
        body = {"prompt": [7] * 30, "max_tokens": 2}
        headers = {"X-Request-Id": "same"}
        first = asyncio.ensure_future(c.http.post("/v1/completions", json=body, headers=headers))
        await _wait_for(lambda: engine.num_waiting == 1, "waiting")
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await _wait_for(lambda: engine.num_waiting == 0, "gone")
        assert engine.prefill_backlog() == 0 and engine.num_open_streams == 0
        again = asyncio.ensure_future(c.http.post("/v1/completions", json=body, headers=headers))
        await _wait_for(lambda: engine.num_waiting == 1, "waiting again")
        assert (await c.http.post("/wake_up")).json()["status"] == "awake"
        answer = await again
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 2
        assert not engine.core.has_unfinished_requests() and engine.num_waiting == 0
