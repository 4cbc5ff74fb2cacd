"""The generation routes served past FastAPI's stack: taken only where they answer alike.

A request the direct path takes must never enter the framework; one it does not take must
reach FastAPI with its body intact; and for every request, whichever path serves it, the
client sees what the FastAPI routes alone answer (same status, same body but for ids).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from mocker.api.chat_bodies import ChatCompletionRequest
from mocker.api.completion_bodies import CompletionRequest
from mocker.api.direct_routes import DirectRoutes
from mocker.api.prepare import prepare_chat, prepare_completion
from mocker.api.raw_send import RawSendApp
from tests.support.servers import AppClient, ServerThread, make_app, settings

JSON = {"content-type": "application/json"}


@pytest.fixture
def framework_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests that entered FastAPI's own `__call__`."""
    calls: list[str] = []
    real = FastAPI.__call__

    async def counted(self: FastAPI, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
        await real(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", counted)
    return calls


async def _pair(**changes: Any) -> AsyncIterator[tuple[AppClient, AppClient]]:
    """Two servers alike: the first serves generation POSTs directly, the second never."""
    server_settings = settings(**changes)
    direct, framework = make_app(server_settings), make_app(server_settings)
    assert isinstance(framework, RawSendApp) and framework.direct is not None
    framework.direct = None
    async with AppClient(direct) as a, AppClient(framework) as b:
        yield a, b


@pytest.fixture
async def pair() -> AsyncIterator[tuple[AppClient, AppClient]]:
    async for clients in _pair():
        yield clients


def _comparable(body: bytes) -> Any:
    """A response body without what differs from request to request (ids, times).

    A JSON body is compared as its document; an event stream event by event, each event's
    document stripped alike (its `created` second may tick over between the two requests).
    """
    if body.startswith(b"data: "):
        return [_comparable(event[len(b"data: ") :]) for event in body.split(b"\n\n") if event]
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if isinstance(doc, dict):
        for key in ("id", "created"):
            doc.pop(key, None)
    return doc


async def _same(
    pair: tuple[AppClient, AppClient], path: str, content: bytes, headers: dict[str, str]
) -> tuple[int, Any]:
    answers = []
    for client in pair:
        r = await client.http.post(path, content=content, headers=headers)
        answers.append((r.status_code, _comparable(r.content), r.headers.get("content-type")))
    assert answers[0] == answers[1]
    return answers[0][0], answers[0][1]


VALID = [
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 4, "ignore_eos": True}),
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 3, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
      "stream_options": {"include_usage": True}}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body"), VALID)
async def test_a_valid_generation_request_never_enters_the_framework(
    pair: tuple[AppClient, AppClient], framework_calls: list[str], path: str, body: Any
) -> None:
    direct, _ = pair
    r = await direct.http.post(path, json=body, headers={"x-request-id": "abc"})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == "abc"
    assert framework_calls == []
    await direct.http.get("/v1/models")
    assert framework_calls == ["/v1/models"]  # every other route still goes through it


@pytest.mark.parametrize(("path", "body"), VALID)
async def test_a_valid_request_gets_what_the_framework_route_answers(
    pair: tuple[AppClient, AppClient], path: str, body: Any
) -> None:
    # Outputs are seeded by the request id: the same id gives the same tokens on both.
    status, doc = await _same(pair, path, orjson.dumps(body), {**JSON, "x-request-id": "r1"})
    assert status == 200
    if not body.get("stream"):
        assert doc["usage"]["completion_tokens"] == body["max_tokens"]


BAD: list[tuple[str, bytes, dict[str, str]]] = [
    ("/v1/completions", b'{"prompt": "x",', JSON),  # not JSON
    ("/v1/completions", b"prompt=x", {}),  # not JSON, no content type
    ("/v1/completions", b"", JSON),  # no body
    ("/v1/completions", b'["prompt"]', JSON),  # not an object
    ("/v1/completions", b'{"prompt": 5}', JSON),  # wrong type
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 0}', JSON),  # out of range
    ("/v1/completions", b'{"prompt": ""}', JSON),  # refused by serving, not the model
    ("/v1/completions", b'{"prompt": "x", "model": "nope"}', JSON),  # unknown model: 404
    ("/v1/completions", b'{"prompt": "x"}', {"content-type": "text/plain"}),  # FastAPI: 400
    ("/v1/completions", b'{"prompt": "\\ud800"}', JSON),  # a lone surrogate (orjson refuses)
    ("/v1/completions", b'\xef\xbb\xbf{"prompt": "x", "max_tokens": 2}', JSON),  # BOM: json ok
    ("/v1/completions", b'{"prompt": "x", "max_tokens": NaN}', JSON),  # json.loads takes NaN
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 99999999999999999999999}', JSON),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}',
     {"content-type": "application/vnd+json"}),
    # Integers past 64 bits where no field type refuses them (orjson would make them floats).
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "foo": 99999999999999999999999}',
     JSON),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "logit_bias": {"5": 1e2}}', JSON),
    ("/v1/completions",
     b'{"prompt": "x", "max_tokens": 2, "logit_bias": {"5": 100000000000000000000000}}', JSON),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}',
     {"content-type": "application/a/b+json"}),  # two slashes: text/plain to FastAPI
    ("/v1/chat/completions", b'{"messages": "hi"}', JSON),
    ("/v1/chat/completions", b'{"messages": [{"role": "user"}]}', JSON),
    ("/v1/chat/completions", b'{"messages": []}', JSON),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', {"x-data-parallel-rank": "9"}),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', {"x-data-parallel-rank": "a"}),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2}', {"x-mocker-fail": "bogus"}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "content", "headers"), BAD)
