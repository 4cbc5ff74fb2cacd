"""Live asyncio driver: ordered delivery no earlier than each pass's deadline; a dead engine
fails every consumer instead of hanging; a consumer that goes away aborts its request."""

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest

from mocker.config import EngineConfig
from mocker.engine.core import RequestRejected
from mocker.engine.live import EngineDeadError, LiveEngine, RequestStream
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.engine.stats import FinishedRequestStats
from mocker.engine.stream import ConsumerError, StreamError
from mocker.request import FinishReason
from tests.support.checks import not_none, only_outputs
from tests.support.clocks import LateClock
from tests.support.engines import req, small_config
from tests.support.kv_index import EventIndex


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Yield to the engine loop until `predicate()` holds (bounded; no timing assert)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


async def test_tokens_arrive_in_order_and_not_before_their_deadline() -> None:
    steps: list[StepResult] = []
    engine = LiveEngine(small_config(speedup_ratio=50.0), on_step=steps.append)
    engine.start()
    received: dict[str, list[tuple[int, float, float]]] = {}

    async def consume(i: int) -> None:
        spec = req(f"r{i}", [10 + i] * (6 + 3 * i), max_tokens=12)
        async for out in engine.generate(spec):
            seen_at = time.monotonic()
            for tok in out.new_token_ids:
                received.setdefault(spec.request_id, []).append((tok, out.time, seen_at))

    await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(4))), timeout=30)
    await engine.stop()
    assert sorted(received) == ["r0", "r1", "r2", "r3"]
    for tokens in received.values():
        assert len(tokens) == 12
        times = [t for _, t, _ in tokens]
        assert times == sorted(times)  # produced in pass order
        assert all(seen >= deadline for _, deadline, seen in tokens)  # never early
    # Passes chain deadline to deadline (no drift from relative sleeps) while busy.
    busy = [(a, b) for a, b in itertools.pairwise(steps) if b.start - a.end < 0.05]
    assert busy and all(b.start == a.end for a, b in busy)
    assert engine.core.pool.num_used == 0


async def test_engine_failure_marks_dead_and_fails_consumers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = LiveEngine(small_config(speedup_ratio=100.0))

    def boom(now: float) -> StepResult:
        raise RuntimeError("simulated engine bug")

    monkeypatch.setattr(engine.core, "step", boom)
    engine.start()
    stream = engine.add_request(req("a", [1] * 4))
    with pytest.raises(EngineDeadError, match="simulated engine bug"):
        await asyncio.wait_for(stream.get(), timeout=5)
    assert engine.is_dead and not engine.is_running
    with pytest.raises(EngineDeadError):
        engine.add_request(req("b", [1] * 4))
    await engine.stop()


async def test_consumer_leaving_aborts_and_frees_blocks() -> None:
    engine = LiveEngine(small_config(speedup_ratio=100.0))
    engine.start()
    agen = engine.generate(req("a", range(20), max_tokens=200))
    first = await asyncio.wait_for(agen.__anext__(), timeout=5)
    assert first.new_token_ids
    assert engine.core.pool.num_used > 0
    assert isinstance(agen, AsyncGenerator)  # (typed as the iterator it is used as)
    await agen.aclose()  # the client went away
    await _until(lambda: not engine.core.has_unfinished_requests())
    assert engine.core.pool.num_used == 0
    await engine.stop()


async def test_bad_request_rejected_at_the_door() -> None:
    engine = LiveEngine(small_config())
    engine.start()
    with pytest.raises(RequestRejected, match="prompt is empty"):
        engine.add_request(req("e", []))
    engine.add_request(req("dup", [1]))
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request(req("dup", [1]))
    await engine.stop()


async def test_stop_fails_open_streams() -> None:
    engine = LiveEngine(small_config(speedup_ratio=0.001))  # passes take minutes
    engine.start()
    stream = engine.add_request(req("slow", [1] * 4))
    await asyncio.sleep(0)
    await engine.stop()
    with pytest.raises(EngineDeadError, match="stopped"):
        await asyncio.wait_for(stream.get(), timeout=5)


