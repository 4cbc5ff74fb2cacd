"""Output streams: outputs merged until read, pushed to a listener once there is one."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from mocker.compiled import cpass as _cpass
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stats import SchedulerStats
from mocker.engine.stream import (
    ConsumerError,
    DeliverLoop,
    EngineDeadError,
    OutputListener,
    RequestStream,
    StreamError,
    deliver,
    deliver_loop,
)
from mocker.request import FinishReason
from tests.support.checks import only_outputs
from tests.support.engines import output


def _out(tokens: list[int], time: float, **fields: Any) -> RequestOutput:
    return RequestOutput("r", tokens, time, num_prompt_tokens=4, **fields)


def _recorder(heard: list[list[int]]) -> OutputListener:
    """A listener appending each output's new tokens to `heard` (a failure handed to it
    raises, as a consumer's bug would)."""

    def listen(out: RequestOutput | StreamError) -> None:
        assert isinstance(out, RequestOutput), out
        heard.append(out.new_token_ids)

    return listen


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
    seen: list[RequestOutput | StreamError] = []
    stream.listen(seen.append)
    stream.put(_out([7], 1.2, finished=True, finish_reason=FinishReason.STOP))
    assert [o.new_token_ids for o in only_outputs(seen)] == [[5, 6], [7]]
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


# -- deliver: the Python loop and the compiled one (mocker/engine/_cpass.c) ----------------------

# (_cpass None: not built, the Python loop only)
_LOOPS: list[DeliverLoop | None] = [None] if _cpass is None else [None, _cpass.deliver]


class _Sink:
    """A sink taking the tokens in `takes`, recording what it was offered."""

    def __init__(self, takes: set[int]) -> None:
        self.takes = takes
        self.offered: list[int] = []

    def __call__(self, tok: int) -> bool:
        self.offered.append(tok)
        return tok in self.takes


def _result(outputs: list[RequestOutput]) -> StepResult:
    return StepResult(0.0, 1.0, outputs, SchedulerStats.of(0, 0, 0.0, None, 0))


@pytest.mark.parametrize("loop", _LOOPS, ids=lambda loop: "python" if loop is None else "compiled")
def test_deliver_hands_plain_tokens_to_a_sink_and_the_rest_to_the_listener(
    loop: DeliverLoop | None,
) -> None:
    streams = {rid: RequestStream(rid) for rid in ("a", "b", "c", "gone")}
    heard: dict[str, list[list[int]]] = {rid: [] for rid in streams}
    for rid, stream in streams.items():
        stream.listen(_recorder(heard[rid]))
    sink = streams["a"].sink = _Sink(takes={1, 2, 3})
    streams["b"].sink = _Sink(takes=set())  # refuses every token: the listener gets them
    streams["gone"].finished = True  # (ended meanwhile: its outputs are dropped)
    outputs = [
        output("a", [1]), output("b", [5]), output("gone", [6]), output("a", [4]),
        output("a", [2, 3]), output("c", [7]), output("nobody", [8]), output("a", [3]),
        output("a", [2], end=True),
    ]  # fmt: skip
    result = _result(outputs)
    deliver(streams, result, loop)
    # To the sink: one-token outputs that end nothing (4 refused: the listener's).
    assert sink.offered == [1, 4, 3]
    assert heard["a"] == [[4], [2, 3], [2]] and heard["b"] == [[5]] and heard["c"] == [[7]]
    assert heard["gone"] == []
    assert [(o.request_id, o.new_token_ids) for o in result.outputs] == [
        (o.request_id, o.new_token_ids) for o in outputs if o.request_id not in ("gone", "nobody")
    ]
    assert "a" not in streams  # its last output retired it


@pytest.mark.parametrize("loop", _LOOPS, ids=lambda loop: "python" if loop is None else "compiled")
def test_a_finished_stream_drops_its_sink_and_every_output_is_kept(
    loop: DeliverLoop | None,
) -> None:
    stream = RequestStream("a")
    stream.listen(lambda out: None)
    stream.sink = _Sink(takes={1})
    result = _result([output("a", [1]), output("a", [1], end=True)])
    outputs = result.outputs
    deliver({"a": stream}, result, loop)
    assert result.outputs is outputs  # nothing dropped: the same list
    assert stream.finished and stream.sink is None and stream._listener is None


