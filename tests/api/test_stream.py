"""The streaming renderer: a renderer that fails mid-stream answers its client and frees the
request instead of leaving both hanging."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mocker.api.stream import StreamRenderer
from mocker.engine.outputs import RequestOutput
from tests.support.parsing import sse_events
from tests.support.servers import AppClient, make_app


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
        async with asyncio.timeout(30):  # (before the fix: no answer, ever)
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