async def test_loop_yields_between_passes_at_extreme_speedup() -> None:
    engine = LiveEngine(small_config(speedup_ratio=1e9))
    engine.start()
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    chunks = 0
    async for out in engine.generate(req("fast", [3] * 8, max_tokens=200)):
        chunks += 1
        assert out.new_token_ids
    done = True
    await tick_task
    await engine.stop()
    # Passes end before Python finishes a step, yet consumers and other tasks still run.
    assert chunks > 20 and ticks > 20


async def test_stopped_engine_refuses_new_requests() -> None:
    engine = LiveEngine(small_config())
    engine.start()
    await engine.stop()
    with pytest.raises(EngineDeadError, match="stopped"):
        engine.add_request(req("late", [1]))


async def test_external_cancellation_fails_streams() -> None:
    engine = LiveEngine(small_config(speedup_ratio=0.001))
    engine.start()
    stream = engine.add_request(req("a", [1] * 4))
    await asyncio.sleep(0)
    assert engine._task is not None
    engine._task.cancel()
    with pytest.raises(EngineDeadError, match="cancelled"):
        await asyncio.wait_for(stream.get(), timeout=5)
    with pytest.raises(EngineDeadError):
        engine.add_request(req("b", [1]))


async def test_abort_ends_the_stream_and_id_is_reusable_after() -> None:
    engine = LiveEngine(small_config(speedup_ratio=100.0))
    engine.start()
    stream = engine.add_request(req("x", range(20), max_tokens=100))
    await asyncio.wait_for(stream.get(), timeout=5)
    engine.abort("x")
    # Until the loop has applied the abort, the id is still taken: an old output can
    # never be delivered to a new request under the same id.
    with pytest.raises(RequestRejected, match="already in use"):
        engine.add_request(req("x", [1] * 12, max_tokens=5))
    out = await asyncio.wait_for(stream.get(), timeout=5)
    assert out.finished and out.finish_reason == "abort"
    await _until(lambda: not engine.has_request("x"))
    assert engine.core.pool.num_used == 0
    outs = [o async for o in engine.generate(req("x", [1] * 12, max_tokens=5))]
    assert sum(len(o.new_token_ids) for o in outs) == 5
    assert outs[-1].num_prompt_tokens == 12
    await engine.stop()


async def test_queue_times_are_never_negative() -> None:
    finished: list[FinishedRequestStats] = []
    engine = LiveEngine(
        small_config(speedup_ratio=20.0),
        on_step=lambda r: finished.extend(r.finished),
    )
    engine.start()

    async def one(i: int) -> None:
        await asyncio.sleep(0.0005 * i)  # arrivals spread across passes
        async for _ in engine.generate(req(f"q{i}", [i] * (4 + i), max_tokens=6)):
            pass

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(30))), timeout=30)
    await engine.stop()
    assert len(finished) == 30
    for r in finished:
        assert not_none(r.first_scheduled_time) >= r.arrival_time
        assert not_none(r.first_token_time) > not_none(r.first_scheduled_time)


async def test_stop_request_ends_with_stop_and_reports_the_finish() -> None:
    finished: list[FinishedRequestStats] = []
    engine = LiveEngine(small_config(speedup_ratio=20.0), on_finish=finished.append)
    engine.start()
    stream = engine.add_request(req("s", [3] * 6, max_tokens=200))
    first = await asyncio.wait_for(stream.get(), timeout=5)
    assert first.new_token_ids and not first.finished
    engine.stop_request("s")
    last = await asyncio.wait_for(stream.get(), timeout=5)
    assert last.finished and last.finish_reason is FinishReason.STOP
    await _until(lambda: bool(finished))
    assert finished[0].request_id == "s" and finished[0].finish_reason is FinishReason.STOP
    assert engine.core.pool.num_used == 0 and engine.num_running == 0
    await engine.stop()


async def test_num_waiting_counts_requests_not_yet_drained() -> None:
    engine = LiveEngine(small_config())
    engine.add_request(req("a", [1] * 4))  # the loop has not started: still in the inbox
    engine.add_request(req("b", [2] * 4))
    assert engine.num_waiting == 2 and engine.core.num_waiting == 0
    engine.start()
    await _until(lambda: engine.num_waiting == 0 and not engine.core.requests)
    await engine.stop()


