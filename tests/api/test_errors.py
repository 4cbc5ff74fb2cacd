"""Bad input: every client mistake is a 4xx in the OpenAI error shape, never a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.engines import req
from tests.support.servers import AppClient, make_app, settings


def _assert_error(r: Any, status: int, fragment: str = "", param: str | None = "any") -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status and err["message"]
    assert fragment.lower() in err["message"].lower(), err["message"]
    if param != "any":
        assert err["param"] == param


async def test_malformed_json_is_400(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/completions", content=b'{"prompt": "x",', headers={"content-type": "application/json"}
    )
    _assert_error(r, 400, "not valid JSON")
    r = await client.http.post("/v1/completions", content=b"prompt=x")
    _assert_error(r, 400, "JSON object")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
        ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
        ({"prompt": "x", "stream": "yes please"}, "stream"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({}, "prompt"),
    ],
)
async def test_wrong_types_and_ranges_are_400(
    client: AppClient, body: dict[str, Any], param: str
) -> None:
    _assert_error(await client.http.post("/v1/completions", json=body), 400, param=param)


async def test_empty_prompts_are_400(client: AppClient) -> None:
    for prompt in ("", [], [""]):
        r = await client.http.post("/v1/completions", json={"prompt": prompt})
        _assert_error(r, 400, "empty", param="prompt")
    r = await client.http.post("/v1/chat/completions", json={"messages": []})
    _assert_error(r, 400, param="messages")


async def test_chat_bad_messages_are_400(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    )
    _assert_error(r, 400, "not supported", param="messages")
    r = await client.http.post("/v1/chat/completions", json={"messages": [{"content": "x"}]})
    _assert_error(r, 400, param="messages")
    body = {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}
    r = await client.http.post("/v1/chat/completions", json=body)
    _assert_error(r, 400, param="max_completion_tokens")


async def test_out_of_vocabulary_token_ids_are_400(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": [1, 2, 10**7]})
    _assert_error(r, 400, "out of vocabulary", param="prompt")
    r = await client.http.post("/detokenize", json={"tokens": [129280]})
    _assert_error(r, 400, "out of vocabulary")


async def test_unknown_model_is_404(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"model": "gpt-9", "prompt": "x"})
    _assert_error(r, 404, "The model `gpt-9` does not exist.", param="model")


async def test_prompt_longer_than_context_is_400_with_vllms_message(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": [5] * 5000})
    message = (
        "This model's maximum context length is 4096 tokens. However, your prompt contains "
        "5000 input tokens"
    )
    _assert_error(r, 400, message, param="prompt")


async def test_unsupported_options_are_clear_400s(client: AppClient) -> None:
    cases = [
        ("/v1/completions", {"prompt": "x", "n": 4097}, "n"),
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of"),
        ("/v1/completions", {"prompt": "x", "suffix": "y"}, "suffix"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
    ]
    for path, body, param in cases:
        _assert_error(await client.http.post(path, json=body), 400, param=param)


async def test_stream_options_without_stream_is_vllms_400(client: AppClient) -> None:
    chat = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 2}),
                       ("/v1/chat/completions", chat)):  # fmt: skip
        for stream in ({}, {"stream": False}):
            r = await client.http.post(
                path, json={**body, **stream, "stream_options": {"include_usage": True}}
            )
            _assert_error(r, 400, "Stream options can only be defined when `stream=True`.",
                          param="stream_options")  # fmt: skip
        # vLLM looks at the value as sent: an empty object or null passes, as with a stream.
        options: dict[str, Any] | None
        for options in ({}, None):
            r = await client.http.post(path, json={**body, "stream_options": options})
            assert r.status_code == 200, r.text
        r = await client.http.post(
            path, json={**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        assert r.status_code == 200


async def test_a_priority_without_the_priority_policy_is_vllms_400(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": "x", "priority": 10})
    _assert_error(r, 400, "Got priority 10 but Priority scheduling is not enabled.", None)
    r = await client.http.post("/v1/completions", json={"prompt": "x", "priority": 0})
    assert r.status_code == 200
    async with AppClient(make_app(scheduling_policy="priority")) as prioritized:
        r = await prioritized.http.post(
            "/v1/completions", json={"prompt": "x", "max_tokens": 2, "priority": -5}
        )
        assert r.status_code == 200, r.text


async def test_min_tokens_above_max_tokens_is_400(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/completions", json={"prompt": "x", "max_tokens": 2, "min_tokens": 5}
    )
    _assert_error(r, 400, "min_tokens", param="min_tokens")


async def test_api_key_guards_v1_only() -> None:
    async with AppClient(make_app(settings(api_key="sekret"))) as c:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "sekret"}):
            r = await c.http.post("/v1/completions", json={"prompt": "x"}, headers=headers)
            _assert_error(r, 401, "API key")
            _assert_error(await c.http.get("/v1/models", headers=headers), 401)
        ok = {"Authorization": "Bearer sekret"}
        r = await c.http.post("/v1/completions", json={"prompt": "x"}, headers=ok)
        assert r.status_code == 200
        assert (await c.http.get("/health")).status_code == 200
        assert (await c.http.get("/metrics")).status_code == 200


async def test_queue_beyond_max_num_queued_reqs_is_503() -> None:
    # vLLM 0.34: the limit counts requests in flight, waiting or running. A tenth of real
    # time: the first request runs for ~25 s, so it is certainly in flight when the next
    # come, however loaded the machine.
    app = make_app(settings(max_num_queued_reqs=2), max_num_seqs=1, speedup_ratio=0.1)
    async with AppClient(app) as c:
        long = {"prompt": [1, 2, 3], "max_tokens": 400}
        engine = c.state.engines[0]
        running = asyncio.ensure_future(c.http.post("/v1/completions", json=long))
        async with asyncio.timeout(10):
            while engine.num_running < 1:
                await asyncio.sleep(0.005)
        r = await c.http.post("/v1/completions", json={"prompt": "x", "n": 2})  # 1 + 2 > 2
        _assert_error(r, 503, "The engine is currently busy and cannot accept new requests.")
        waiting = asyncio.ensure_future(c.http.post("/v1/completions", json=long))
        async with asyncio.timeout(10):
            while engine.num_waiting < 1:
                await asyncio.sleep(0.005)
        r = await c.http.post("/v1/completions", json={"prompt": "x"})
        _assert_error(r, 503, "try again later or on a different instance")
        metrics = (await c.http.get("/metrics")).text
        assert (
            'vllm:admission_rejections_total{model_name="mocker",reason="max_num_queued_reqs"} 2.0'
            in metrics
        )
        assert 'reason="max_num_queued_tokens"} 0.0' in metrics
        running.cancel()
        waiting.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)


async def test_a_prefill_backlog_beyond_max_num_queued_tokens_is_503() -> None:
    # vLLM 0.34: prompts count whole until their first token; refused while they hold the
    # limit (the new prompt's own tokens are not counted).
    c = AppClient(make_app(settings(max_num_queued_tokens=10)))
    c.state.engines.start = lambda: None  # (nothing runs)
    async with c:
        c.state.engines[0].add_request(req("queued", [5] * 8))
        c.state.serving._admit(1)  # 8 tokens < 10: admitted
        c.state.engines[0].add_request(req("second", [5] * 2))
        assert c.state.engines.prefill_backlog() == 10
        r = await c.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        _assert_error(r, 503, "The engine has reached its prefill token backlog limit.")
        assert c.state.serving.rejections == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 1}


async def test_duplicate_in_flight_request_id_is_400() -> None:
    async with AppClient(make_app(speedup_ratio=0.1)) as c:  # the first runs for ~20 s
        headers = {"X-Request-Id": "same"}
        body = {"prompt": "x", "max_tokens": 300}
        first = asyncio.ensure_future(c.http.post("/v1/completions", json=body, headers=headers))
        async with asyncio.timeout(10):
            while "same" not in c.state.engines[0].core.requests:
                await asyncio.sleep(0.005)
        r = await c.http.post("/v1/completions", json=body, headers=headers)
        _assert_error(r, 400, "already in use")
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)


GARBAGE: list[Any] = [
    None, [], "text", 0, {"prompt": None}, {"prompt": {"a": 1}}, {"prompt": [1.5]},
    {"prompt": [[1], "x"]}, {"prompt": "x", "stop": 3}, {"prompt": "x", "stop_token_ids": ["a"]},
    {"prompt": "x", "stream_options": "yes"}, {"prompt": "x", "priority": "high"},
    {"prompt": "x", "max_tokens": 1.5}, {"prompt": "x", "max_tokens": [1]},
    {"prompt": [2**40]}, {"prompt": "x", "n": 0}, {"prompt": "x", "model": 5},
    {"messages": "hi"}, {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
    {"messages": [None]}, {"prompt": "x", "min_tokens": 10**9, "max_tokens": 5},
]  # fmt: skip


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
async def test_no_input_yields_a_500(client: AppClient, path: str) -> None:
    for body in GARBAGE:
        r = await client.http.post(path, json=body)
        assert r.status_code < 500, (body, r.status_code, r.text)
        if r.status_code >= 400:
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        else:  # only /tokenize accepts some of these (its fields are optional)
            assert path == "/tokenize", body
    assert client.state.engines[0].core.pool.num_used == 0


async def test_lone_surrogates_are_400_and_never_reach_the_engine(client: AppClient) -> None:
    bodies = [
        b'{"prompt": "hello", "cache_salt": "\\ud800"}',
        b'{"prompt": "\\ud800"}',
        b'{"prompt": "x", "model": "\\ud800"}',
        b'{"prompt": "x", "stop": ["\\udc00"]}',
        b'{"prompt": "x", "vendor": {"k": "\\ud800"}}',
        b'{"messages": [{"role": "user", "content": "a\\udc00"}]}',
    ]
    for raw in bodies:
        path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
        r = await client.http.post(path, content=raw, headers={"content-type": "application/json"})
        _assert_error(r, 400, "not valid Unicode")
    r = await client.http.post(
        "/tokenize", content=b'{"prompt": "\\ud800"}', headers={"content-type": "application/json"}
    )
    _assert_error(r, 400, "not valid Unicode")
    assert not client.state.engines.is_dead
    assert (await client.http.post("/v1/completions", json={"prompt": "ok"})).status_code == 200
