"""POST /inference/v1/generate: vLLM's token-in/token-out route, streamed and not."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.parsing import sse_events
from tests.support.servers import AppClient, make_app

CHOICE_KEYS = ["index", "finish_reason", "stop_reason", "token_ids", "routed_experts",
               "sampling_mask", "weight_versions", "logprobs"]  # fmt: skip


async def test_generate_takes_and_returns_token_ids(client: AppClient) -> None:
    ids = list(range(1000, 1040))
    body = {"token_ids": ids, "sampling_params": {"max_tokens": 5}, "return_token_ids": True}
    r = await client.http.post("/inference/v1/generate", json=body, headers={"X-Request-Id": "g1"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["request_id"] == "generate-tokens-g1" and out["output_mode"] == "tokens"
    assert out["prompt_token_ids"] == ids
    (choice,) = out["choices"]
    assert list(choice) == CHOICE_KEYS
    assert len(choice["token_ids"]) == 5 and choice["finish_reason"] == "length"
    assert out["usage"]["prompt_tokens"] == 40 and out["usage"]["completion_tokens"] == 5
    again = (await client.http.post("/inference/v1/generate", json=body)).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32  # 2 full blocks
    assert again["prompt_token_ids"] == ids and "text" not in again["choices"][0]


async def test_generate_with_n_returns_n_choices_of_token_ids(client: AppClient) -> None:
    body = {"token_ids": list(range(1100, 1120)), "sampling_params": {"max_tokens": 3, "n": 2}}
    out = (await client.http.post("/inference/v1/generate", json=body)).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert [len(c["token_ids"]) for c in out["choices"]] == [3, 3]
    assert out["choices"][0]["token_ids"] != out["choices"][1]["token_ids"]
    assert out["usage"]["prompt_tokens"] == 20 and out["usage"]["completion_tokens"] == 6


async def test_generate_streams_token_id_deltas(client: AppClient) -> None:
    body = {
        "token_ids": [7, 8, 9],
        "sampling_params": {"max_tokens": 4},
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    r = await client.http.post("/inference/v1/generate", json=body)
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert chunks[0]["prompt_token_ids"] == [7, 8, 9]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4


async def test_generate_without_max_tokens_fills_the_context() -> None:
    async with AppClient(make_app(max_model_len=64)) as c:
        r = await c.http.post("/inference/v1/generate", json={"token_ids": list(range(60))})
        assert len(r.json()["choices"][0]["token_ids"]) == 4  # not 16: the room left


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"token_ids": []}, 400),
        ({"token_ids": [-1]}, 400),
        ({"token_ids": [10**9]}, 400),
        ({"token_ids": [1], "model": "nope"}, 404),
        ({"token_ids": [1], "output_mode": "text"}, 400),
        ({"token_ids": [1], "sampling_params": {"n": 4097}}, 400),
        ({"sampling_params": {}}, 400),
    ],
)
async def test_generate_refuses_bad_bodies_clearly(
    client: AppClient, body: dict[str, Any], status: int
) -> None:
    r = await client.http.post("/inference/v1/generate", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == status