async def test_outputs_of_a_request_aborted_mid_pass_are_not_observed() -> None:
    """A pass in flight when its request is aborted must not count that request's token:
    the client never got it (vLLM's output processor drops it the same way)."""
    seen: list[StepResult] = []
    engine = LiveEngine(small_config(speedup_ratio=1.0), on_step=seen.append)
    engine.start()
    stream = engine.add_request(req("x", [5] * 6, max_tokens=100))
    await asyncio.wait_for(stream.get(), timeout=5)
    passes = len(seen)
    engine.abort("x")  # the loop is asleep in the next pass, which includes "x"
    await _until(lambda: len(seen) > passes or not engine.core.requests)
    assert all(o.request_id != "x" for step in seen[passes:] for o in step.outputs)
    await engine.stop()


async def test_abort_with_a_stream_spares_a_later_request_reusing_the_id() -> None:
    engine = LiveEngine(small_config(speedup_ratio=100.0))
    engine.start()
    old = engine.add_request(req("x", [1] * 4, max_tokens=2))
    while not (await asyncio.wait_for(old.get(), timeout=5)).finished:
        pass
    new = engine.add_request(req("x", [2] * 4, max_tokens=3))
    engine.abort("x", old)  # the old response cleaning up: must not touch the new request
    outs = [await asyncio.wait_for(new.get(), timeout=5)]
    while not outs[-1].finished:
        outs.append(await asyncio.wait_for(new.get(), timeout=5))
    assert outs[-1].finish_reason is FinishReason.LENGTH
    assert sum(len(o.new_token_ids) for o in outs) == 3
    await engine.stop()


async def test_a_failing_listener_does_not_kill_the_engine_and_its_request_is_aborted() -> None:
    finished: list[FinishedRequestStats] = []
    engine = LiveEngine(small_config(speedup_ratio=100.0), on_finish=finished.append)
    engine.start()
    seen: list[object] = []

    def broken(out: object) -> None:
        seen.append(out)
        if isinstance(out, RequestOutput):
            raise ValueError("consumer bug")

    # 200 tokens to go when its consumer fails on the first: it must not run on.
    engine.add_request(req("bad", [1] * 40, max_tokens=200)).listen(broken)
    good = engine.add_request(req("good", [2] * 4, max_tokens=3))
    while not (await asyncio.wait_for(good.get(), timeout=5)).finished:
        pass
    await _until(lambda: "bad" not in engine.core.requests)
    assert not engine.is_dead
    assert isinstance(seen[-1], ConsumerError) and len(seen) == 2  # told once, then nothing
    assert engine.core.pool.num_used == 0 and engine.num_open_streams == 0
    bad = next(f for f in finished if f.request_id == "bad")
    assert bad.finish_reason is FinishReason.ABORT and bad.num_generation_tokens < 200
    await engine.stop()


def _host_config(**overrides: Any) -> EngineConfig:
    settings: dict[str, Any] = {
        "num_gpu_blocks": 16,
        "max_num_batched_tokens": 512,
        "max_model_len": 64,
        "num_cpu_blocks": 64,
        "cpu_write_gbps": 1.0,
        "cpu_read_gbps": 1.0,
        "speedup_ratio": 20.0,
    }
    return small_config(**(settings | overrides))


async def _run_one(engine: LiveEngine, rid: str, prompt: list[int]) -> list[RequestOutput]:
    return [out async for out in engine.generate(req(rid, prompt, max_tokens=1, ignore_eos=True))]


