"""Output streams: outputs merged until read, pushed to a listener once there is one."""

from __future__ import annotations

from mocker.engine.outputs import RequestOutput
from mocker.engine.stream import ConsumerError, EngineDeadError, RequestStream, StreamError
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


class _Broken:
    """A listener that raises on its `fail_at`-th output, and records everything handed to it."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.seen: list[object] = []

    def __call__(self, out: object) -> None:
        self.seen.append(out)
        if len(self.seen) == self.fail_at:
            raise ValueError("consumer bug")


def test_a_listener_that_raises_is_handed_the_failure_and_the_owner_told() -> None:
    failed: list[RequestStream] = []
    stream = RequestStream("r", failed.append)
    listener = _Broken(fail_at=2)
    stream.listen(listener)
    stream.put(_out([5], 1.0, first_token=True))
    stream.put(_out([6], 1.1))  # raises
    assert stream.finished and failed == [stream]
    error = listener.seen[-1]
    assert isinstance(error, ConsumerError) and error.status == 500
    stream.put(_out([7], 1.2))  # the stream has ended: nothing more
    stream.fail(RuntimeError("engine died later"))
    assert len(listener.seen) == 3 and failed == [stream]


def test_a_listener_raising_on_the_last_output_leaves_nothing_to_abort() -> None:
    failed: list[RequestStream] = []
    stream = RequestStream("r", failed.append)
    listener = _Broken(fail_at=1)
    stream.listen(listener)
    stream.put(_out([5], 1.0, finished=True, finish_reason=FinishReason.LENGTH))
    assert isinstance(listener.seen[-1], ConsumerError)
    assert failed == []  # the request had ended: its consumer is told, nobody aborts it


def test_a_listener_raising_on_what_waited_for_it_is_handled_as_on_any_output() -> None:
    failed: list[RequestStream] = []
    stream = RequestStream("r", failed.append)
    stream.put(_out([5], 1.0, first_token=True))
    listener = _Broken(fail_at=1)
    stream.listen(listener)  # hands over the waiting output: it raises there, not to the caller
    assert stream.finished and failed == [stream]
    assert isinstance(listener.seen[-1], ConsumerError)


def test_a_listener_raising_on_the_failure_too_is_only_logged() -> None:
    stream = RequestStream("r")

    def always(out: object) -> None:
        raise ValueError("consumer bug")

    stream.listen(always)
    stream.put(_out([5], 1.0))  # raises twice (the output, then the failure): both caught
    assert stream.finished


def test_the_engines_death_reaches_a_listener_as_a_503() -> None:
    stream = RequestStream("r")
    seen: list[object] = []
    stream.listen(seen.append)
    stream.fail(RuntimeError("boom"))
    assert isinstance(seen[0], EngineDeadError) and isinstance(seen[0], StreamError)
    assert seen[0].status == 503 and "boom" in seen[0].client_message
