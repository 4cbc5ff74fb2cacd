"""Synthetic logprobs: vLLM's checks, valid distributions, its completion and chat shapes."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mocker.api.errors import OpenAIError
from mocker.api.logprobs import LogprobsFormat, merged, requested_logprobs
from tests.support.parsing import sse_events
from tests.support.servers import AppClient, make_app, settings, tokenizer

PALETTE = list(range(100, 164))


def _piece(token: int) -> str:
    return f" w{token}"


@pytest.mark.parametrize(
    ("chat", "logprobs", "top", "max_logprobs", "expected"),
    [
        (False, None, None, 20, None),
        (False, 0, None, 20, 0),
        (False, 20, None, 20, 20),
        (False, -1, None, -1, 1000),  # -1: the vocabulary, with a server that allows it
        (True, False, None, 20, None),
        (True, None, 0, 20, None),
        (True, True, None, 20, 0),  # (vLLM's top_logprobs default)
        (True, True, 5, 20, 5),
    ],
)
def test_what_a_request_asks_for(
    chat: bool, logprobs: Any, top: int | None, max_logprobs: int, expected: int | None
) -> None:
    got = requested_logprobs(chat=chat, logprobs=logprobs, top_logprobs=top,
                             max_logprobs=max_logprobs, vocab_size=1000)  # fmt: skip
    assert got == expected


@pytest.mark.parametrize(
    ("chat", "logprobs", "top", "message", "param"),
    [
        (False, 21, None, "Requested sample logprobs of 21, which is greater than max allowed: "
         "20", "logprobs"),
        (False, -1, None, "Requested sample logprobs of 1000, which is greater than max "
         "allowed: 20", "logprobs"),
        (False, -2, None, "`logprobs` must be a positive value or -1.", "logprobs"),
        (True, True, 21, "Requested sample logprobs of 21", "logprobs"),
        (True, True, -2, "`top_logprobs` must be a positive value or -1.", "top_logprobs"),
        (True, False, 3, "when using `top_logprobs`, `logprobs` must be set to true.",
         "top_logprobs"),
        (True, None, -1, "when using `top_logprobs`, `logprobs` must be set to true.",
         "top_logprobs"),
    ],
)  # fmt: skip
def test_vllms_refusals(
    chat: bool, logprobs: Any, top: int | None, message: str, param: str
) -> None:
    with pytest.raises(OpenAIError) as err:
        requested_logprobs(chat=chat, logprobs=logprobs, top_logprobs=top, max_logprobs=20,
                           vocab_size=1000)  # fmt: skip
    assert err.value.status == 400 and message in err.value.message
    assert err.value.param == param


def test_each_token_gets_a_valid_distribution_sampled_first_and_reproducible() -> None:
    fmt = LogprobsFormat(4, PALETTE, _piece, chat=False)
    tokens = [120, 7, 120, 163]  # in the palette or not, repeated
    out = fmt.choice("req-1").take(tokens)
    assert out["tokens"] == [_piece(t) for t in tokens]
    assert out["text_offset"] == [0, 5, 8, 13]  # where each token's text starts
    for sampled, tops in zip(out["token_logprobs"], out["top_logprobs"], strict=True):
        values = list(tops.values())
        assert len(tops) == 4 and values[0] == sampled  # the sampled token is the top one
        assert values == sorted(values, reverse=True) and all(v < 0 for v in values)
        assert sum(math.exp(v) for v in values) < 1.0
    # The same request id gives the same values; another, others; a later call continues.
    assert fmt.choice("req-1").take(tokens) == out
    assert fmt.choice("req-2").take(tokens)["token_logprobs"] != out["token_logprobs"]
    choice = fmt.choice("req-1")
    parts = [choice.take(tokens[:1]), choice.take(tokens[1:])]
    assert merged(parts, chat=False) == out


def test_the_chat_shape_and_a_top_of_zero() -> None:
    fmt = LogprobsFormat(2, PALETTE, _piece, chat=True)
    [entry] = fmt.choice("c").take([130])["content"]
    assert entry["token"] == " w130" and entry["bytes"] == list(b" w130")
    assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]
    assert len(entry["top_logprobs"]) == 2 and entry["top_logprobs"][1]["token"] != " w130"
    [alone] = LogprobsFormat(0, PALETTE, _piece, chat=True).choice("c").take([130])["content"]
    assert alone["top_logprobs"] == [] and alone["logprob"] == entry["logprob"]


def test_asking_for_the_whole_palette_terminates_with_distinct_tokens() -> None:
    fmt = LogprobsFormat(len(PALETTE) + 10, PALETTE, _piece, chat=False)
    [tops] = fmt.choice("all").take([PALETTE[3]])["top_logprobs"]
    assert len(tops) == len(PALETTE)  # every palette token once, the sampled one first


async def test_completions_return_logprobs_for_every_token(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/completions", json={"prompt": "hello there", "max_tokens": 5, "logprobs": 3, "n": 2}
    )
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        logprobs = choice["logprobs"]
        assert "".join(logprobs["tokens"]) == choice["text"]
        assert len(logprobs["token_logprobs"]) == 5 == len(logprobs["top_logprobs"])
        offsets = [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(5)]
        assert logprobs["text_offset"] == offsets


async def test_echo_with_logprobs_scores_the_prompt_too(client: AppClient) -> None:
    # lm-eval's loglikelihood request: the prompt echoed, its tokens scored (none for the
    # first), the generated ones after it, offsets running through both.
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 1, "logprobs": 1, "echo": True}
    same_id = {"X-Request-Id": "echo-lp"}  # (the same tokens both times)
    r = await client.http.post("/v1/completions", json=body, headers=same_id)
    choice = r.json()["choices"][0]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert choice["text"].startswith(tokenizer().decode([5, 6, 7, 8]))
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(v < 0 for v in logprobs["token_logprobs"][1:]) and len(logprobs["tokens"]) == 5
    offsets = [sum(len(t) for t in logprobs["tokens"][:i]) for i in range(5)]
    assert logprobs["text_offset"] == offsets
    streamed = await client.http.post(
        "/v1/completions", json={**body, "stream": True}, headers=same_id
    )
    [first] = sse_events(streamed.text)[0]["choices"]
    assert first["text"] == choice["text"] and first["logprobs"]["token_logprobs"][0] is None


async def test_the_choices_of_an_echoed_prompt_share_its_logprobs(client: AppClient) -> None:
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 2, "logprobs": 2, "echo": True, "n": 3}
    choices = (await client.http.post("/v1/completions", json=body)).json()["choices"]
    prompt_parts = [c["logprobs"]["token_logprobs"][:4] for c in choices]
    assert prompt_parts[0] == prompt_parts[1] == prompt_parts[2]  # the prompt's alone
    assert len({tuple(c["logprobs"]["token_logprobs"][4:]) for c in choices}) == 3
    for c in choices:
        tokens = c["logprobs"]["tokens"]
        assert c["logprobs"]["text_offset"] == [sum(map(len, tokens[:i])) for i in range(6)]


def test_a_top_entry_is_never_overwritten_by_a_likelier_texts_twin() -> None:
    fmt = LogprobsFormat(3, [100, 101, 102], lambda t: "same" if t != 101 else "other",
                         chat=False)  # fmt: skip
    [tops] = fmt.choice("x").take([100])["top_logprobs"]
    # 102 decodes as the sampled token does: the sampled token's (larger) value stays.
    assert list(tops) == ["same", "other"] and tops["same"] > tops["other"]


async def test_render_passes_logprobs_on_and_checks_them(client: AppClient) -> None:
    body = {"prompt": [5, 6], "max_tokens": 2, "logprobs": 3, "echo": True}
    [rendered] = (await client.http.post("/v1/completions/render", json=body)).json()
    assert rendered["sampling_params"]["logprobs"] == 3
    assert rendered["sampling_params"]["prompt_logprobs"] == 3
    r = await client.http.post("/v1/completions/render", json={**body, "logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
    chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}
    rendered = (await client.http.post("/v1/chat/completions/render", json=chat)).json()
    assert rendered["sampling_params"]["logprobs"] == 2


async def test_the_schema_states_the_servers_max_logprobs() -> None:
    async with AppClient(make_app(settings(max_logprobs=5))) as c:
        schema = (await c.http.get("/openapi.json")).json()["components"]["schemas"]
        bound = schema["CompletionRequest"]["properties"]["logprobs"]["anyOf"][0]
        assert bound["maximum"] == 5
        chat_bound = schema["ChatCompletionRequest"]["properties"]["top_logprobs"]["anyOf"][0]
        assert chat_bound["maximum"] == 5


async def test_streamed_logprobs_follow_the_chunks(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": "hi", "max_tokens": 6, "logprobs": 0, "stream": True},
        headers={"X-Request-Id": "lp-stream"},
    )
    chunks = [e["choices"][0] for e in sse_events(r.text)[:-1]]
    text = "".join(c["text"] for c in chunks)
    offsets = [o for c in chunks for o in c["logprobs"]["text_offset"]]
    tokens = [t for c in chunks for t in c["logprobs"]["tokens"]]
    assert "".join(tokens) == text and len(tokens) == 6
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(6)]
    # The same tokens with the same id, not streamed: the same values.
    body = {"prompt": "hi", "max_tokens": 6, "logprobs": 0}
    whole = await client.http.post("/v1/completions", json=body,
                                   headers={"X-Request-Id": "lp-stream"})  # fmt: skip
    streamed = [v for c in chunks for v in c["logprobs"]["token_logprobs"]]
    assert whole.json()["choices"][0]["logprobs"]["token_logprobs"] == streamed


async def test_chat_logprobs_streamed_and_not(client: AppClient) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    body = {"messages": messages, "max_tokens": 4, "logprobs": True, "top_logprobs": 3}
    r = await client.http.post("/v1/chat/completions", json=body)
    [choice] = r.json()["choices"]
    content = choice["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == choice["message"]["content"]
    assert all(len(c["top_logprobs"]) == 3 for c in content)
    r = await client.http.post("/v1/chat/completions", json={**body, "stream": True})
    events = sse_events(r.text)[:-1]
    assert events[0]["choices"][0]["logprobs"] is None  # the role chunk
    streamed = [c for e in events[1:] for c in e["choices"][0]["logprobs"]["content"]]
    assert len(streamed) == 4 and all(len(c["top_logprobs"]) == 3 for c in streamed)


async def test_without_logprobs_the_fields_stay_null(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.json()["choices"][0]["logprobs"] is None
    r = await client.http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True},
    )
    assert all(e["choices"][0]["logprobs"] is None for e in sse_events(r.text)[:-1])


async def test_max_logprobs_is_the_servers_bound() -> None:
    async with AppClient(make_app(settings(max_logprobs=2))) as c:
        r = await c.http.post("/v1/completions", json={"prompt": "x", "logprobs": 3})
        assert r.status_code == 400 and "max allowed: 2" in r.json()["error"]["message"]
        r = await c.http.post("/v1/completions", json={"prompt": "x", "logprobs": 2})
        assert r.status_code == 200
    assert tokenizer().vocab_size > 2


async def test_prompt_logprobs_score_each_prompt_token_after_the_first(client: AppClient) -> None:
    prompt = [5, 6, 7, 8]
    body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 2}
    [choice] = (await client.http.post("/v1/completions", json=body)).json()["choices"]
    scored = choice["prompt_logprobs"]
    assert scored[0] is None and len(scored) == 4
    for token, entries in zip(prompt[1:], scored[1:], strict=True):
        first = next(iter(entries))
        assert first == str(token) and entries[first]["rank"] == 1  # the prompt's own token
        assert entries[first]["decoded_token"] == tokenizer().decode([token])
        assert len(entries) == 2 and all(e["logprob"] < 0 for e in entries.values())
    # An echo of the prompt with logprobs shows the same values; a prompt sharing its first
    # three tokens, the same ones for them.
    echoed = {"prompt": prompt, "max_tokens": 1, "logprobs": 2, "echo": True}
    [echo] = (await client.http.post("/v1/completions", json=echoed)).json()["choices"]
    own = [e[str(t)]["logprob"] for t, e in zip(prompt[1:], scored[1:], strict=True)]
    assert echo["logprobs"]["token_logprobs"][1:4] == own
    other = {"prompt": [5, 6, 7, 9], "max_tokens": 1, "prompt_logprobs": 0}
    [again] = (await client.http.post("/v1/completions", json=other)).json()["choices"]
    assert [e["6"]["logprob"] if i == 0 else e["7"]["logprob"]
            for i, e in enumerate(again["prompt_logprobs"][1:3])] == own[:2]  # fmt: skip
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "prompt_logprobs": 0}
    out = (await client.http.post("/v1/chat/completions", json=chat)).json()
    assert out["prompt_logprobs"][0] is None and len(out["prompt_logprobs"]) >= 1


async def test_a_request_whose_prompt_is_scored_reads_no_prefix_hit(client: AppClient) -> None:
    # vLLM computes every prompt token of a request with prompt_logprobs (or an echo with
    # logprobs), to score it; its blocks are still cached for the others.
    prompt = list(range(3000, 3100))
    for body in ({"prompt_logprobs": 0}, {"echo": True, "logprobs": 0}, {}):
        r = await client.http.post("/v1/completions",
                                   json={"prompt": prompt, "max_tokens": 1, **body})  # fmt: skip
        cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == (96 if not body else 0), body


async def test_prompt_logprobs_read_as_vllms_integer_and_go_on_in_a_render(
    client: AppClient,
) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 1,
                                                        "prompt_logprobs": "1"})  # fmt: skip
    assert r.status_code == 200 and len(r.json()["choices"][0]["prompt_logprobs"]) == 2
    [rendered] = (await client.http.post("/v1/completions/render", json={
        "prompt": [5, 6], "max_tokens": 1, "prompt_logprobs": 2})).json()  # fmt: skip
    assert rendered["sampling_params"]["prompt_logprobs"] == 2
    r = await client.http.post("/v1/chat/completions/render", json={
        "messages": [{"role": "user", "content": "x"}], "prompt_logprobs": -7})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1, "prompt_logprobs": 1}}
    r = await client.http.post("/inference/v1/generate", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
        ({"prompt_logprobs": -2}, "must be a positive value or -1"),
        ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than max "
         "allowed: 20"),
        ({"prompt_logprobs": "two"}, "must be an integer"),
    ],
)  # fmt: skip
async def test_prompt_logprobs_refusals_are_vllms(
    client: AppClient, body: dict[str, Any], message: str
) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": "x", **body})
    assert r.status_code == 400 and message in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "prompt_logprobs"


async def test_generate_refuses_logprobs_clearly(client: AppClient) -> None:
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2, "logprobs": 1}}
    r = await client.http.post("/inference/v1/generate", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params"