async def test_the_transfer_timer_drives_a_load_while_the_loop_idles() -> None:
    steps: list[StepResult] = []
    engine = LiveEngine(_host_config(offload_policy="write-through"), on_step=steps.append)
    engine.start()
    prompts = [[1000 * (k + 1) + j for j in range(32)] for k in range(3)]
    for k, prompt in enumerate(prompts):  # 3 × 8 blocks through a 16-block pool
        await _run_one(engine, f"r{k}", prompt)
        await _until(lambda: not engine.core.has_pending_transfers())
    outs = await asyncio.wait_for(_run_one(engine, "again", prompts[0]), timeout=10)
    # Its KV came from host: the loop slept while only the load was in flight, and the
    # transfer timer woke it when the load's deadline passed.
    assert outs[-1].finished and outs[-1].num_tier_cached_tokens == 28
    assert outs[-1].num_cached_tokens == 28
    loads = [t for s in steps for t in s.transfers if t.kind == 1]
    assert [t.num_blocks for t in loads] == [7]
    await _until(lambda: not engine.core.has_pending_transfers())
    assert engine.core.pool.num_used == 0
    await engine.stop()


async def test_stores_finish_after_the_last_request_without_new_work() -> None:
    steps: list[StepResult] = []
    # The 8 blocks' copy (4 MiB at 0.2 MB/s, 20x speedup) takes about a second of wall
    # time, so it is still in flight when the request's last output arrives, however busy
    # the machine.
    config = _host_config(offload_policy="write-through", cpu_write_gbps=0.0002)
    engine = LiveEngine(config, on_step=steps.append)
    engine.start()
    await _run_one(engine, "a", list(range(100, 132)))
    # The request is done but its blocks are pinned until their copies end.
    assert engine.core.pool.num_used == 8 and engine.core.has_pending_transfers()
    await _until(lambda: not engine.core.has_pending_transfers())
    assert engine.core.pool.num_used == 0
    assert engine.core.cpu is not None and engine.core.cpu.num_resident == 8
    assert sum(t.num_blocks for s in steps for t in s.transfers) == 8
    await engine.stop()


async def test_abort_during_a_live_load_frees_everything() -> None:
    # 7 blocks at 0.25 GB/s: a 14.7 ms load (it pays off against a 16.9 ms prefill), in
    # real time, so the abort lands while it is in flight.
    engine = LiveEngine(
        _host_config(offload_policy="write-through", cpu_read_gbps=0.25, speedup_ratio=1.0)
    )
    engine.start()
    prompts = [[1000 * (k + 1) + j for j in range(32)] for k in range(3)]
    for k, prompt in enumerate(prompts):
        await _run_one(engine, f"r{k}", prompt)
    await _until(lambda: not engine.core.has_pending_transfers())
    stream = engine.add_request(req("again", prompts[0], max_tokens=1))
    connector = engine.core.connector
    assert connector is not None
    await _until(lambda: connector.num_loading == 1)
    engine.abort("again", stream)
    out = await stream.get()
    assert out.finished and out.finish_reason == FinishReason.ABORT
    await _until(lambda: not engine.core.has_pending_transfers() and not engine.core.requests)
    assert engine.core.pool.num_used == 0
    assert engine.core.cpu is not None and engine.core.cpu.num_pinned() == 0
    await engine.stop()


async def test_reset_under_load_is_applied_between_passes_and_stays_true() -> None:
    # Every result's events, applied in the order the loop hands them out, equal the cache
    # at that moment: the reset's AllBlocksCleared never overtakes a pass's events.
    config = small_config(speedup_ratio=0.25, enable_kv_cache_events=True)
    index = EventIndex(config.block_size)
    mismatches: list[int] = []
    kept_at_reset: list[int] = []

    def on_step(result: StepResult) -> None:
        index.apply(result.kv_events)
        cached = set(engine.core.pool.cached_hashes())
        if index.hashes("GPU") != cached:
            mismatches.append(len(mismatches))
        if any(type(e).__name__ == "AllBlocksCleared" for e in result.kv_events):
            kept_at_reset.append(len(cached))

    engine = LiveEngine(config, on_step=on_step)
    engine.start()
    async for _ in engine.generate(req("done", list(range(100, 140)), max_tokens=2)):
        pass
    # Long enough (about 200 passes, 4 s, however loaded the machine) to be certainly
    # running at the reset; it is aborted right after.
    running = req("running", list(range(500, 540)), max_tokens=200)
    stream = engine.add_request(running)
    await _until(lambda: engine.core.pool.num_used > 0)
    cleared = await engine.reset_prefix_cache()
    assert not_none(cleared) > 0  # the finished request's blocks
    engine.abort("running", stream)
    await _until(lambda: engine.core.pool.num_used == 0)
    assert kept_at_reset and kept_at_reset[0] > 0  # the running request's blocks stayed
    assert index.counts["AllBlocksCleared"] == 1 and not mismatches
    await engine.stop()
    with pytest.raises(EngineDeadError):
        await engine.reset_prefix_cache()


