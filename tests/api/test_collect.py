"""The non-streamed collector: one that fails on an output answers a 500 and frees the request
instead of leaving both hanging."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mocker.api.collect import ResponseCollector
from mocker.engine.outputs import RequestOutput
from tests.support.servers import AppClient, make_app


async def test_a_collector_failing_on_an_output_answers_a_500_and_aborts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_output = ResponseCollector.on_output
    seen = 0

    def failing(self: ResponseCollector, choice: Any, out: Any) -> None:
        nonlocal seen
        if type(out) is RequestOutput:
            seen += 1
            if seen == 3:
                raise KeyError("a collector bug")
        on_output(self, choice, out)

    monkeypatch.setattr(ResponseCollector, "on_output", failing)
    async with AppClient(make_app()) as client:
        engine = client.state.engines[0]
        async with asyncio.timeout(30):  # a request left unanswered fails here, not hangs
            r = await client.http.post(
                "/v1/completions", json={"prompt": list(range(40)), "max_tokens": 200}
            )
        assert r.status_code == 500
        error = r.json()["error"]
        assert error["code"] == 500 and "failed to write" in error["message"]
        async with asyncio.timeout(10):
            while engine.num_open_streams or engine.core.requests:
                await asyncio.sleep(0.001)
        assert engine.core.pool.num_used == 0
        assert client.state.metrics[0].finished == {**client.state.metrics[0].finished,
                                                    "abort": 1, "length": 0}  # fmt: skip
