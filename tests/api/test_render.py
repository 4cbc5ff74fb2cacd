"""vLLM's render endpoints: the token ids the engine would run, in vLLM's GenerateRequest."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.servers import AppClient

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
GENERATE_REQUEST_KEYS = [
    "request_id", "token_ids", "token_offsets", "features", "content_parts", "sampling_params",
    "model", "reasoning_ended", "reasoning_parser_kwargs", "return_token_ids", "output_mode",
    "parse_context", "stream", "stream_options", "cache_salt", "priority",
    "kv_transfer_params", "ec_transfer_params",
]  # fmt: skip


async def _engine_prompt(c: AppClient, path: str, body: dict[str, Any]) -> list[int]:
    """The prompt the engine ran for `body` (return_token_ids)."""
    r = await c.http.post(path, json={**body, "max_tokens": 1, "return_token_ids": True})
    assert r.status_code == 200, r.text
    out = r.json()
    ids: list[int] = (
        out["prompt_token_ids"]
        if "prompt_token_ids" in out
        else out["choices"][0]["prompt_token_ids"]
    )
    return ids


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]},
        {"messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
         "tool_choice": "required"},  # ("auto" needs the tool flags: test_chat_checks)
        {"messages": [{"role": "system", "content": "JSON only."},
                      {"role": "user", "content": [{"type": "text", "text": "A city."}]}],
         "response_format": {"type": "json_object"}},
        {"messages": [{"role": "user", "content": "Go on"}, {"role": "assistant",
                       "content": "Once"}], "continue_final_message": True,
         "add_generation_prompt": False},
    ],
)  # fmt: skip
async def test_chat_render_gives_the_engines_token_ids(
    client: AppClient, body: dict[str, Any]
) -> None:
    r = await client.http.post("/v1/chat/completions/render", json=body)
    assert r.status_code == 200, r.text
    rendered = r.json()
    assert list(rendered) == GENERATE_REQUEST_KEYS  # one object, vLLM's fields in order
    assert rendered["token_ids"] == await _engine_prompt(client, "/v1/chat/completions", body)
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["features"] is None
    assert rendered["parse_context"]["tools"] == body.get("tools")


async def test_tools_are_rendered_into_the_prompt(client: AppClient) -> None:
    messages = [{"role": "user", "content": "Weather?"}]
    plain = await client.http.post("/v1/chat/completions/render", json={"messages": messages})
    tooled = await client.http.post(
        "/v1/chat/completions/render", json={"messages": messages, "tools": TOOLS}
    )
    assert len(tooled.json()["token_ids"]) > len(plain.json()["token_ids"])
    # ...and the completion route prompts with the same ids (usage counts them)
    r = await client.http.post(  # (tool_choice "none": this server has no tool flags)
        "/v1/chat/completions",
        json={"messages": messages, "tools": TOOLS, "tool_choice": "none", "max_tokens": 1},
    )
    assert r.json()["usage"]["prompt_tokens"] == len(tooled.json()["token_ids"])


async def test_completions_render_is_one_object_per_prompt(client: AppClient) -> None:
    body = {"prompt": ["first prompt", "and a second"], "max_tokens": 7, "temperature": 0.5}
    r = await client.http.post("/v1/completions/render", json=body, headers={"X-Request-Id": "abc"})
    assert r.status_code == 200, r.text
    first, second = r.json()
    assert (first["request_id"], second["request_id"]) == ("cmpl-abc-0", "cmpl-abc-1")
    assert first["sampling_params"] == {"max_tokens": 7, "temperature": 0.5}  # non-defaults
    assert first["parse_context"] is None and first["output_mode"] == "tokens"
    r = await client.http.post(
        "/v1/completions", json={**body, "max_tokens": 1, "return_token_ids": True}
    )
    engine = [c["prompt_token_ids"] for c in r.json()["choices"]]
    assert [first["token_ids"], second["token_ids"]] == engine


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions/render", {"prompt": "x", "model": "nope"}, 404, "model"),
        ("/v1/completions/render", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions/render", {"prompt": [1] * 5000}, 400, "prompt"),
        ("/v1/completions/render", {"prompt": [10**9]}, 400, "prompt"),
        ("/v1/chat/completions/render", {"messages": []}, 400, None),
        ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "x"}],
                                         "tools": "not a list"}, 400, None),
    ],
)  # fmt: skip
async def test_render_refuses_what_the_completion_routes_refuse(
    client: AppClient, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = await client.http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status
    if param is not None:
        assert error["param"] == param


async def test_a_body_nested_too_deep_is_a_400_not_a_500(client: AppClient) -> None:
    deep: Any = "x"
    for _ in range(300):  # orjson writes at most 255 levels back
        deep = [deep]
    body = {"messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "x": deep}]}  # fmt: skip
    r = await client.http.post("/v1/chat/completions/render", json=body)
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]["message"]