async def test_a_failing_reset_fails_its_caller_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = LiveEngine(small_config(speedup_ratio=100.0))

    def broken(now: float, **_: bool) -> tuple[int, StepResult]:
        raise RuntimeError("simulated reset bug")

    monkeypatch.setattr(engine.core, "reset_prefix_cache", broken)
    engine.start()
    with pytest.raises(EngineDeadError, match="simulated reset bug"):
        await asyncio.wait_for(engine.reset_prefix_cache(), timeout=10)
    assert engine.is_dead
    await engine.stop()


async def _tokens_until_finished(stream: RequestStream) -> int:
    """Read a stream (no listener) to its end; how many tokens it carried."""
    tokens = 0
    while True:
        out = await asyncio.wait_for(stream.get(), timeout=5)
        tokens += len(out.new_token_ids)
        if out.finished:
            return tokens


async def _run_late(merge: int, late: float, max_tokens: int = 24, lag: float = 60.0) -> tuple[
    dict[str, list[list[int]]], list[StepResult], LiveEngine
]:  # fmt: skip
    """Three streams on an engine whose loop wakes `late` after every pass it sleeps for."""
    steps: list[StepResult] = []
    engine = LiveEngine(
        small_config(speedup_ratio=1.0),
        clock=LateClock(late),
        on_step=steps.append,
        max_lag_s=lag,  # (60 s: never resynchronised, the passes chain)
        max_merged_passes=merge,
    )
    engine.start()
    chunks: dict[str, list[list[int]]] = {}

    async def consume(i: int) -> None:
        spec = req(f"r{i}", [20 + i] * (5 + i), max_tokens=max_tokens, ignore_eos=True)
        async for out in engine.generate(spec):
            chunks.setdefault(spec.request_id, []).append(list(out.new_token_ids))

    await asyncio.wait_for(asyncio.gather(*(consume(i) for i in range(3))), timeout=30)
    await engine.stop()
    return chunks, steps, engine


async def test_a_lagging_loop_merges_passes_and_keeps_their_pace() -> None:
    """Woken 2.5 passes late every time, the loop runs the passes that are due at once and
    hands their tokens out together (at most max_merged_passes a chunk); the passes keep
    chaining at their modelled pace and each is observed on its own, one token a request."""
    plain_chunks, plain_steps, _ = await _run_late(merge=1, late=0.0)
    decode = plain_steps[-1].end - plain_steps[-1].start  # a pass of three decodes
    chunks, steps, engine = await _run_late(merge=4, late=2.5 * decode)
    for request_id, got in chunks.items():
        assert [t for c in got for t in c] == [t for c in plain_chunks[request_id] for t in c]
        assert all(1 <= len(c) <= 4 for c in got)
        assert max(len(c) for c in got) > 1  # merged
        assert len(got) < 24
    # The same passes, at the same modelled times: merging changed delivery only.
    assert [(s.start, s.end) for s in steps] == [(s.start, s.end) for s in plain_steps]
    assert all(b.start == a.end for a, b in itertools.pairwise(steps))
    assert all(len(o.new_token_ids) == 1 for s in steps for o in s.outputs)
    assert sum(len(s.outputs) for s in steps) == 3 * 24
    assert engine.core.pool.num_used == 0 and not engine._held


async def test_without_merging_a_lagging_loop_delivers_every_pass() -> None:
    chunks, _, _ = await _run_late(merge=1, late=0.01)
    assert all(len(c) == 1 for got in chunks.values() for c in got)


