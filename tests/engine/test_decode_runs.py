"""Decode runs: the passes `step()` would run, applied at once, with the same end state."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from mocker.engine.core import EngineCore
from mocker.engine.decode_runs import MIN_DEFERRED, DecodeRuns, run_decodes
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.block import block_ids
from mocker.request import EngineRequest
from tests.support.engines import CompositionTiming, SpanTiming, req, small_config
from tests.support.pools import free_order


def _decoding_core() -> tuple[EngineCore, float]:
    """Three requests past their prompts, about to decode."""
    core = EngineCore(small_config(num_gpu_blocks=64))
    for i in range(3):
        core.add_request(req(f"r{i}", [i + 1] * (5 + 3 * i), max_tokens=10 + i, ignore_eos=True))
    now = core.step(0.0).end
    return core, now


def _stepwise(
    core: EngineCore, now: float, passes: int
) -> tuple[float, list[FinishedRequestStats]]:
    finished: list[FinishedRequestStats] = []
    for _ in range(passes):
        result = core.step(now)
        now = result.end
        finished += result.finished
    return now, finished


def test_a_run_equals_the_same_passes_stepped() -> None:
    fast, now = _decoding_core()
    slow, _ = _decoding_core()
    run = run_decodes(fast, now, stop_at=float("inf"))
    assert run is not None and run.passes == 9  # until r0 reaches its 10 tokens
    end, finished = _stepwise(slow, now, run.passes)
    assert run.end == end and run.finished == finished
    assert [f.request_id for f in finished] == ["r0"]
    for rid in ("r1", "r2"):
        a, b = fast.requests[rid], slow.requests[rid]
        assert a.all_token_ids == b.all_token_ids and a.block_hashes == b.block_hashes
        assert block_ids(a.blocks) == block_ids(b.blocks)
    assert fast.pool.cached_hashes() == slow.pool.cached_hashes()


def test_a_run_stops_at_the_first_pass_ending_at_or_after_stop_at() -> None:
    core, now = _decoding_core()
    one = core.pass_duration(0, 3, core.snapshot().num_used_blocks, prefill_requests=0,
                             prefill_context=0, decode_context=0)  # fmt: skip
    run = run_decodes(core, now, stop_at=now + 2.5 * one)
    assert run is not None and run.passes == 3 and not run.finished


def test_no_run_while_a_request_still_prefills() -> None:
    core = EngineCore(small_config())
    core.add_request(req("a", [1] * 8, max_tokens=4, ignore_eos=True))
    assert run_decodes(core, 0.0, stop_at=1.0) is None


def _drive(
    core: EngineCore, arrivals: list[tuple[float, EngineRequest]], fast: bool, min_deferred: int = 0
) -> tuple[list[FinishedRequestStats], int, float]:
    """Run the core until drained, adding each request at its arrival as replay does (a
    run stops at the next one): the finished requests, the passes and the last end."""
    pending = sorted(arrivals, key=lambda a: a[0])
    finished: list[FinishedRequestStats] = []
    now, passes = 0.0, 0
    while pending or core.has_unfinished_requests():
        while pending and pending[0][0] <= now:
            core.add_request(pending.pop(0)[1])
        stop = pending[0][0] if pending else math.inf
        if not core.has_unfinished_requests():
            now = stop
            continue
        run = None
        if fast:
            run = run_decodes(core, now, stop, through_finishes=True, min_deferred=min_deferred)
        if run is not None:
            now, passes, finished = run.end, passes + run.passes, finished + run.finished
            continue
        result = core.step(now)
        assert not result.idle
        now, passes, finished = result.end, passes + 1, finished + result.finished
    return finished, passes, now


@pytest.mark.parametrize("context", [None, CompositionTiming, SpanTiming])
@pytest.mark.parametrize("min_deferred", [0, MIN_DEFERRED])
@pytest.mark.parametrize("seed", range(8))
def test_runs_with_admissions_and_finishes_equal_stepping(
    seed: int, min_deferred: int, context: type[CompositionTiming] | None
) -> None:
    """Random arrivals into a small engine: runs that admit waiting requests (chunked
    prefills beside the decoders), go through finishes and stop before preemptions give
    every pass's result, the same end state and pool order as stepping (deferring the
    decoders' state, or with fewer running requests than MIN_DEFERRED as whole runs). With
    a timing model that reads the passes' context counts (the GPU model's), every pass
    of a run is timed from the same counts as stepping finds, and one that keeps a decode
    pass's time over a span of passes (the GPU model's memo) keeps it for exactly those."""
    rng = random.Random(seed)
    changes = {
        "num_gpu_blocks": rng.choice([20, 32, 64]),
        "max_num_batched_tokens": rng.choice([12, 32]),
        "max_num_seqs": rng.choice([3, 8]),
        "vocab_size": rng.choice([3, 1000]),  # 3: generated blocks repeat (prefix hits)
        "eos_probability": rng.choice([0.0, 0.05]),
    }
    arrivals = []
    t = 0.0
    for i in range(40):
        t += rng.expovariate(200.0)
        prompt = [rng.randrange(1, 3) for _ in range(rng.randrange(1, 40))]
        sampling: dict[str, Any] = {"ignore_eos": rng.random() < 0.8}
        if rng.random() < 0.1:
            sampling["stop_token_ids"] = [7]
        arrivals.append((t, req(f"r{i}", prompt, max_tokens=rng.randrange(1, 30), **sampling)))
    fast = EngineCore(small_config(**changes), timing=context() if context else None)
    slow = EngineCore(small_config(**changes), timing=context() if context else None)
    fast_out = _drive(fast, arrivals, fast=True, min_deferred=min_deferred)
    slow_out = _drive(slow, arrivals, fast=False)
    assert fast_out == slow_out
    assert free_order(fast.pool) == free_order(slow.pool)
    assert fast.pool.cached_hashes() == slow.pool.cached_hashes()
    assert fast.scheduler.num_preemptions == slow.scheduler.num_preemptions


def test_a_run_admits_a_waiting_request_and_takes_it_on_as_a_decoder() -> None:
    fast, now = _decoding_core()
    slow, _ = _decoding_core()
    for core in (fast, slow):
        core.add_request(req("late", [9] * 6, max_tokens=20, ignore_eos=True, arrival=now))
    run = run_decodes(fast, now, stop_at=math.inf, min_deferred=0)  # (until r0's finish)
    assert run is not None and run.passes == 9 and fast.requests["late"].num_output_tokens == 9
    end, finished = _stepwise(slow, now, run.passes)
    assert run.end == end and run.finished == finished
    assert fast.requests["late"].first_token_time == slow.requests["late"].first_token_time
    for rid in fast.requests:
        a, b = fast.requests[rid], slow.requests[rid]
        assert a.all_token_ids == b.all_token_ids and a.num_computed_tokens == b.num_computed_tokens
        assert block_ids(a.blocks) == block_ids(b.blocks)


def test_a_run_ends_at_a_finish_unless_told_to_go_through() -> None:
    core, now = _decoding_core()
    run = run_decodes(core, now, stop_at=math.inf, min_deferred=0)
    assert run is not None and [f.request_id for f in run.finished] == ["r0"]
    core, now = _decoding_core()
    run = run_decodes(core, now, stop_at=math.inf, through_finishes=True, min_deferred=0)
    assert run is not None and [f.request_id for f in run.finished] == ["r0", "r1", "r2"]
    assert not core.has_unfinished_requests()


def test_a_step_between_two_deferred_runs_is_refused() -> None:
    # The decoders' tokens and counts are not applied between two runs: a driver that steps
    # the engine in between would run a pass on stale requests.
    core, now = _decoding_core()
    runs = DecodeRuns(core, min_deferred=0)
    run = runs.run(now, stop_at=now + 1e-9)
    assert run is not None and run.passes == 1
    assert core.requests["r0"].num_output_tokens == 1  # (its second token: not yet applied)
    core.step(run.end)
    with pytest.raises(RuntimeError, match="stepped while a decode run held"):
        runs.run(core.time, stop_at=math.inf)


def test_settle_applies_every_deferred_pass() -> None:
    fast, now = _decoding_core()
    slow, _ = _decoding_core()
    runs = DecodeRuns(fast, min_deferred=0)
    run = runs.run(now, stop_at=now + 1e-9)
    assert run is not None
    runs.settle()
    _stepwise(slow, now, 1)
    for rid in ("r0", "r1", "r2"):
        a, b = fast.requests[rid], slow.requests[rid]
        assert (a.all_token_ids, a.num_computed_tokens, a.last_token_time) == (
            b.all_token_ids,
            b.num_computed_tokens,
            b.last_token_time,
        )
