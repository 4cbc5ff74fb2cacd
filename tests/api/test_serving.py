"""Completions and chat over the ASGI app: usage, prompts, streams, limits, stops, text."""

from __future__ import annotations

from typing import Any

from tests.support.clocks import LateClock
from tests.support.parsing import sse_events
from tests.support.servers import AppClient, make_app, settings, tokenizer


async def _complete(c: AppClient, path: str = "/v1/completions", **body: Any) -> dict[str, Any]:
    r = await c.http.post(path, json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def test_completion_usage_counts_match_a_client_tokenizer(client: AppClient) -> None:
    prompt = "Once upon a time, in a land far away, there lived a mock engine."
    body = await _complete(client, prompt=prompt, max_tokens=20)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(tokenizer().encode(prompt))
    assert usage["completion_tokens"] == 20 and usage["total_tokens"] == usage["prompt_tokens"] + 20
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert len(tokenizer().encode(choice["text"], add_special_tokens=False)) == 20


async def test_token_id_prompts_are_used_exactly_and_hit_the_prefix_cache(
    client: AppClient,
) -> None:
    ids = list(range(1000, 1100))
    first = await _complete(client, prompt=ids, max_tokens=2)
    assert first["usage"]["prompt_tokens"] == 100  # no BOS added
    second = await _complete(client, prompt=ids, max_tokens=2)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96  # 6 full blocks


async def test_prompt_list_gives_one_choice_per_prompt(client: AppClient) -> None:
    body = await _complete(client, prompt=["one prompt", "another one here"], max_tokens=3)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    counts = [len(tokenizer().encode(p)) for p in ("one prompt", "another one here")]
    assert body["usage"]["prompt_tokens"] == sum(counts)
    assert body["usage"]["completion_tokens"] == 6
    batch = await _complete(client, prompt=[[5, 6, 7], [8, 9]], max_tokens=2)
    assert batch["usage"]["prompt_tokens"] == 5


async def test_streamed_completion_chunks_usage_and_done(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": "hello", "max_tokens": 5, "stream": True,
              "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage_chunk, chunks = events[-2], events[:-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5
    assert usage_chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert {c["id"] for c in chunks} == {usage_chunk["id"]}
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert len(tokenizer().encode(text, add_special_tokens=False)) == 5


async def test_continuous_usage_stats_on_every_chunk(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": [1, 2, 3], "max_tokens": 4, "stream": True,
              "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    )  # fmt: skip
    chunks = sse_events(r.text)[:-2]
    seen = [c["usage"]["completion_tokens"] for c in chunks]
    assert seen == sorted(seen) and seen[-1] == 4
    assert all(c["usage"]["prompt_tokens"] == 3 for c in chunks)
    assert all(c["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} for c in chunks)


async def test_stream_without_usage_has_no_usage_chunk(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": "a", "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


async def test_a_running_usage_needs_the_final_one(client: AppClient) -> None:
    """vLLM's should_include_usage: continuous_usage_stats only with include_usage."""
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": "a", "max_tokens": 3, "stream": True,
              "stream_options": {"include_usage": False, "continuous_usage_stats": True}},
    )  # fmt: skip
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and all("usage" not in e for e in events[:-1])


async def test_force_include_usage_puts_usage_on_every_stream_and_chunk() -> None:
    async with AppClient(make_app(settings(force_include_usage=True))) as c:
        for options in (None, {"include_usage": False}):
            body = {"prompt": [1, 2, 3], "max_tokens": 4, "stream": True}
            r = await c.http.post("/v1/completions", json={**body, "stream_options": options})
            events = sse_events(r.text)
            *chunks, last, done = events
            assert done == "[DONE]" and last["choices"] == []
            assert last["usage"]["completion_tokens"] == 4
            assert [e["usage"]["completion_tokens"] for e in chunks] == [1, 2, 3, 4]


async def test_chat_stream_first_delta_has_role(client: AppClient) -> None:
    r = await client.http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
              "max_completion_tokens": 3, "stream": True,
              "stream_options": {"include_usage": True}},
    )  # fmt: skip
    events = sse_events(r.text)
    chunks = events[:-2]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 3


async def test_chat_prefers_max_completion_tokens(client: AppClient) -> None:
    body = await _complete(
        client,
        "/v1/chat/completions",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=9,
        max_completion_tokens=4,
    )
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens"] == len(tokenizer().encode("be brief\n\nhi"))


async def test_max_tokens_is_clamped_to_the_context_left() -> None:
    async with AppClient(make_app(max_model_len=64, max_num_seqs=8)) as c:
        body = await _complete(c, prompt=list(range(100, 160)), max_tokens=1000)
        assert body["usage"]["completion_tokens"] == 4
        assert body["choices"][0]["finish_reason"] == "length"
        chat = await _complete(
            c, "/v1/chat/completions", messages=[{"role": "user", "content": "hello"}]
        )
        assert chat["usage"]["total_tokens"] == 64  # no max_tokens: the rest of the context


async def test_eos_min_tokens_and_ignore_eos() -> None:
    async with AppClient(make_app(eos_probability=1.0)) as c:
        body = await _complete(c, prompt="x", max_tokens=10)
        assert body["usage"]["completion_tokens"] == 1
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["choices"][0]["text"] == ""  # EOS is not text
        body = await _complete(c, prompt="x", max_tokens=10, min_tokens=3)
        assert body["usage"]["completion_tokens"] == 4
        body = await _complete(c, prompt="x", max_tokens=10, ignore_eos=True)
        assert body["usage"]["completion_tokens"] == 10
        assert body["choices"][0]["finish_reason"] == "length"


async def _words(c: AppClient, request_id: str, n: int) -> list[str]:
    r = await c.http.post(
        "/v1/completions",
        json={"prompt": "seed", "max_tokens": n},
        headers={"X-Request-Id": request_id},
    )
    assert r.headers["x-request-id"] == request_id
    assert r.json()["id"] == f"cmpl-{request_id}"
    text: str = r.json()["choices"][0]["text"]
    return text.split(" ")[1:]


async def test_stop_strings_end_generation_and_truncate(client: AppClient) -> None:
    words = await _words(client, "fixed-id", 8)  # tokens depend only on (seed, id, position)
    stop_word = words[3]
    assert stop_word not in words[:3]
    for stream in (False, True):
        r = await client.http.post(
            "/v1/completions",
            json={"prompt": "seed", "max_tokens": 8, "stop": [" " + stop_word], "stream": stream},
            headers={"X-Request-Id": "fixed-id"},
        )
        if stream:
            chunks = sse_events(r.text)[:-1]
            text = "".join(ch["choices"][0]["text"] for ch in chunks)
            choice = chunks[-1]["choices"][0]
        else:
            choice = r.json()["choices"][0]
            text = choice["text"]
        assert text == "".join(" " + w for w in words[:3])
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == " " + stop_word
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": "seed", "max_tokens": 8, "stop": " " + stop_word,
              "include_stop_str_in_output": True},
        headers={"X-Request-Id": "fixed-id"},
    )  # fmt: skip
    assert r.json()["choices"][0]["text"].endswith(" " + stop_word)
    assert client.state.engines[0].core.pool.num_used == 0


