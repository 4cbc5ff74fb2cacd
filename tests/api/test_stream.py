"""The streaming renderer: a renderer that fails mid-stream answers its client and frees the
request instead of leaving both hanging; framed chunks from the text table are the bytes the
Python join writes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mocker.api.choice import Choice
from mocker.api.chunks import ChunkWriter
from mocker.api.lifecycle import OpenResponse, OpenResponses
from mocker.api.responses import Emitter
from mocker.api.stop_strings import StopMatcher
from mocker.api.stream import StreamRenderer
from mocker.api.text_table import FramedTable, TextTable, sinks, text_table
from mocker.compiled import ctext as _ctext
from mocker.engine.live import LiveEngine
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stats import SchedulerStats
from mocker.engine.stream import RequestStream, deliver, deliver_loop
from tests.api.test_direct_write import START, _cycle, send_of
from tests.support.engines import output
from tests.support.parsing import sse_events
from tests.support.servers import AppClient, make_app, settings


@pytest.fixture
def renderer_fails_on_third_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every streamed response's renderer raises on the third token it is handed."""
    on_output = StreamRenderer.on_output
    counts: dict[int, int] = {}

    def failing(self: StreamRenderer, out: Any, choice: Any = None) -> None:
        if type(out) is RequestOutput:
            counts[id(self)] = counts.get(id(self), 0) + 1
            if counts[id(self)] == 3:
                raise KeyError("a renderer bug")
        on_output(self, out, choice)

    monkeypatch.setattr(StreamRenderer, "on_output", failing)


@pytest.mark.usefixtures("renderer_fails_on_third_token")
@pytest.mark.parametrize("chat", [False, True])
async def test_a_renderer_failing_mid_stream_ends_it_with_a_500_and_aborts(chat: bool) -> None:
    async with AppClient(make_app()) as client:
        engine = client.state.engines[0]
        metrics = client.state.metrics[0]
        body: dict[str, Any] = {"max_tokens": 200, "stream": True, "ignore_eos": True}
        if chat:
            body["messages"] = [{"role": "user", "content": "hi"}]
        else:
            body["prompt"] = list(range(40))
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with asyncio.timeout(30):  # a request left unanswered fails here, not hangs
            r = await client.http.post(path, json=body)
        assert r.status_code == 200  # (the stream had started)
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        error = events[-2]["error"]
        assert error["code"] == 500 and "failed to write" in error["message"]
        assert all(c["choices"][0]["finish_reason"] is None for c in events[:-2])
        # The request was aborted (before the next pass), not run to its 200 tokens; nothing
        # of it is left.
        async with asyncio.timeout(10):
            while engine.num_open_streams or engine.core.requests:
                await asyncio.sleep(0.001)
        assert engine.core.pool.num_used == 0 and metrics.finished["abort"] == 1
        assert metrics.finished["length"] == 0