async def test_a_stream_aborted_while_its_tokens_are_held_gets_nothing_more() -> None:
    """An abort between passes ends the stream at once; tokens of earlier passes still held
    for it are dropped at the hand-out (as vLLM drops a finished request's late deltas)."""
    seen_b: list[RequestOutput | StreamError] = []
    aborted_with: list[int] = []  # tokens b had received when aborted

    def on_step(result: StepResult) -> None:
        # Called as a pass is held: abort b the first time it has tokens waiting.
        if not aborted_with and engine._held.get(b):
            aborted_with.append(sum(len(o.new_token_ids) for o in only_outputs(seen_b)))
            engine.abort("b", b)

    engine = LiveEngine(
        small_config(speedup_ratio=1.0),
        clock=LateClock(0.5),
        on_step=on_step,
        max_lag_s=60.0,
        max_merged_passes=64,
    )
    engine.start()
    a = engine.add_request(req("a", [7] * 6, max_tokens=40, ignore_eos=True))
    b = engine.add_request(req("b", [8] * 6, max_tokens=40, ignore_eos=True))
    b.listen(seen_b.append)
    assert await _tokens_until_finished(a) == 40 and aborted_with
    outputs_b = only_outputs(seen_b)
    assert outputs_b[-1].finished and outputs_b[-1].finish_reason is FinishReason.ABORT
    assert sum(len(o.new_token_ids) for o in outputs_b) == aborted_with[0]  # nothing after it
    await _until(lambda: not engine.core.has_unfinished_requests())
    assert engine.core.pool.num_used == 0 and not engine._held
    await engine.stop()


async def test_a_stream_stopped_by_its_consumer_during_a_hand_out_keeps_its_id() -> None:
    """A consumer that ends its stream while taking a merged output (a stop string in it)
    leaves the request in the core until its FinishEarly is applied: until then the id
    stays in use, so a retry under it is refused rather than lost (its stream dropped by
    the old request's FinishEarly, its request skipped as aborted)."""
    engine = LiveEngine(
        small_config(speedup_ratio=1.0),
        clock=LateClock(0.03),
        max_lag_s=60.0,
        max_merged_passes=8,
    )
    engine.start()
    old = engine.add_request(req("x", [7] * 6, max_tokens=40, ignore_eos=True))
    outputs: list[RequestOutput] = []
    refused: list[bool] = []

    def listener(out: RequestOutput | StreamError) -> None:
        assert isinstance(out, RequestOutput), out
        outputs.append(out)
        if len(outputs) == 2 and not out.finished:
            engine.stop_request("x", old)  # what the renderer does on a stop string
            asyncio.get_running_loop().call_soon(retry)

    def retry() -> None:
        try:
            engine.add_request(req("x", [9] * 6, max_tokens=3), checked=True)
        except RequestRejected:
            refused.append(True)
        else:
            refused.append(False)

    old.listen(listener)
    await _until(lambda: bool(refused))
    if not refused[0]:  # taken: it must then run to its end like any request
        retried = engine._streams.get("x")
        assert retried is not None, "the old request's finish dropped the retry's stream"
        assert await _tokens_until_finished(retried) == 3
    assert len(outputs[1].new_token_ids) > 1  # the stop came in a merged output
    await _until(lambda: not engine.core.has_unfinished_requests())
    assert engine.core.pool.num_used == 0
    await engine.stop()


def test_max_merged_passes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_merged_passes"):
        LiveEngine(small_config(), max_merged_passes=0)


async def test_merging_passes_catch_up_instead_of_resynchronising() -> None:
    """Woken 80 ms late (over max_lag_s, 50 ms): a loop that merges passes chains them
    from deadline to deadline and catches up; one that does not resynchronises to the
    wall clock, and its passes fall behind their model."""
    _, merging, _ = await _run_late(merge=64, late=0.08, lag=0.05)
    assert all(b.start == a.end for a, b in itertools.pairwise(merging))
    _, plain, _ = await _run_late(merge=1, late=0.08, lag=0.05)
    assert any(b.start > a.end for a, b in itertools.pairwise(plain))
