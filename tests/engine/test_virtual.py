"""Virtual-clock driver: time jumps, arrivals applied at pass boundaries, aborts, rejections."""

import itertools
from collections.abc import Iterable

import pytest

from mocker.clock import VirtualClock
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.engine.virtual import Abort, VirtualDriver, VirtualRun
from tests.support.engines import make_core, req, small_config


def test_idle_time_jumps_to_next_arrival() -> None:
    driver = VirtualDriver(make_core())
    starts = [r.start for r in driver.steps([req("a", [1] * 4, max_tokens=1, arrival=5.0)])]
    assert starts == [5.0]
    assert driver.clock.now() > 5.0


def test_arrival_during_a_pass_joins_at_its_end() -> None:
    driver = VirtualDriver(make_core())
    results = list(
        driver.steps([req("a", range(20), max_tokens=3), req("b", range(50, 54), arrival=0.001)])
    )
    first = results[0]
    assert first.start == 0.0 and first.end > 0.001
    b_first = next(r for r in results if any(o.request_id == "b" for o in r.outputs))
    assert b_first.start >= first.end
    # Passes chain without gaps while there is work.
    for prev, nxt in itertools.pairwise(results):
        assert nxt.start == prev.end


def test_run_reports_finished_aborted_rejected() -> None:
    core = make_core(num_gpu_blocks=8)
    run = VirtualDriver(core).run(
        [
            req("ok", [1] * 4, max_tokens=2),
            req("cut", [2] * 4, max_tokens=20),
            req("huge", range(40), max_tokens=1),
        ],
        [Abort(0.05, "cut")],
    )
    assert [r.request_id for r in run.finished] == ["ok"]
    assert [o.request_id for o in run.aborted] == ["cut"]
    assert run.rejected[0][0].request_id == "huge" and "KV blocks" in run.rejected[0][1]
    assert core.pool.num_used == 0 and run.num_steps > 0


def _tokens(results: Iterable[StepResult]) -> dict[str, list[int]]:
    """Every request's generated tokens, from the outputs of a run's passes."""
    tokens: dict[str, list[int]] = {}
    for result in results:
        for out in result.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def test_same_workload_same_result() -> None:
    def once() -> list[tuple[str, float, list[int]]]:
        core = EngineCore(small_config(seed=3))
        run = VirtualRun()
        requests = [req(f"r{i}", [i] * (5 + i), max_tokens=4, arrival=0.01 * i) for i in range(6)]
        tokens = _tokens(VirtualDriver(core, VirtualClock()).steps(requests, run=run))
        return [(r.request_id, r.finished_time, tokens[r.request_id]) for r in run.finished]

    assert once() == once()


def test_clock_never_goes_back() -> None:
    clock = VirtualClock(2.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance_to(1.0)


def test_speedup_only_scales_time() -> None:
    def once(speedup: float) -> list[tuple[str, float, float, list[int]]]:
        core = EngineCore(small_config(speedup_ratio=speedup, num_gpu_blocks=20))
        run = VirtualRun()
        requests = [
            req(f"r{i}", [i % 3] * (8 + 5 * i), max_tokens=12, arrival=0.004 * i / speedup)
            for i in range(8)
        ]
        tokens = _tokens(VirtualDriver(core).steps(requests, run=run))
        assert core.scheduler.num_preemptions > 0  # the interesting path is exercised
        return [
            (
                r.request_id,
                (r.first_token_time or 0.0) * speedup,
                r.finished_time * speedup,
                tokens[r.request_id],
            )
            for r in run.finished
        ]

    slow, fast = once(1.0), once(10.0)
    assert [(a[0], a[3]) for a in slow] == [(b[0], b[3]) for b in fast]
    for a, b in zip(slow, fast, strict=True):
        assert b[1] == pytest.approx(a[1]) and b[2] == pytest.approx(a[2])
