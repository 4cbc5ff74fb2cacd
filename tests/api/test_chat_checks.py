"""vLLM's checks of a chat body: the same 400s (message and field), what passes, and the rules
stated in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.servers import AppClient, make_app, settings

MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'

# (fields, vLLM's message, param): its ChatCompletionRequest validators' words.
REFUSED: list[tuple[dict[str, Any], str, str | None]] = [
    ({"tools": []}, "`tools` must not be an empty array. Either provide at least one tool or "
     "omit the field entirely.", "tools"),
    ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set.", "tool_choice"),
    ({"tool_choice": "required", "tools": None},
     "When using `tool_choice`, `tools` must be set.", "tool_choice"),
    ({"tool_choice": "any", "tools": [TOOL]}, 'Invalid value for `tool_choice`: any! Only named '
     'tools, "none", "auto" or "required" are supported.', "tool_choice"),
    ({"tool_choice": {"type": "function"}, "tools": [TOOL]},
     f"Invalid value for `function`: `None` in `tool_choice`! {USAGE}", "tool_choice.function"),
    ({"tool_choice": {"type": "function", "function": {}}, "tools": [TOOL]},
     f"Expected field `name` in `function` in `tool_choice`! {USAGE}",
     "tool_choice.function.name"),
    ({"tool_choice": {"type": "function", "function": {"name": ""}}, "tools": [TOOL]},
     f"Invalid `name` in `function`: `` in `tool_choice`! {USAGE}", "tool_choice.function.name"),
    ({"tool_choice": {"type": "function", "function": {"name": "other"}}, "tools": [TOOL]},
     "The tool specified in `tool_choice` does not match any of the specified `tools`",
     "tool_choice"),
    ({"response_format": {"type": "json_schema"}}, "When response_format type is 'json_schema', "
     "the 'json_schema' field must be provided.", "response_format"),
    ({"continue_final_message": True}, "Cannot set both `continue_final_message` and "
     "`add_generation_prompt` to True.", None),  # (add_generation_prompt defaults to true)
]  # fmt: skip
ACCEPTED: list[dict[str, Any]] = [
    {"tool_choice": "none"},  # no tools needed
    {"tool_choice": None},
    {"tools": [TOOL]},
    {"tools": [TOOL], "tool_choice": "required"},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"response_format": {"type": "json_object"}},
    {"continue_final_message": True, "add_generation_prompt": False},
]


@pytest.mark.parametrize(("fields", "message", "param"), REFUSED)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/chat/completions/render"])
async def test_what_vllm_refuses_in_a_chat_body_is_its_400(
    client: AppClient, path: str, fields: dict[str, Any], message: str, param: str | None
) -> None:
    r = await client.http.post(path, json={"messages": MESSAGES, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["message"], error["param"]) == (message, param)


async def test_what_vllm_takes_passes() -> None:
    # (A server started for tools, as vLLM must be for tool_choice "auto": see below.)
    tools = settings(enable_auto_tool_choice=True, tool_call_parser="hermes")
    async with AppClient(make_app(tools)) as client:
        for fields in ACCEPTED:
            r = await client.http.post(
                "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, **fields}
            )
            assert r.status_code == 200, (fields, r.text)


AUTO = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


async def test_tool_choice_auto_needs_the_servers_tool_flags(client: AppClient) -> None:
    """vLLM's gate, the 400 agents meet on a server started without tool flags: tool_choice
    "auto", given or the default with tools. "none", "required", a named tool or an explicit
    null pass; so does every choice once the server has both flags."""
    for fields in ({"tools": [TOOL]}, {"tools": [TOOL], "tool_choice": "auto"}):
        body = {"messages": MESSAGES, "max_tokens": 2, **fields}
        r = await client.http.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"] == AUTO
    for choice in ("none", "required", None,
                   {"type": "function", "function": {"name": "get_weather"}}):  # fmt: skip
        r = await client.http.post("/v1/chat/completions", json={
            "messages": MESSAGES, "max_tokens": 2, "tools": [TOOL], "tool_choice": choice,
        })  # fmt: skip
        assert r.status_code == 200, (choice, r.text)
    for only in (settings(enable_auto_tool_choice=True), settings(tool_call_parser="hermes")):
        async with AppClient(make_app(only)) as half:  # one flag is not enough
            r = await half.http.post("/v1/chat/completions",
                                     json={"messages": MESSAGES, "tools": [TOOL]})  # fmt: skip
            assert r.status_code == 400


async def test_the_schema_states_the_rules_it_can(client: AppClient) -> None:
    schema = (await client.http.get("/openapi.json")).json()
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["dependentRequired"] == {"tool_choice": ["tools"], "tools": ["tool_choice"]}
    continued, tops, stream_options = chat["allOf"]
    assert stream_options["then"]["properties"]["stream"] == {"const": True}
    assert continued["then"]["properties"]["add_generation_prompt"] == {"const": False}
    assert tops["then"]["properties"]["logprobs"] == {"const": True}
    assert chat["properties"]["tools"]["anyOf"][0]["minItems"] == 1


async def test_a_completions_json_schema_format_needs_its_schema(client: AppClient) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "response_format": {"type": "json_schema"}}
    r = await client.http.post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x"}}
    assert (await client.http.post("/v1/completions", json=body)).status_code == 200