async def test_stop_token_ids_finish_with_the_token_as_stop_reason(client: AppClient) -> None:
    words = await _words(client, "fixed-2", 6)
    stop_id = tokenizer().encode(" " + words[2], add_special_tokens=False)[0]
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": "seed", "max_tokens": 6, "stop_token_ids": [stop_id]},
        headers={"X-Request-Id": "fixed-2"},
    )
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop_id
    assert r.json()["usage"]["completion_tokens"] == 3


async def test_unknown_fields_are_accepted(client: AppClient) -> None:
    body = await _complete(
        client, prompt="hi", max_tokens=2, temperature=0.7, top_p=0.9, some_vendor_field={"x": 1},
        logit_bias={"10": 1}, user="u",
    )  # fmt: skip
    assert body["usage"]["completion_tokens"] == 2


async def test_generated_text_round_trips_through_a_client_tokenizer(client: AppClient) -> None:
    # Generated tokens are whole words that encode back to themselves one by one, so a
    # client re-tokenizing the text counts exactly what the server reports (docs/serving.md's
    # promise): every one of 200 completions of 1-120 tokens.
    tok = tokenizer()
    for i in range(200):
        n = 1 + (i * 37) % 120
        body = await _complete(client, prompt=[7, 8, 9, i], max_tokens=n)
        count = len(tok.encode(body["choices"][0]["text"], add_special_tokens=False))
        assert count == body["usage"]["completion_tokens"] == n, (i, count, n)


