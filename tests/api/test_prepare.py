"""Long prompts and chats are tokenized off the event loop: the same tokens, the same errors in
the same order, and a 10 MB prompt stalls neither /health nor a running stream."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mocker.tokenizer import UNLOCKED_CHARS
from tests.support.servers import AppClient, make_app, serve, tokenizer

LONG = "rivers run to the sea " * (UNLOCKED_CHARS // 22 + 1)  # past the off-loop threshold


async def test_a_long_prompt_counts_the_tokens_the_loop_would_count() -> None:
    tok = tokenizer()
    assert len(LONG) >= UNLOCKED_CHARS
    async with AppClient(make_app(max_model_len=65536)) as c:
        for path, body, text in [
            ("/v1/completions", {"prompt": LONG, "max_tokens": 1}, LONG),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}],
                                      "max_tokens": 1}, None),
        ]:  # fmt: skip
            r = await c.http.post(path, json={"model": "mocker", **body})
            assert r.status_code == 200, r.text
            expected = (
                len(tok.encode(text)) if text is not None
                else len(tok.encode_chat([{"role": "user", "content": LONG}]))
            )  # fmt: skip
            assert r.json()["usage"]["prompt_tokens"] == expected


async def test_a_long_prompts_errors_come_in_the_usual_order() -> None:
    async with AppClient(make_app(max_model_len=1024)) as c:
        # The model is checked before the prompt: 404, not the prompt's 400.
        r = await c.http.post("/v1/completions", json={"model": "nope", "prompt": LONG})
        assert r.status_code == 404
        r = await c.http.post("/v1/completions", json={"model": "mocker", "prompt": LONG})
        assert r.status_code == 400 and "maximum context length is 1024" in r.text


async def test_a_drain_waits_for_a_prompt_being_tokenized() -> None:
    big = "hello world, rivers run " * (2_000_000 // 24)
    async with AppClient(make_app()) as c:
        sent = asyncio.create_task(c.http.post("/v1/completions", json={"prompt": big}))
        seen = 0
        while not sent.done():
            seen = max(seen, c.state.in_flight)
            await asyncio.sleep(0.001)
        assert (await sent).status_code == 400  # (too long, once counted)
        assert seen == 1 and c.state.in_flight == 0


HUGE = "hello world, rivers run " * (3_000_000 // 24)  # ~0.6M tokens: a second or more


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": HUGE}]}),
        ("/v1/responses", {"input": HUGE}),
        ("/v1/completions/render", {"prompt": HUGE}),
        ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": HUGE}]}),
        ("/tokenize", {"prompt": HUGE}),
        ("/tokenize", {"messages": [{"role": "user", "content": HUGE}]}),
    ],
)
async def test_every_route_tokenizes_a_long_input_off_the_loop(
    path: str, body: dict[str, object]
) -> None:
    async with AppClient(make_app()) as c:
        loop = asyncio.get_running_loop()
        gaps: list[float] = []
        done = False

        async def tick() -> None:
            last = loop.time()
            while not done:
                await asyncio.sleep(0.005)
                now = loop.time()
                gaps.append(now - last)
                last = now

        ticker = asyncio.create_task(tick())
        started = loop.time()
        r = await c.http.post(path, json={"model": "mocker", **body})
        took = loop.time() - started
        done = True
        await ticker
    # Counted, then served (/tokenize) or refused as too long: either way, counted.
    assert r.status_code in (200, 400) and ("maximum context length" in r.text) == (
        r.status_code == 400
    ), r.text[:200]
    # The loop went on ticking through it: no gap near the whole tokenization's time.
    assert took > 0.3 and max(gaps) < took / 2, (max(gaps), took)


def _stream_gaps(base: str, stop: threading.Event) -> list[float]:
    """Gaps between the chunks of one long stream, until `stop` is set."""
    gaps: list[float] = []
    body = {"prompt": "hello", "max_tokens": 100000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
        last = time.perf_counter()
        for line in r.iter_lines():
            if line.startswith("data: "):
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
                if stop.is_set():
                    break
    return gaps


def test_a_10mb_prompt_stalls_neither_health_nor_a_running_stream() -> None:
    big = "hello world, rivers run " * (10_000_000 // 24)
    with serve("--max-model-len", "131072") as (_, base), ThreadPoolExecutor(2) as pool:
        done = threading.Event()
        streaming = pool.submit(_stream_gaps, base, done)
        time.sleep(0.3)  # the stream runs
        started = time.perf_counter()
        huge = pool.submit(httpx.post, base + "/v1/completions", timeout=300,
                           content=json.dumps({"prompt": big, "max_tokens": 1}),
                           headers={"content-type": "application/json"})  # fmt: skip
        health: list[float] = []
        while not huge.done():
            t0 = time.perf_counter()
            assert httpx.get(base + "/health", timeout=60).status_code == 200
            health.append(time.perf_counter() - t0)
            time.sleep(0.05)
        took = time.perf_counter() - started
        done.set()
        r = huge.result()
        gaps = streaming.result()
    # (2M tokens: refused as vLLM refuses it, once counted.)
    assert r.status_code == 400 and "maximum context length" in r.text
    assert took > 1.0 and len(health) >= 5, (took, len(health))  # it did take a while
    # Never near the whole tokenization's time: a busy machine's delays at most (a machine
    # busy enough to stretch the tokenization stretches them alike).
    bound = max(1.0, took / 10)
    assert max(health) < bound, (max(health), took)
    assert len(gaps) > 2 and max(gaps[1:]) < bound, (gaps[:5], took)
