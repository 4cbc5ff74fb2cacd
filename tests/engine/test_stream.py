"""Output streams: outputs merged until read, pushed to a listener once there is one."""

from __future__ import annotations

from mocker.engine.outputs import RequestOutput
from mocker.engine.stream import RequestStream
from mocker.request import FinishReason


def _out(tokens: list[int], time: float, **fields: object) -> RequestOutput:
    return RequestOutput("r", tokens, time, num_prompt_tokens=4, **fields)  # type: ignore[arg-type]


async def test_outputs_not_yet_read_are_merged_into_one() -> None:
    stream = RequestStream("r")
    stream.put(_out([5], 1.0, first_token=True, latency=0.5))
    stream.put(_out([6], 1.1, latency=0.1))
    params = {"remote_engine_id": "e", "remote_block_ids": [1, 2]}
    stream.put(
        _out([7], 1.2, latency=0.1, finished=True, finish_reason=FinishReason.LENGTH,
             kv_transfer_params=params)
    )  # fmt: skip
    merged = await stream.get()
    assert merged.new_token_ids == [5, 6, 7] and merged.time == 1.2
    assert merged.first_token and merged.latency == 0.5  # of the first token merged
    assert merged.finished and merged.finish_reason is FinishReason.LENGTH
    # A P/D prefill's final output names where its KV waits: merging must not lose it.
    assert merged.kv_transfer_params == params


def test_a_listener_gets_what_was_merged_before_it_came_then_each_output() -> None:
    stream = RequestStream("r")
    stream.put(_out([5], 1.0, first_token=True))
    stream.put(_out([6], 1.1))
    seen: list[object] = []
    stream.listen(seen.append)
    stream.put(_out([7], 1.2, finished=True, finish_reason=FinishReason.STOP))
    assert [o.new_token_ids for o in seen] == [[5, 6], [7]]  # type: ignore[attr-defined]
    stream.put(_out([8], 1.3))  # after the end: dropped
    assert len(seen) == 2 and stream.finished