async def test_return_token_ids_on_completions_stream_and_not(client: AppClient) -> None:
    prompt = "Token ids out, as vLLM gives them"
    ids = tokenizer().encode(prompt)
    body = await _complete(client, prompt=prompt, max_tokens=6, return_token_ids=True, seed=1)
    (choice,) = body["choices"]
    assert choice["prompt_token_ids"] == ids  # on the choice, for completions
    assert len(choice["token_ids"]) == 6 == body["usage"]["completion_tokens"]
    assert tokenizer().decode(choice["token_ids"]) == choice["text"]
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": prompt, "max_tokens": 6, "return_token_ids": True, "stream": True},
    )
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == ids
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])  # first only
    streamed = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert len(streamed) == 6
    plain = await _complete(client, prompt=prompt, max_tokens=2)
    assert "token_ids" not in plain["choices"][0]  # only when asked


async def test_return_token_ids_on_chat(client: AppClient) -> None:
    messages = [{"role": "user", "content": "Say something."}]
    body = await _complete(
        client, "/v1/chat/completions", messages=messages, max_tokens=5, return_token_ids=True
    )
    tokenized = (await client.http.post("/tokenize", json={"messages": messages})).json()
    assert body["prompt_token_ids"] == tokenized["tokens"]  # top-level, for chat
    assert len(body["choices"][0]["token_ids"]) == 5
    r = await client.http.post(
        "/v1/chat/completions",
        json={"messages": messages, "max_tokens": 5, "return_token_ids": True, "stream": True},
    )
    chunks = [e for e in sse_events(r.text) if e != "[DONE]"]
    assert chunks[0]["prompt_token_ids"] == tokenized["tokens"]  # on the role chunk
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks[1:]) == 5


async def test_passes_merged_by_a_lagging_server_stream_as_multi_token_chunks() -> None:
    """--max-merged-passes on a server whose loop wakes late (a fake clock, as a CPU that
    cannot keep up): chunks carry several tokens, and text, ids, usage and the metrics
    still add up."""
    app = make_app(settings(max_merged_passes=8), speedup_ratio=1.0)
    for engine in app.state.mocker.engines:
        engine.clock = LateClock(0.03)  # about five passes late every time
    async with AppClient(app) as c:
        r = await c.http.post(
            "/v1/completions",
            json={"prompt": "merge these", "max_tokens": 24, "stream": True, "ignore_eos": True,
                  "return_token_ids": True, "stream_options": {"include_usage": True}},
        )  # fmt: skip
        events = sse_events(r.text)
        metrics = (await c.http.get("/metrics")).text
    chunks = [e for e in events[:-2] if e["choices"][0]["token_ids"]]
    per_chunk = [len(e["choices"][0]["token_ids"]) for e in chunks]
    assert sum(per_chunk) == 24 == events[-2]["usage"]["completion_tokens"]
    assert max(per_chunk) > 1 and len(chunks) < 24
    ids = [t for e in chunks for t in e["choices"][0]["token_ids"]]
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == tokenizer().decode(ids)
    assert 'vllm:generation_tokens_total{engine="0",model_name="mocker"} 24.0' in metrics
    assert 'vllm:inter_token_latency_seconds_count{engine="0",model_name="mocker"} 23.0' in metrics