async def _stream(client: AppClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = await client.http.post(path, json=body, headers={"X-Request-Id": "same-tokens"})
    assert r.status_code == 200, r.text
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    return events[:-1]


def _pieces(events: list[dict[str, Any]]) -> list[tuple[list[int], str, str | None]]:
    """(token ids, text, finish reason) of each choice chunk (not the role or usage ones)."""
    out = []
    for e in events:
        if not e["choices"]:
            continue
        choice = e["choices"][0]
        text = choice["delta"].get("content") if "delta" in choice else choice["text"]
        if "delta" in choice and "role" in choice["delta"] and not text:
            continue
        out.append((choice.get("token_ids") or [], text, choice["finish_reason"]))
    return out


@pytest.mark.parametrize(
    ("server", "asked", "sizes"),
    [
        (4, None, [1, 4, 4, 1]),  # first token at once, then 4 a chunk, the end at once
        (4, 6, [1, 6, 3]),  # a request may ask for more
        (4, 2, [1, 4, 4, 1]),  # not for less (vLLM's clamp)
        (1, 3, [1, 3, 3, 3]),
    ],
)
async def test_the_stream_interval_groups_tokens_as_vllms_output_processor(
    server: int, asked: int | None, sizes: list[int]
) -> None:
    body: dict[str, Any] = {
        "prompt": [5, 6, 7],
        "max_tokens": 10,
        "stream": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    if asked is not None:
        body["stream_interval"] = asked
    async with AppClient(make_app()) as plain:
        reference = _pieces(await _stream(plain, "/v1/completions", {**body, "stream_interval": 1}))
    async with AppClient(make_app(settings(stream_interval=server))) as client:
        events = await _stream(client, "/v1/completions", body)
        metrics = client.state.metrics[0]
        itl_count = metrics.itl.count
    pieces = _pieces(events)
    assert [len(ids) for ids, _, _ in pieces] == sizes
    # The same tokens and text as one chunk a token, the finish reason on the last only.
    assert [t for ids, _, _ in pieces for t in ids] == [t for ids, _, _ in reference for t in ids]
    assert "".join(t for _, t, _ in pieces) == "".join(t for _, t, _ in reference)
    assert [f for _, _, f in pieces] == [None] * (len(sizes) - 1) + ["length"]
    assert events[-1]["usage"]["completion_tokens"] == 10
    assert itl_count == 9  # the engine's metrics still see every token as it is made


async def test_a_stop_string_under_a_stream_interval_ends_where_it_would_without() -> None:
    body: dict[str, Any] = {
        "prompt": [5, 6, 7],
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with AppClient(make_app()) as plain:
        words = "".join(t for _, t, _ in _pieces(await _stream(plain, "/v1/completions", body)))
    stop = words.split(" ")[3]  # a word well inside the stream
    results = []
    for interval in (1, 5):
        async with AppClient(make_app(settings(stream_interval=interval))) as client:
            events = await _stream(client, "/v1/completions", {**body, "stop": [stop]})
        pieces = _pieces(events)
        results.append(("".join(t for _, t, _ in pieces), pieces[-1][2], events[-1]["usage"]))
    assert results[0] == results[1] and results[0][1] == "stop"


async def test_a_chat_stream_under_a_stream_interval() -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 7,
        "stream": True,
    }
    async with AppClient(make_app(settings(stream_interval=3))) as client:
        events = await _stream(client, "/v1/chat/completions", body)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = _pieces(events)
    # Token 1 | 2-4 (three unsent) | 5-7 (the last: the end goes at once), the role before.
    assert len(pieces) == 3 and pieces[-1][2] == "length"
    assert [len(t.split(" ")) - 1 for _, t, _ in pieces] == [1, 3, 3]  # (a word a token)


async def test_the_generate_stream_honours_the_interval_too() -> None:
    body = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 10}, "stream": True}
    async with AppClient(make_app(settings(stream_interval=4))) as client:
        events = await _stream(client, "/inference/v1/generate", body)
    sizes = [len(e["choices"][0]["token_ids"]) for e in events if e.get("choices")]
    assert sizes == [1, 4, 4, 1]


# -- the text table's framed chunks -------------------------------------------------------------

_TEXTS = {7: b" seven", 8: b" eight", 9: b' \\"nine\\"', 10: b""}  # 10: an empty text
_LATE = {11: b" eleven"}  # escaped later: not in the table
_NO_STATS = SchedulerStats.of(0, 0, 0.0, None, 0)
# A choice's engine, which these renderings never call (no stop string matches, nothing is
# cancelled): None in its place, so that a call would fail the test.
_NO_ENGINE: LiveEngine = None  # type: ignore[assignment]


async def _render(
    framed: Any,
    chat: bool,
    outputs: list[RequestOutput],
    sinks: Any = None,
    loop: Any = None,
    heard: list[list[int]] | None = None,
) -> bytes:
    """The bytes a streamed response of `outputs` puts on uvicorn's transport, with the
    transport paused for the outputs from the 4th to the 6th. With `sinks`, each output is
    handed out as the engine loop does (`deliver`, `loop` its compiled loop or None), and
    the ids of those the renderer's listener heard (not a sink) go to `heard`; the choice's
    completion tokens must come out as the outputs' tokens either way."""
    cycle, transport = _cycle()
    writer = ChunkWriter(chat=chat, response_id="cmpl-x", created=1, model="m",
                         include_usage=True, continuous_usage=False)  # fmt: skip
    stream = RequestStream("r")
    choice = Choice(index=0, request_id="r", engine=_NO_ENGINE, stream=stream, num_prompt_tokens=3)
    texts = {**_TEXTS, **_LATE}
    renderer = StreamRenderer(
        OpenResponse([choice], OpenResponses()), writer, escaped=texts.__getitem__,
        known=_TEXTS, piece=lambda t: texts[t].decode(), record_abort=lambda: None,
        framed=framed, sinks=sinks,
    )  # fmt: skip
    emitter = Emitter(send_of(cycle), lambda: None)
    await send_of(cycle)(START)
    emitter.started()
    renderer.attach(emitter)
    if heard is not None:
        listener = stream._listener
        assert listener is not None

        def heard_by(out: Any) -> None:
            heard.append(out.new_token_ids)
            listener(out)

        stream._listener = heard_by
    streams = {"r": stream}
    for i, out in enumerate(outputs):
        if i == 3:
            cycle.flow.pause_writing()
        if i == 6:
            cycle.flow.resume_writing()
            await emitter.drain()
        if sinks is None:
            stream.put(out)
        else:
            deliver(streams, StepResult(0.0, 1.0, [out], _NO_STATS), loop)
    await asyncio.wait_for(emitter.closed, 5)
    assert choice.completion_tokens == sum(len(o.new_token_ids) for o in outputs)
    return b"".join(transport.written)