@pytest.mark.parametrize("loop", _LOOPS, ids=lambda loop: "python" if loop is None else "compiled")
def test_a_sink_that_raises_takes_the_loop_down_as_a_listener_bug_does_not(
    loop: DeliverLoop | None,
) -> None:
    """A listener's exception is the consumer's (handled: its stream ends); a sink's is the
    engine's own code failing, and propagates (the engine loop dies, every stream is told)."""

    def broken(tok: int) -> bool:
        raise RuntimeError("sink bug")

    stream = RequestStream("a")
    stream.listen(lambda out: None)
    stream.sink = broken
    with pytest.raises(RuntimeError, match="sink bug"):
        deliver({"a": stream}, _result([output("a", [1])]), loop)


@pytest.mark.skipif(_cpass is None, reason="mocker/engine/_cpass.c not built")
def test_the_compiled_loop_refuses_bad_arguments() -> None:
    loop: Any = deliver_loop(compiled=True)
    with pytest.raises(TypeError, match="deliver"):
        loop({}, [])
    with pytest.raises(TypeError, match="deliver\\(dict, list"):
        loop([], [], None)


def test_the_python_pool_setting_turns_the_compiled_loop_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MOCKER_COMPILED", "0")
    assert deliver_loop() is None and deliver_loop(compiled=False) is None


# -- the compiled loop with compiled sinks


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


class _Flow:
    def __init__(self) -> None:
        self.write_paused = False


class _Cycle:
    def __init__(self) -> None:
        self.transport, self.flow = _Transport(), _Flow()
        self.disconnected = self.response_complete = False


class _Emitter:
    __slots__ = ("writer",)
    writer: object


class _Choice:
    __slots__ = ("completion_tokens",)
    completion_tokens: int


def _sinked_streams(n: int) -> tuple[dict[str, RequestStream], dict[str, _Cycle], Any]:
    from mocker.api.text_table import sinks, text_table

    table = text_table({t: b" w%d" % t for t in range(1, 50)}, compiled=True)
    maker = sinks(table)
    assert maker is not None
    streams: dict[str, RequestStream] = {}
    cycles: dict[str, _Cycle] = {}
    for i in range(n):
        rid, stream = f"s{i}", RequestStream(f"s{i}")
        emitter, choice, cycle = _Emitter(), _Choice(), _Cycle()
        emitter.writer = direct = object()
        choice.completion_tokens = 0
        stream.sink = maker(b"<", b">", emitter, direct, cycle, choice)
        streams[rid], cycles[rid] = stream, cycle
    return streams, cycles, table


def _sinked_run(loop: DeliverLoop | None) -> tuple[Any, ...]:
    """60 outputs to 16 sinked streams (and two unknown ones) through `loop`: what was kept,
    written and heard; and that every reference taken was given back (the counts taken
    outside an assert, whose rewriting holds its operands)."""
    import sys

    streams, cycles, _table = _sinked_streams(16)
    heard: dict[str, list[list[int]]] = {rid: [] for rid in streams}
    for rid, stream in streams.items():
        stream.listen(_recorder(heard[rid]))
    outputs = []
    for k in range(60):
        rid = f"s{(k * 7) % 18}"  # s16, s17: no such stream
        ids = [k % 60 + 1] if k % 11 else [k, k + 1]
        outputs.append(output(rid, ids, end=k in (9, 23, 40)))
    held = {rid: (sys.getrefcount(s), sys.getrefcount(s.sink)) for rid, s in streams.items()}
    result = _result(outputs)
    deliver(streams, result, loop)
    after = {rid: (sys.getrefcount(s), sys.getrefcount(s.sink)) for rid, s in streams.items()}
    assert after == {rid: held[rid] for rid in streams}
    kept = [(o.request_id, o.new_token_ids) for o in result.outputs]
    written = {rid: c.transport.written for rid, c in cycles.items()}
    return kept, written, heard, sorted(streams)


@pytest.mark.skipif(_cpass is None, reason="mocker/engine/_cpass.c not built")
def test_the_compiled_loop_with_compiled_sinks_does_what_the_python_loop_does() -> None:
    """Many streams, some ending, retired by their last output while outputs behind it name
    them still, some unknown, tokens outside the table: what each transport got, what each
    listener heard and what is kept are the same, and every object looked at is let go."""
    python, compiled = _sinked_run(None), _sinked_run(_cpass.deliver)
    assert python == compiled
    assert any(python[1].values()) and any(python[2].values())