async def test_n_choices_per_prompt_in_prompt_major_order_with_the_prompt_counted_once(
    client: AppClient,
) -> None:
    # vLLM's parallel sampling: n engine requests per prompt, choice i*n + j; usage counts
    # each prompt once and every choice's tokens.
    body = await _complete(client, prompt=[[5, 6, 7], [8, 9]], max_tokens=4, n=3)
    choices = body["choices"]
    assert [c["index"] for c in choices] == list(range(6))
    assert len({c["text"] for c in choices}) == 6  # each choice its own sample
    assert all(c["finish_reason"] == "length" for c in choices)
    assert body["usage"]["prompt_tokens"] == 3 + 2
    assert body["usage"]["completion_tokens"] == 6 * 4
    metrics = client.state.metrics[0]
    assert metrics.finished["length"] == 6  # one engine request per choice
    assert metrics.request_params_n.count == 2 and metrics.request_params_n.total == 6


async def test_n_choices_compute_their_prompt_once(client: AppClient) -> None:
    # Admitted in one pass, choices 1 and 2 hit the blocks choice 0 registered as it was
    # scheduled (vLLM's allocate_slots): 3 of the 4 full blocks of 16 each (the last token
    # of a prompt is always computed); usage reports the first choice's hits.
    body = await _complete(client, prompt=list(range(2000, 2064)), max_tokens=2, n=3)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    metrics = client.state.metrics[0]
    assert metrics.prefix_queries == 3 * 64 and metrics.prefix_hits == 2 * 48
    assert metrics.prompt_tokens_cached == 2 * 48


async def test_echo_starts_each_choice_with_its_prompt(client: AppClient) -> None:
    body = await _complete(client, prompt=["Say this", "And that"], max_tokens=3, n=2, echo=True)
    texts = [c["text"] for c in body["choices"]]
    prompts = ["Say this"] * 2 + ["And that"] * 2  # (prompt-major: choice i*n + j)
    assert all(t.startswith(p) for t, p in zip(texts, prompts, strict=True))
    assert len(set(texts)) == 4 and body["usage"]["completion_tokens"] == 12
    r = await client.http.post(
        "/v1/completions", json={"prompt": "Say this", "max_tokens": 3, "echo": True,
                                 "stream": True},
    )  # fmt: skip
    chunks = [e["choices"][0]["text"] for e in sse_events(r.text)[:-1]]
    assert chunks[0].startswith("Say this") and len(chunks) == 3


async def test_n_streamed_chat_gives_each_choice_its_role_its_end_and_one_usage(
    client: AppClient,
) -> None:
    r = await client.http.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 5,
              "n": 3, "stream": True, "stream_options": {"include_usage": True}},
    )  # fmt: skip
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    usage, chunks = events[-2], events[:-2]
    per_choice: dict[int, list[dict[str, Any]]] = {}
    for chunk in chunks:
        [choice] = chunk["choices"]
        per_choice.setdefault(choice["index"], []).append(choice)
    assert sorted(per_choice) == [0, 1, 2]
    texts = set()
    for deltas in per_choice.values():
        assert deltas[0]["delta"]["role"] == "assistant"
        assert [d["finish_reason"] for d in deltas][1:] == [None] * 4 + ["length"]
        texts.add("".join(d["delta"].get("content") or "" for d in deltas))
    assert len(texts) == 3
    prompt = (await _complete(client, "/v1/chat/completions", max_tokens=1,
                              messages=[{"role": "user", "content": "Hello there"}]))  # fmt: skip
    assert usage["usage"]["prompt_tokens"] == prompt["usage"]["prompt_tokens"]
    assert usage["usage"]["completion_tokens"] == 15


async def test_n_is_bounded_and_goes_with_one_p_d_request(client: AppClient) -> None:
    r = await client.http.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2049})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    assert "4096" in r.json()["error"]["message"]
    r = await client.http.post(
        "/v1/completions",
        json={"prompt": "x", "n": 2, "kv_transfer_params": {"do_remote_decode": True}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params"
    assert not client.state.engines[0].core.requests