async def test_every_other_request_is_answered_as_the_framework_answers_it(
    pair: tuple[AppClient, AppClient], path: str, content: bytes, headers: dict[str, str]
) -> None:
    status, doc = await _same(pair, path, content, {**headers, "x-request-id": "same"})
    if status != 200:
        assert set(doc["error"]) == {"message", "type", "param", "code"}, doc


async def test_a_refused_body_reaches_the_framework_whole(
    pair: tuple[AppClient, AppClient], framework_calls: list[str]
) -> None:
    direct, _ = pair
    r = await direct.http.post("/v1/completions", json={"prompt": "x", "max_tokens": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert framework_calls == ["/v1/completions"]


async def test_other_methods_and_paths_are_the_framework_s() -> None:
    async for pair in _pair():
        for method, path in (("GET", "/v1/completions"), ("POST", "/v1/completions/")):
            answers = [await c.http.request(method, path, json={"prompt": "x"}) for c in pair]
            assert {a.status_code for a in answers} != {200}
            assert answers[0].status_code == answers[1].status_code
            assert answers[0].content == answers[1].content


async def test_the_api_key_is_checked_as_on_the_framework_routes() -> None:
    async for pair in _pair(api_key="sekret"):
        body = orjson.dumps({"prompt": "x", "max_tokens": 2})
        for auth in ({}, {"authorization": "Bearer wrong"}, {"authorization": "sekret"}):
            status, _ = await _same(pair, "/v1/completions", body, {**JSON, **auth})
            assert status == 401
        status, _ = await _same(
            pair, "/v1/completions", body,
            {**JSON, "authorization": "Bearer sekret", "x-request-id": "k"},
        )  # fmt: skip
        assert status == 200


async def test_an_empty_api_key_leaves_the_routes_open_on_both_paths() -> None:
    async for pair in _pair(api_key=""):
        body = orjson.dumps({"prompt": "x", "max_tokens": 2})
        status, _ = await _same(pair, "/v1/completions", body, {**JSON, "x-request-id": "e"})
        assert status == 200


async def test_a_draining_server_refuses_alike(pair: tuple[AppClient, AppClient]) -> None:
    for client in pair:
        client.state.draining = True
    status, doc = await _same(pair, "/v1/completions", b'{"prompt": "x"}', JSON)
    assert status == 503 and "shutting down" in doc["error"]["message"]


def test_a_bug_in_serving_is_a_500_in_the_openai_shape_on_both_paths(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    answers = []
    for direct in (True, False):
        app = make_app()
        assert isinstance(app, RawSendApp)
        monkeypatch.setattr(app.state.mocker.serving, "completions", broken)
        # (The direct path binds the serving method when it is built.)
        app.direct = DirectRoutes(app.state.mocker) if direct else None
        with ServerThread(app) as server:
            r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "x"}, timeout=30)
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1]
    assert answers[0] == (500, {"error": {"message": "internal error: KeyError",
                                          "type": "InternalServerError", "param": None,
                                          "code": 500}})  # fmt: skip
    assert "unhandled error on POST /v1/completions" in caplog.text


async def test_a_client_gone_while_sending_the_body_costs_nothing(
    pair: tuple[AppClient, AppClient],
) -> None:
    app, state = pair[0].app, pair[0].state
    sent: list[Message] = []
    messages: list[Message] = [
        {"type": "http.disconnect"},
        {"type": "http.request", "body": b'{"prompt": "x", ', "more_body": True},
    ]  # fmt: skip

    async def receive() -> Message:
        return messages.pop()

    async def send(message: Message) -> None:
        sent.append(message)

    scope = _scope("/v1/completions", [(b"content-type", b"application/json")])
    await app(scope, receive, send)
    assert sent == []
    assert state.serving.open_responses == 0
    await asyncio.sleep(0)
    assert not state.engines.engines[0].core.has_unfinished_requests()


def _scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }  # fmt: skip


async def test_the_first_of_repeated_headers_counts_as_on_the_framework_routes(
    pair: tuple[AppClient, AppClient],
) -> None:
    headers = [(b"content-type", b"application/json"), (b"x-request-id", b"first"),
               (b"x-request-id", b"second")]  # fmt: skip
    for client in pair:
        started: list[Message] = []
        body: list[Message] = [
            {
                "type": "http.request",
                "body": b'{"prompt": "x", "max_tokens": 1}',
                "more_body": False,
            }
        ]

        async def receive(body: list[Message] = body) -> Message:
            if not body:
                await asyncio.Event().wait()  # the client stays
            return body.pop()

        async def send(message: Message, started: list[Message] = started) -> None:
            if message["type"] == "http.response.start":
                started.append(message)

        await client.app(_scope("/v1/completions", headers), receive, send)
        assert started[0]["status"] == 200
        assert (b"x-request-id", b"first") in started[0]["headers"]


def test_the_routes_taken_are_the_framework_s_generation_posts() -> None:
    app = make_app()
    assert isinstance(app, RawSendApp) and app.direct is not None
    take = app.direct.route
    serving = app.state.mocker.serving
    assert take(_scope("/v1/completions", [])) == (CompletionRequest, serving.completions,
                                                   prepare_completion)  # fmt: skip
    assert take(_scope("/v1/chat/completions", [])) == (ChatCompletionRequest, serving.chat,
                                                        prepare_chat)  # fmt: skip
    behind_proxy = {**_scope("/api/v1/completions", []), "root_path": "/api"}
    assert take(behind_proxy) == (CompletionRequest, serving.completions, prepare_completion)
    for path in ("/v1/completions/", "/v1/completions/render", "/v1/models", "/api/v1/completions"):
        assert take(_scope(path, [])) is None
    assert take({**_scope("/v1/completions", []), "method": "GET"}) is None
