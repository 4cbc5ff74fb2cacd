"""vLLM's range checks of sampling values: the same 400s (message and field) on every route that
takes them, the boundaries accepted, and the ranges stated in the OpenAPI schema."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.servers import AppClient

# (field, value, vLLM's message): SamplingParams._verify_args's words.
REFUSED = [
    ("temperature", -0.5, "temperature must be non-negative, got -0.5."),
    ("temperature", 2.5, "temperature must be in [0, 2], got 2.5."),
    ("top_p", 0, "top_p must be in (0, 1], got 0.0."),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5."),
    ("top_k", -2, "top_k must be 0 (disable), or at least 1, got -2."),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5."),
    ("presence_penalty", 3, "presence_penalty must be in [-2, 2], got 3.0."),
    ("frequency_penalty", -2.5, "frequency_penalty must be in [-2, 2], got -2.5."),
    ("repetition_penalty", 0, "repetition_penalty must be greater than zero, got 0.0."),
    ("stop", ["ok", ""], "stop cannot contain an empty string."),
    ("stream_interval", 0, "stream_interval must be at least 1, got 0."),
]
# Each field at the ends of its range: accepted.
ACCEPTED = {"temperature": 2, "top_p": 1, "top_k": -1, "min_p": 0, "presence_penalty": -2,
            "frequency_penalty": 2, "repetition_penalty": 1e-9}  # fmt: skip


def _bodies(fields: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The same sampling fields on the three generation routes."""
    return [
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, **fields}),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}),
        ("/inference/v1/generate",
         {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2, **fields}}),
    ]  # fmt: skip


async def _refused_everywhere(client: AppClient, field: str, value: Any, message: str) -> None:
    """`field: value` is vLLM's 400, with `message` and `param`, on every generation route."""
    for path, body in _bodies({field: value}):
        r = await client.http.post(path, json=body)
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["message"] == message and error["param"] == field, path
        assert error["type"] == "BadRequestError"


@pytest.mark.parametrize(("field", "value", "message"), REFUSED)
async def test_a_value_vllm_refuses_is_a_400_naming_the_field(
    client: AppClient, field: str, value: Any, message: str
) -> None:
    await _refused_everywhere(client, field, value, message)


async def test_a_number_that_is_not_finite_is_refused(client: AppClient) -> None:
    # JSON has no NaN, yet Python's parser (and so FastAPI's, and vLLM's) takes the literal.
    r = await client.http.post(
        "/v1/completions",
        content=b'{"prompt": "hi", "temperature": NaN}',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "temperature must be a finite number, got nan."


async def test_the_ends_of_every_range_are_accepted(client: AppClient) -> None:
    for path, body in _bodies(ACCEPTED):
        r = await client.http.post(path, json=body)
        assert r.status_code == 200, (path, r.text)


async def test_the_schema_states_the_ranges(client: AppClient) -> None:
    schema = (await client.http.get("/openapi.json")).json()
    knobs = schema["components"]["schemas"]["CompletionRequest"]["properties"]

    def bounds(field: str) -> dict[str, Any]:
        number = next(s for s in knobs[field]["anyOf"] if s.get("type") != "null")
        return {k: v for k, v in number.items() if "imum" in k}

    assert bounds("temperature") == {"minimum": 0, "maximum": 2}
    assert bounds("top_p") == {"exclusiveMinimum": 0, "maximum": 1}
    assert bounds("top_k")["minimum"] == -1
    assert bounds("repetition_penalty") == {"exclusiveMinimum": 0}


VOCAB = 129280  # the bundled tokenizer's


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("logit_bias", {"5": 1.0, "x": 2.0},
         "logit_bias contains key(s) that cannot be converted to integer token IDs: ['x']"),
        ("logit_bias", {"5": 1.0, str(VOCAB): -100},
         f"token_id(s) [{VOCAB}] in logit_bias contain out-of-vocab token ids. "
         f"Vocabulary size: {VOCAB}"),
        ("allowed_token_ids", [], "allowed_token_ids is not None and empty!"),
        ("allowed_token_ids", [5, VOCAB], "allowed_token_ids contains out-of-vocab token id!"),
    ],
)  # fmt: skip
async def test_token_ids_for_sampling_must_be_in_the_vocabulary(
    client: AppClient, field: str, value: Any, message: str
) -> None:
    await _refused_everywhere(client, field, value, message)


async def test_token_ids_in_the_vocabulary_pass(client: AppClient) -> None:
    fields = {"logit_bias": {"5": 100, " 7": -100.5}, "allowed_token_ids": [0, VOCAB - 1]}
    for path, body in _bodies(fields):
        assert (await client.http.post(path, json=body)).status_code == 200, path
    r = await client.http.post("/v1/completions", json={"prompt": "x", "logit_bias": {"5": "x"}})
    assert r.status_code == 400  # (a bias is a number: vLLM types it too)
