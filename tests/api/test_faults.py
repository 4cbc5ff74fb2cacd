"""Fault injection as a router under test sees it: the failure rate within binomial tolerance,
each failure an OpenAI-shaped error with its status, header forcing, a counting metric, mid-stream
aborts that free the engine, latency jitter, a start-up delay, and POST /admin/config."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from starlette.types import Message

from mocker.api.errors import OpenAIError
from mocker.api.faults import FaultInjector, JitteredEmitter
from mocker.api.responses import Emitter
from mocker.faults import FaultConfig, FaultType
from tests.support.parsing import samples, sse_events
from tests.support.servers import AppClient, ServerThread, make_app, serve, settings

COMPLETION = {"prompt": "hello faults", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ERROR_TYPES = {
    400: "BadRequestError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def faulty(**faults: Any) -> ServerThread:
    return ServerThread(make_app(settings(faults=FaultConfig(**faults))))


def injected(text: str) -> dict[str, float]:
    return {dict(k)["type"]: v for k, v in samples(text, "mocker:injected_failures_total").items()}


def kind_of(response: httpx.Response) -> str:
    """The fault a response shows ('ok' for none), from its status and message."""
    if response.status_code == 200:
        return "ok"
    error = response.json()["error"]
    assert error["code"] == response.status_code
    assert error["type"] == ERROR_TYPES[response.status_code]
    assert "(injected fault)" in error["message"]
    if "mid-stream" in error["message"]:
        return "abort"
    return {429: "rate_limit", 503: "overloaded", 500: "server_error", 400: "context_length"}[
        response.status_code
    ]


def test_the_header_forces_or_suppresses() -> None:
    injector = FaultInjector(FaultConfig(failure_rate=0.0))
    assert injector.choose(None) is None
    assert injector.choose("503") is FaultType.OVERLOADED
    assert injector.choose("abort") is FaultType.ABORT
    never = FaultInjector(FaultConfig(failure_rate=1.0, failure_types=(FaultType.RATE_LIMIT,)))
    assert never.choose("none") is None
    assert never.choose(None) is FaultType.RATE_LIMIT
    with pytest.raises(OpenAIError, match="X-Mocker-Fail: unknown failure type 'teapot'"):
        never.choose("teapot")
    # Drawing is not injecting: a fault counts once the client got it.
    assert sum(injector.counts.values()) == sum(never.counts.values()) == 0
    never.record(FaultType.RATE_LIMIT)
    assert never.counts[FaultType.RATE_LIMIT] == 1


def test_failures_follow_the_seed_whatever_the_jitter() -> None:
    config = FaultConfig(failure_rate=0.5, ttft_jitter=1.0)
    plain, jittered = FaultInjector(config, seed=3), FaultInjector(config, seed=3)
    expected = [plain.choose(None) for _ in range(300)]
    got = []
    for i in range(300):
        for _ in range(i % 4):  # streams draw jitter as often as their timing makes them
            jittered.jitter(1.0)
        got.append(jittered.choose(None))
    assert got == expected
    other = FaultInjector(config, seed=4)
    assert [other.choose(None) for _ in range(300)] != expected


# -- over HTTP ---------------------------------------------------------------------------------


async def test_observed_rate_is_within_binomial_tolerance() -> None:
    # A real `mocker serve` in its own process (the flags as a user gives them), so client
    # and server do not share one interpreter.
    n, p = 2000, 0.3
    with serve("--failure-rate", "0.3", "--speedup-ratio", "200") as (_, url):
        gate = asyncio.Semaphore(32)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def one(i: int) -> httpx.Response:
                path, body = (
                    ("/v1/completions", COMPLETION) if i % 2 else ("/v1/chat/completions", CHAT)
                )
                async with gate:
                    return await http.post(path, json={**body, "max_tokens": 1})

            replies = await asyncio.gather(*(one(i) for i in range(n)))
            text = (await http.get("/metrics")).text
    kinds = Counter(kind_of(r) for r in replies)
    failed = n - kinds["ok"]
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(failed - n * p) <= 4 * sigma, kinds  # 4 σ ≈ ±82 of 600
    # Every type is drawn (uniformly among the five), and the metric counts exactly these.
    per_type = failed / len(FaultType)
    type_sigma = math.sqrt(failed * 0.2 * 0.8)
    for fault in FaultType:
        assert abs(kinds[fault.value] - per_type) <= 4 * type_sigma, kinds
    assert injected(text) == {t.value: float(kinds[t.value]) for t in FaultType}
    # The other faults answer at the door: only successes and aborts reached the engine.
    assert sum(samples(text, "vllm:request_success_total").values()) == kinds["ok"] + kinds["abort"]
    assert samples(text, "vllm:num_requests_running") == {
        (("engine", "0"), ("model_name", "mocker")): 0.0
    }


@pytest.mark.parametrize(
    ("header", "status", "kind"),
    [
        ("429", 429, "rate_limit"),
        ("rate_limit", 429, "rate_limit"),
        ("503", 503, "overloaded"),
        ("500", 500, "server_error"),
        ("400", 400, "context_length"),
        ("context_length", 400, "context_length"),
        ("abort", 500, "abort"),
    ],
)
def test_the_header_forces_a_fault_on_either_endpoint(
    header: str, status: int, kind: str, client_server: ServerThread
) -> None:
    before = injected(httpx.get(client_server.url + "/metrics").text)
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)):
        r = httpx.post(client_server.url + path, json=body, headers={"X-Mocker-Fail": header})
        assert r.status_code == status and kind_of(r) == kind
        if kind == "context_length":
            error = r.json()["error"]
            assert error["param"] == ("prompt" if path == "/v1/completions" else "messages")
            assert error["message"].startswith("This model's maximum context length is 4096")
    after = injected(httpx.get(client_server.url + "/metrics").text)
    assert after[kind] - before[kind] == 2
    assert sum(after.values()) - sum(before.values()) == 2


@pytest.fixture(scope="module")
def client_server() -> Iterator[ServerThread]:
    with faulty(failure_rate=0.0) as srv:
        yield srv


@pytest.mark.parametrize("header", ["429", "abort"])
def test_a_client_mistake_is_reported_not_masked_by_a_fault(
    header: str, client_server: ServerThread
) -> None:
    url = client_server.url
    before = injected(httpx.get(url + "/metrics").text)
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    mistakes = [
        ("/v1/completions", {"prompt": "", "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": [10**9], "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": [5] * 5000, "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"prompt": "x", "data_parallel_rank": 7}, "data_parallel_rank"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": image}]}, "messages"),
    ]
    for path, body, param in mistakes:
        r = httpx.post(url + path, json=body, headers={"X-Mocker-Fail": header})
        error = r.json()["error"]
        assert r.status_code == 400 and "injected" not in error["message"], (body, error)
        assert error["param"] == param
    assert injected(httpx.get(url + "/metrics").text) == before  # nothing was injected


def test_no_header_no_fault_and_a_bad_header_is_a_400(client_server: ServerThread) -> None:
    url = client_server.url
    assert httpx.post(url + "/v1/completions", json=COMPLETION).status_code == 200
    r = httpx.post(url + "/v1/completions", json=COMPLETION, headers={"X-Mocker-Fail": "418"})
    assert r.status_code == 400
    assert "X-Mocker-Fail" in r.json()["error"]["message"]


def test_other_routes_never_fail() -> None:
    with faulty(failure_rate=1.0) as srv:
        url = srv.url
        assert httpx.post(url + "/v1/completions", json=COMPLETION).status_code != 200
        for path in ("/health", "/v1/models", "/metrics", "/version", "/ping"):
            for _ in range(10):
                assert httpx.get(url + path).status_code == 200, path
        r = httpx.post(url + "/tokenize", json={"prompt": "x"}, headers={"X-Mocker-Fail": "503"})
        assert r.status_code == 200


@pytest.mark.parametrize("chat", [False, True])
def test_an_injected_abort_breaks_the_stream_and_frees_the_engine(
    chat: bool, client_server: ServerThread
) -> None:
    url = client_server.url
    path, body = ("/v1/chat/completions", CHAT) if chat else ("/v1/completions", COMPLETION)
    request = {**body, "max_tokens": 10, "ignore_eos": True, "stream": True}
    text = httpx.get(url + "/metrics").text
    aborted_before = sum(
        v for k, v in samples(text, "vllm:request_success_total").items()
        if dict(k)["finished_reason"] == "abort"
    )  # fmt: skip
    r = httpx.post(url + path, json=request, headers={"X-Mocker-Fail": "abort"})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == 500 and "mid-stream" in error["message"]
    chunks = events[:-2]
    pieces = [
        (c["choices"][0]["delta"].get("content") if chat else c["choices"][0]["text"])
        for c in chunks
    ]
    # Half the requested tokens came out (5 of 10), none with a finish reason.
    assert sum(1 for p in pieces if p) == 5
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    engine = client_server.app.state.mocker.engines[0]
    text = httpx.get(url + "/metrics").text
    aborted = sum(
        v for k, v in samples(text, "vllm:request_success_total").items()
        if dict(k)["finished_reason"] == "abort"
    )  # fmt: skip
    assert aborted == aborted_before + 1
    assert engine.num_open_streams == 0 and engine.core.pool.num_used == 0


def test_an_injected_abort_without_streaming_is_a_500(client_server: ServerThread) -> None:
    r = httpx.post(
        client_server.url + "/v1/completions",
        json={**COMPLETION, "max_tokens": 1},
        headers={"X-Mocker-Fail": "abort"},
    )
    assert r.status_code == 500 and kind_of(r) == "abort"


def test_jitter_keeps_every_stream_whole_and_in_order() -> None:
    with faulty(ttft_jitter=2.0, itl_jitter=2.0) as srv:
        body = {**COMPLETION, "max_tokens": 12, "ignore_eos": True, "stream": True}
        body["stream_options"] = {"include_usage": True}
        for _ in range(5):
            events = sse_events(httpx.post(srv.url + "/v1/completions", json=body).text)
            assert events[-1] == "[DONE]"
            assert events[-2]["usage"]["completion_tokens"] == 12
            texts = [e["choices"][0] for e in events[:-2]]
            assert [t["finish_reason"] for t in texts] == [None] * 11 + ["length"]


# -- jitter, on the event loop -----------------------------------------------------------------


async def _no_send(message: Message) -> None:
    raise AssertionError("a _Sink sends nothing")


class _Sink(Emitter):
    """An Emitter that sends nothing, recording (chunk, time) of what it was given."""

    def __init__(self) -> None:
        super().__init__(_no_send, lambda: None)
        self.got: list[tuple[bytes, float]] = []

    def emit(
        self, chunk: bytes, *, last: bool = False, on_sent: Callable[[], None] | None = None
    ) -> None:
        if not self.closed.done():
            self.got.append((chunk, asyncio.get_running_loop().time()))
            if last:
                self.close()


class _Greatest(FaultInjector):
    """Always the largest jitter allowed (until released), so the holds are known."""

    def jitter(self, fraction: float) -> float:
        return 0.0 if self.released else fraction


async def test_jitter_holds_a_chunk_by_its_share_of_latency_and_keeps_order() -> None:
    loop = asyncio.get_running_loop()
    sink = _Sink()
    start = loop.time() - 0.04  # the request came in 40 ms ago
    emitter = JitteredEmitter(sink, _Greatest(FaultConfig(ttft_jitter=1.0)), start)
    before = loop.time()
    emitter.emit(b"first")
    emitter.emit(b"second", last=True)  # no ITL jitter, but it must not overtake the first
    emitter.emit(b"third")  # after the last chunk: dropped, not held
    assert sink.got == [] and emitter.num_held == 2
    async with asyncio.timeout(5):
        await sink.closed
    assert [c for c, _ in sink.got] == [b"first", b"second"]
    # Held for 1.0 × its time to first token (40 ms and more), counted from when it came:
    # at least `before` + (`before` - start), however late this task ran (timers may fire
    # up to the clock's resolution early, never later than that).
    assert sink.got[0][1] >= before + (before - start) - 0.002


async def test_without_jitter_chunks_go_straight_through_and_close_drops_held() -> None:
    sink = _Sink()
    start = asyncio.get_running_loop().time()
    plain = JitteredEmitter(sink, FaultInjector(FaultConfig()), start)
    plain.emit(b"a")
    assert [c for c, _ in sink.got] == [b"a"]
    sink2 = _Sink()
    held = JitteredEmitter(sink2, _Greatest(FaultConfig(ttft_jitter=5.0)), start - 1.0)
    held.emit(b"late")
    held.close()
    await asyncio.sleep(0.01)
    assert sink2.got == [] and sink2.closed.done()


async def test_a_held_response_waits_until_the_client_leaves_or_shutdown() -> None:
    injector = _Greatest(FaultConfig(ttft_jitter=5.0))
    gone = asyncio.Event()
    held = asyncio.ensure_future(injector.hold(60.0, gone))
    await asyncio.sleep(0.01)
    assert not held.done()
    gone.set()
    await asyncio.wait_for(held, 5)
    held = asyncio.ensure_future(injector.hold(60.0, asyncio.Event()))
    sink = _Sink()
    start = asyncio.get_running_loop().time() - 1.0
    stream = JitteredEmitter(sink, injector, start)
    stream.emit(b"a")
    stream.emit(b"b", last=True)
    await asyncio.sleep(0.01)
    assert not held.done() and sink.got == []
    injector.release_all()  # shutdown: everything held goes out now, in order
    await asyncio.wait_for(held, 5)
    assert [c for c, _ in sink.got] == [b"a", b"b"] and sink.closed.done()
    assert injector.jitter(1.0) == 0.0  # and nothing is held from then on


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_ends_a_response_held_by_jitter(stream: bool) -> None:
    # Speedup 0.01: the first token takes ~1.65 s; seed 35's first jitter draw is 9.77 of
    # 10, so the response would be held ~16 s more after the engine is done with it. What is
    # held is an injected abort's cut: the client never gets it, so it is not counted.
    app = make_app(settings(faults=FaultConfig(ttft_jitter=10.0)), speedup_ratio=0.01, seed=35)
    with ServerThread(app) as srv:
        state = srv.app.state.mocker
        payload = json.dumps({**COMPLETION, "max_tokens": 1, "stream": stream}).encode()
        sock = socket.create_connection(("127.0.0.1", srv.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            + b"X-Mocker-Fail: abort\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(payload)
            + payload
        )
        deadline = time.monotonic() + 20
        while not sum(state.metrics[0].finished.values()):  # until the engine is done
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert state.in_flight == 1  # held
        sock.close()  # the client leaves
        deadline = time.monotonic() + 8  # well before the hold would end (~16 s)
        while state.in_flight:
            assert time.monotonic() < deadline, "the response outlived its client"
            time.sleep(0.02)
        assert not state.faults.num_holding
        assert state.faults.counts[FaultType.ABORT] == 0


# -- start-up delay and admin --------------------------------------------------------------------


def test_startup_delay_answers_503_until_ready() -> None:
    with ServerThread(make_app(settings(startup_delay=60.0))) as srv:
        url = srv.url
        assert httpx.get(url + "/health").status_code == 503
        r = httpx.post(url + "/v1/completions", json=COMPLETION)
        assert r.status_code == 503 and "starting up" in r.json()["error"]["message"]
        assert httpx.get(url + "/v1/models").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 200
        srv.app.state.mocker.ready_at = 0.0  # as if the minute had passed
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.post(url + "/v1/completions", json=COMPLETION).status_code == 200


def test_admin_config_exists_only_with_a_token(client_server: ServerThread) -> None:
    r = httpx.post(client_server.url + "/admin/config", json={"failure_rate": 1.0})
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    assert httpx.get(client_server.url + "/admin/config").status_code == 404


async def test_admin_config_changes_faults_at_runtime() -> None:
    app = make_app(replace(settings(admin_token="s3cret"), api_key="user-key"))
    admin = {"Authorization": "Bearer s3cret"}
    user = {"Authorization": "Bearer user-key"}
    async with AppClient(app) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, user):
            r = await c.http.post("/admin/config", json={"failure_rate": 1.0}, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
        # The admin token is not an API key either.
        r = await c.http.post("/v1/completions", json=COMPLETION, headers=admin)
        assert r.status_code == 401
        r = await c.http.post("/v1/completions", json=COMPLETION, headers=user)
        assert r.status_code == 200
        r = await c.http.post(
            "/admin/config", json={"failure_rate": 1.0, "failure_types": [503]}, headers=admin
        )
        assert r.status_code == 200
        assert r.json()["failure_rate"] == 1.0 and r.json()["failure_types"] == ["overloaded"]
        for _ in range(5):
            r = await c.http.post("/v1/completions", json=COMPLETION, headers=user)
            assert r.status_code == 503 and kind_of(r) == "overloaded"
        # A bad change is a 400 and changes nothing, not even the valid part.
        for bad in ({"failure_rate": 0.0, "failure_types": ["teapot"]}, {"nope": 1}, [1], "x"):
            r = await c.http.post("/admin/config", json=bad, headers=admin)
            assert r.status_code == 400 and r.json()["error"]["code"] == 400, bad
        r = await c.http.post("/admin/config", content=b"{not json", headers=admin)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        current = (await c.http.get("/admin/config", headers=admin)).json()
        assert current["failure_rate"] == 1.0 and current["failure_types"] == ["overloaded"]
        r = await c.http.post("/admin/config", json={"failure_rate": 0}, headers=admin)
        assert r.status_code == 200
        r = await c.http.post("/v1/completions", json=COMPLETION, headers=user)
        assert r.status_code == 200
        text = (await c.http.get("/metrics")).text
        assert injected(text)["overloaded"] == 5.0
