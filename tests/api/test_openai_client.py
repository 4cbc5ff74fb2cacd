"""The official `openai` client (sync and async) against a real uvicorn on loopback."""

from __future__ import annotations

import openai
import pytest

from tests.support.checks import not_none
from tests.support.servers import ServerThread, tokenizer


@pytest.fixture
def sync_client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


@pytest.fixture
def async_client(server: ServerThread) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def test_models_list(sync_client: openai.OpenAI) -> None:
    models = sync_client.models.list()
    assert [m.id for m in models.data] == ["mocker"]
    assert not_none(models.data[0].model_extra)["max_model_len"] == 4096


def test_completion_and_usage(sync_client: openai.OpenAI) -> None:
    prompt = "A prompt the client can count itself."
    c = sync_client.completions.create(model="mocker", prompt=prompt, max_tokens=7)
    assert c.object == "text_completion" and c.choices[0].finish_reason == "length"
    assert c.usage is not None and c.usage.completion_tokens == 7
    assert c.usage.prompt_tokens == len(tokenizer().encode(prompt))
    assert c.usage.prompt_tokens_details is not None
    assert c.usage.prompt_tokens_details.cached_tokens == 0


def test_streamed_chat_with_usage_and_extra_body(sync_client: openai.OpenAI) -> None:
    stream = sync_client.chat.completions.create(
        model="mocker",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
        max_completion_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "min_tokens": 2},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6
    assert len(tokenizer().encode(text, add_special_tokens=False)) == 6
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length"


def test_n_choices_through_the_client(sync_client: openai.OpenAI) -> None:
    c = sync_client.completions.create(model="mocker", prompt="Pick a word", max_tokens=4, n=3)
    assert [ch.index for ch in c.choices] == [0, 1, 2]
    assert len({ch.text for ch in c.choices}) == 3
    assert c.usage is not None and c.usage.completion_tokens == 12
    assert c.usage.prompt_tokens == len(tokenizer().encode("Pick a word"))
    chat = sync_client.chat.completions.create(
        model="mocker", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2
    )
    assert [ch.message.role for ch in chat.choices] == ["assistant"] * 2
    assert chat.usage is not None and chat.usage.completion_tokens == 6


def test_logprobs_parse_into_the_clients_models(sync_client: openai.OpenAI) -> None:
    c = sync_client.completions.create(model="mocker", prompt="Hi", max_tokens=3, logprobs=2)
    logprobs = c.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == c.choices[0].text
    assert logprobs.top_logprobs is not None and len(logprobs.top_logprobs) == 3
    chat = sync_client.chat.completions.create(
        model="mocker", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        logprobs=True, top_logprobs=2,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content if chat.choices[0].logprobs else None
    assert content is not None and len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_prefix_hits_show_as_cached_tokens(sync_client: openai.OpenAI) -> None:
    prompt = list(range(3000, 3100))
    sync_client.completions.create(model="mocker", prompt=prompt, max_tokens=1)
    again = sync_client.completions.create(model="mocker", prompt=prompt, max_tokens=1)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 96


def test_errors_are_raised_as_openai_errors(sync_client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        sync_client.completions.create(model="nope", prompt="x")
    assert info.value.status_code == 404
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        sync_client.completions.create(model="mocker", prompt=[1] * 5000)


async def test_async_client_stream_and_chat(async_client: openai.AsyncOpenAI) -> None:
    stream = await async_client.completions.create(
        model="mocker", prompt="async", max_tokens=5, stream=True
    )
    texts = [c.choices[0].text async for c in stream]
    assert len(tokenizer().encode("".join(texts), add_special_tokens=False)) == 5
    chat = await async_client.chat.completions.create(
        model="mocker", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 3
    await async_client.close()
