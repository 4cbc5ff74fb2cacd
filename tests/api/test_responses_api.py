"""POST /v1/responses: the input as the chat it renders to, a response object or its events."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from tests.support.servers import AppClient, ServerThread, tokenizer


def _events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], orjson.loads(lines["data"])))
    return out


async def test_a_response_object_with_its_message_and_usage(client: AppClient) -> None:
    body = {"input": "Hello there", "instructions": "Be brief.", "max_output_tokens": 6}
    r = await client.http.post("/v1/responses", json=body, headers={"X-Request-Id": "r1"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "resp_r1" and out["object"] == "response" and out["model"] == "mocker"
    assert out["status"] == "incomplete"  # it ran into max_output_tokens
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = out["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    [part] = message["content"]
    assert part["type"] == "output_text"
    assert len(tokenizer().encode(part["text"], add_special_tokens=False)) == 6
    # The same prompt as the chat of its instructions and input.
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Hello there"}], "max_tokens": 1}  # fmt: skip
    as_chat = (await client.http.post("/v1/chat/completions", json=chat)).json()
    usage = out["usage"]
    assert usage["input_tokens"] == as_chat["usage"]["prompt_tokens"]
    assert usage["output_tokens"] == 6 and usage["total_tokens"] == usage["input_tokens"] + 6
    assert usage["input_tokens_details"] == {"cached_tokens": 0}


async def test_a_response_that_stops_is_completed(client: AppClient) -> None:
    same = {"X-Request-Id": "r2"}  # (the same tokens both times)
    body: dict[str, Any] = {"input": "Hi", "max_output_tokens": 6, "ignore_eos": True}
    first = (await client.http.post("/v1/responses", json=body, headers=same)).json()
    words = first["output"][0]["content"][0]["text"].split()
    body["stop"] = [words[1]]  # (vLLM's extras pass on to the chat it runs as)
    out = (await client.http.post("/v1/responses", json=body, headers=same)).json()
    assert out["status"] == "completed" and out["incomplete_details"] is None
    assert out["output"][0]["status"] == "completed"
    assert out["output"][0]["content"][0]["text"].split() == words[:1]


async def test_the_stream_of_events(client: AppClient) -> None:
    body = {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
        "max_output_tokens": 4,
        "stream": True,
        "ignore_eos": True,
    }
    r = await client.http.post("/v1/responses", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    events = _events(r.text)
    names = [name for name, _ in events]
    assert names == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 4,
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.incomplete",
    ]  # fmt: skip
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert all(data["type"] == name for name, data in events)
    text = "".join(data["delta"] for name, data in events if name.endswith(".delta"))
    assert events[8][1]["text"] == text
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == 4 and final["status"] == "incomplete"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "model": "nope"}, "model"),
        ({"input": [{}]}, "input"),
        ({"input": "x", "stop": 5}, "stop"),
        ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
        ({"instructions": "Be brief.", "input": []}, "input"),
        ({"input": "x", "max_output_tokens": 2, "min_tokens": 3}, "min_tokens"),
    ],
)
async def test_what_it_cannot_answer_is_a_clear_4xx(
    client: AppClient, body: dict[str, Any], param: str
) -> None:
    r = await client.http.post("/v1/responses", json=body)
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert error["param"] == param
    # The fields it names are the responses body's, not those of the chat it runs as.
    for chat_name in ("messages", "max_completion_tokens", "max_tokens"):
        assert chat_name not in error["message"]
    assert not client.state.engines[0].core.requests


async def test_a_text_format_is_accepted_as_a_chats_response_format(client: AppClient) -> None:
    text = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
    r = await client.http.post("/v1/responses", json={"input": "x", "text": text,
                                                      "max_output_tokens": 2})  # fmt: skip
    assert r.status_code == 200, r.text


async def test_a_failure_mid_stream_is_an_error_event(client: AppClient) -> None:
    body = {"input": "Hi", "max_output_tokens": 20, "stream": True}
    r = await client.http.post("/v1/responses", json=body, headers={"X-Mocker-Fail": "abort"})
    events = _events(r.text)
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and "aborted" in data["message"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))


def test_the_openai_clients_responses_api(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    response = client.responses.create(model="mocker", input="Say something", max_output_tokens=5)
    assert response.status == "incomplete" and response.usage is not None
    assert response.usage.output_tokens == 5
    assert len(tokenizer().encode(response.output_text, add_special_tokens=False)) == 5
    stream = client.responses.create(model="mocker", input="Again", max_output_tokens=3,
                                     stream=True)  # fmt: skip
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 3 and events[-1].type == "response.incomplete"
