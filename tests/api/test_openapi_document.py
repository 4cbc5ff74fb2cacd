"""/openapi.json says what the server does: the media types and methods of the operations
routes, the generation routes' response bodies, and the rules the server enforces on requests
(schemathesis checks the server against all of it in test_openapi.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.servers import AppClient, make_app


async def _document(**engine: Any) -> dict[str, Any]:
    async with AppClient(make_app(**engine)) as c:
        doc: dict[str, Any] = (await c.http.get("/openapi.json")).json()
        return doc


async def test_operations_routes_have_their_real_media_types_and_methods() -> None:
    paths = (await _document())["paths"]
    for path in ("/health", "/ping"):
        ok = paths[path]["get"]["responses"]
        assert "content" not in ok["200"] and "503" in ok  # an empty body either way
    assert set(paths["/ping"]) == {"get", "post"}  # SageMaker's, as vLLM serves it
    assert set(paths["/flush_cache"]) == {"get", "post"}
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert list(paths["/flush_cache"]["post"]["responses"]["200"]["content"]) == ["text/plain"]


async def test_generation_routes_describe_their_bodies() -> None:
    doc = await _document()
    schemas, paths = doc["components"]["schemas"], doc["paths"]

    def ok(path: str, method: str = "post") -> dict[str, Any]:
        content: dict[str, Any] = paths[path][method]["responses"]["200"]["content"]
        return content

    assert ok("/v1/completions")["application/json"]["schema"] == {
        "$ref": "#/components/schemas/CompletionResponse"
    }
    assert ok("/v1/completions")["text/event-stream"]["schema"]["required"] == ["data"]
    assert ok("/v1/completions/render")["application/json"]["schema"]["type"] == "array"
    assert ok("/v1/models", "get")["application/json"]["schema"]["$ref"].endswith("ModelList")
    completion = schemas["CompletionResponse"]
    assert {"id", "object", "created", "model", "choices", "usage"} <= set(completion["required"])
    assert schemas["UsageInfo"]["properties"]["prompt_tokens"]["type"] == "integer"
    for path in ("/v1/chat/completions", "/v1/responses", "/inference/v1/generate",
                 "/tokenize", "/detokenize", "/v1/chat/completions/render"):  # fmt: skip
        assert ok(path)["application/json"]["schema"] != {}, path


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        ({"stop": [""]}, "stop cannot contain an empty string"),
        ({"stop": ""}, "stop cannot contain an empty string"),
        ({"priority": 1}, "Priority scheduling is not enabled"),
        ({"stream_options": {"include_usage": True}}, "only be defined when `stream=True`"),
    ],
)
async def test_what_the_document_rules_out_the_server_refuses(
    body: dict[str, Any], refused: str
) -> None:
    schema = (await _document())["components"]["schemas"]["CompletionRequest"]
    props = schema["properties"]
    assert {"type": "string", "minLength": 1} in props["stop"]["anyOf"]
    assert props["priority"]["const"] == 0
    rule = next(r for r in schema["allOf"] if "stream_options" in r["if"]["properties"])
    assert rule["then"]["properties"]["stream"] == {"const": True}
    async with AppClient(make_app()) as c:
        r = await c.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, **body})
        assert r.status_code == 400 and refused in r.json()["error"]["message"]
        # Within the rules: served.
        r = await c.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1,
                                                        "stop": ["x"], "priority": 0,
                                                        "stream_options": {}})  # fmt: skip
        assert r.status_code == 200


async def test_under_the_priority_policy_any_priority_is_documented() -> None:
    schemas = (await _document(scheduling_policy="priority"))["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest", "GenerateRequest"):
        assert "const" not in schemas[name]["properties"]["priority"], name


async def test_render_routes_check_no_priority_and_their_schema_says_so() -> None:
    doc = await _document()
    for path, name in (("/v1/completions/render", "CompletionRenderRequest"),
                       ("/v1/chat/completions/render", "ChatCompletionRenderRequest")):  # fmt: skip
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert "const" not in doc["components"]["schemas"][name]["properties"]["priority"]
    async with AppClient(make_app()) as c:
        r = await c.http.post("/v1/completions/render", json={"prompt": "hi", "priority": 5})
        assert r.status_code == 200  # rendering schedules nothing