@pytest.mark.parametrize("chat", [False, True])
async def test_framed_chunks_are_the_bytes_the_python_join_writes(chat: bool) -> None:
    outputs = [output("r", [t]) for t in (7, 8, 11, 9, 7, 8, 10, 9)] + [output("r", [8, 7])]
    outputs += [output("r", [9]), output("r", [11]), output("r", [7], end=True)]
    expected = await _render(None, chat, outputs)
    assert expected.count(b"eight") == 3 and expected.endswith(b"0\r\n\r\n")
    tables: list[FramedTable] = [TextTable(_TEXTS)]
    compiled = text_table(_TEXTS)
    if compiled is not None:
        tables.append(compiled)
    for table in tables:
        calls: list[int] = []

        def framed(
            tok: int, head: bytes, tail: bytes, table: FramedTable = table, calls: list[int] = calls
        ) -> bytes | None:
            calls.append(tok)
            return table.framed(tok, head, tail)

        assert await _render(framed, chat, outputs) == expected
        # Every one-token chunk that ends nothing while the emitter offers its direct writer:
        # up to the first one the paused transport refused (then joined and queued), and
        # from the drain on; 11 is not in the table and 10's text is empty (framed too).
        assert calls == [7, 8, 11, 9, 10, 9, 9, 11]


@pytest.mark.parametrize("compiled_loop", [False, True])
@pytest.mark.parametrize("chat", [False, True])
async def test_a_sink_writes_the_bytes_the_renderer_writes(chat: bool, compiled_loop: bool) -> None:
    """With the compiled table's sink, the plain tokens after the first framed one go from
    the hand-out straight to the transport: the same bytes and count as the renderer's own
    path; the renderer hears the rest (the first, a token not in the table, a paused
    transport and what queues behind it, a two-token output, the last)."""
    if _ctext is None:
        pytest.skip("mocker.api._ctext was not built")
    table = text_table(_TEXTS, compiled=True)
    assert table is not None  # (compiled=True: the table or an error)
    outputs = [output("r", [t]) for t in (7, 8, 11, 9, 7, 8, 10, 9)] + [output("r", [8, 7])]
    outputs += [output("r", [9]), output("r", [11]), output("r", [7], end=True)]
    expected = await _render(None, chat, outputs)
    loop = deliver_loop(compiled=True) if compiled_loop else None
    heard: list[list[int]] = []
    written = await _render(table.framed, chat, outputs, sinks(table), loop, heard)
    assert written == expected
    # The sink took 8 (a chat's 8 went as its first chunk after the role's: the sink came
    # after it), then 10, 9 and 9 once the drain let it write again.
    first = [[7], [8]] if chat else [[7]]
    assert heard == [*first, [11], [9], [7], [8], [8, 7], [11], [7]]


async def test_no_sink_for_a_choice_the_renderer_must_watch() -> None:
    """Stop strings (text is matched), a second choice: no sink."""
    if _ctext is None:
        pytest.skip("mocker.api._ctext was not built")
    table = text_table(_TEXTS, compiled=True)
    assert table is not None  # (compiled=True: the table or an error)
    maker = sinks(table)
    cycle, _transport = _cycle()
    writer = ChunkWriter(chat=False, response_id="cmpl-x", created=1, model="m",
                         include_usage=True, continuous_usage=False)  # fmt: skip
    texts = {**_TEXTS, **_LATE}
    for stops, n in ((StopMatcher(("zzz",)), 1), (None, 2)):
        choices = [
            Choice(
                index=i,
                request_id=f"r{i}",
                engine=_NO_ENGINE,
                stream=RequestStream(f"r{i}"),
                num_prompt_tokens=3,
                stops=stops,
            )
            for i in range(n)
        ]
        renderer = StreamRenderer(
            OpenResponse(choices, OpenResponses()), writer, escaped=texts.__getitem__,
            known=_TEXTS, piece=lambda t: texts[t].decode(), record_abort=lambda: None,
            framed=table.framed, sinks=maker,
        )  # fmt: skip
        emitter = Emitter(send_of(cycle), lambda: None)
        if not cycle.response_started:
            await send_of(cycle)(START)
        emitter.started()
        renderer.attach(emitter)
        for _ in range(3):
            for choice in choices:
                choice.stream.put(output("r", [7]))
        assert all(c.stream.sink is None for c in choices)