class _PythonSink:
    """A sink written in Python: the compiled loop calls it as any callable."""

    __slots__ = ("offered",)

    def __init__(self) -> None:
        self.offered: list[int] = []

    def __call__(self, tok: int) -> bool:
        self.offered.append(tok)
        return True


@pytest.mark.skipif(_cpass is None, reason="mocker/engine/_cpass.c not built")
def test_the_compiled_loop_calls_any_sink() -> None:
    streams = {f"s{i}": RequestStream(f"s{i}") for i in range(40)}
    sinks = {rid: _PythonSink() for rid in streams}
    for rid, stream in streams.items():
        stream.listen(lambda out: None)
        stream.sink = sinks[rid]
    deliver(streams, _result([output(f"s{i % 40}", [i + 1]) for i in range(80)]), _cpass.deliver)
    assert [s.offered for s in sinks.values()] == [[i + 1, i + 41] for i in range(40)]


def _churned_run(loop: DeliverLoop | None, seed: int) -> tuple[Any, ...]:
    """Random outputs to 24 sinked streams whose listeners retire other streams, drop and
    replace sinks and grow the dict: what was kept, written and heard."""
    import random

    from mocker.api.text_table import sinks

    rng = random.Random(seed)
    streams, cycles, table = _sinked_streams(24)
    maker = sinks(table)
    assert maker is not None
    heard: list[tuple[str, list[int]]] = []

    def listener(out: RequestOutput | StreamError, rid: str) -> None:
        assert isinstance(out, RequestOutput), out
        heard.append((rid, out.new_token_ids))
        victim = f"s{rng.randrange(30)}"
        action = rng.random()
        if action < 0.3:
            streams.pop(victim, None)  # retired meanwhile: freed if nothing holds it
        elif action < 0.5 and victim in streams:
            streams[victim].sink = None
        elif action < 0.7 and victim in streams:
            emitter, choice = _Emitter(), _Choice()
            emitter.writer = direct = object()
            choice.completion_tokens = 0
            streams[victim].sink = maker(b"[", b"]", emitter, direct, _Cycle(), choice)
        elif action < 0.8:
            streams[f"new{len(heard)}"] = RequestStream("x")  # the dict grows

    for rid, stream in streams.items():
        stream.listen(partial(listener, rid=rid))
    outputs = []
    for _ in range(rng.randrange(30, 120)):
        ids = [rng.randrange(1, 60)] if rng.random() < 0.8 else [1, 2]
        outputs.append(output(f"s{rng.randrange(30)}", ids, end=rng.random() < 0.05))
    result = _result(outputs)
    deliver(streams, result, loop)
    written = {rid: c.transport.written for rid, c in cycles.items()}
    return [(o.request_id, o.new_token_ids) for o in result.outputs], written, heard


@pytest.mark.skipif(_cpass is None, reason="mocker/engine/_cpass.c not built")
@pytest.mark.parametrize("seed", range(6))
def test_listeners_that_retire_streams_and_swap_sinks_meet_the_same_loop(seed: int) -> None:
    """Listeners (Python code between the look-ahead's stages) retire other streams, replace
    and drop sinks: what the compiled loop hands out and keeps is the Python loop's, with
    every stream and sink found ahead still alive when it is read (run under a sanitizer
    this is the test that catches a borrowed one kept too long)."""
    assert _churned_run(None, seed) == _churned_run(_cpass.deliver, seed)


class _EndedByItsClass(RequestStream):
    """A stream whose class answers `finished` itself (its own attribute access)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "finished":
            return True
        return super().__getattribute__(name)


@pytest.mark.skipif(_cpass is None, reason="mocker/engine/_cpass.c not built")
def test_the_compiled_loop_reads_attributes_as_a_class_that_overrides_access_says() -> None:
    kept = []
    for loop in (None, _cpass.deliver):
        stream = _EndedByItsClass("a")
        stream.listen(lambda out: None)
        result = _result([output("a", [1])])
        deliver({"a": stream}, result, loop)
        kept.append([o.request_id for o in result.outputs])
    assert kept == [[], []]
