"""Stats records: per-request times and counts at the finish, per-pass latencies, snapshots."""

from __future__ import annotations

import pytest

from mocker.engine.outputs import RequestOutput
from mocker.engine.stats import FinishedRequestStats, IterationStats, queue_score
from mocker.engine.virtual import VirtualDriver
from mocker.request import FinishReason, RequestStatus
from tests.support.engines import make_core, req


def test_a_finished_request_record_carries_its_times_and_counts() -> None:
    core = make_core()
    results = list(VirtualDriver(core).steps([req("a", [1] * 9, max_tokens=3, arrival=0.5)]))
    [done] = [r for result in results for r in result.finished]
    passes = [(r.start, r.end) for r in results]
    assert done.request_id == "a" and done.finish_reason is FinishReason.LENGTH
    assert done.arrival_time == 0.5 == done.first_scheduled_time == passes[0][0]
    assert done.first_token_time == passes[0][1] and done.finished_time == passes[-1][1]
    assert (done.num_prompt_tokens, done.num_generation_tokens, done.max_tokens) == (9, 3, 3)
    assert done.time_to_first_token == pytest.approx(passes[0][1] - 0.5)
    assert done.queued_time == 0.0
    assert done.decode_time == pytest.approx(passes[-1][1] - passes[0][1])
    assert done.mean_time_per_output_token == pytest.approx(done.decode_time / 2)
    assert done.e2e_latency == pytest.approx(passes[-1][1] - 0.5)


def test_a_request_aborted_while_waiting_has_no_phase_times() -> None:
    core = make_core()
    core.add_request(req("a", [1] * 8, arrival=1.0))
    done = core.finish_request("a", 3.0, RequestStatus.FINISHED_ABORTED)
    assert isinstance(done, FinishedRequestStats)
    assert done.finish_reason is FinishReason.ABORT and done.e2e_latency == 2.0
    assert done.queued_time is None and done.prefill_time is None
    assert done.mean_time_per_output_token is None and done.time_to_first_token is None


def test_iteration_stats_split_first_tokens_from_later_ones() -> None:
    outputs = [
        RequestOutput("a", [5], 1.0, num_prompt_tokens=10, num_cached_tokens=4,
                      tier_hits=(("cpu", 1), ("fs", 1)), first_token=True, latency=0.3),
        RequestOutput("b", [6], 1.0, latency=0.05),
        RequestOutput("c", [], 1.0, finished=True, latency=9.0),  # no token: not counted
    ]  # fmt: skip
    stats = IterationStats.of(outputs)
    assert stats.num_generation_tokens == 2
    assert (stats.num_prompt_tokens, stats.num_cached_tokens) == (10, 4)
    assert stats.tier_cached == {"cpu": 1, "fs": 1}
    assert stats.time_to_first_tokens == [0.3] and stats.inter_token_latencies == [0.05]


def test_pass_outputs_carry_ttft_then_itl() -> None:
    core = make_core()
    core.add_request(req("a", [1] * 4, max_tokens=3, arrival=0.25))
    first = core.step(0.25)
    second = core.step(first.end)
    [o1], [o2] = first.outputs, second.outputs
    assert o1.first_token and o1.latency == pytest.approx(first.end - 0.25)
    assert not o2.first_token and o2.latency == pytest.approx(second.end - first.end)


def test_queue_score_weighs_waiting_four_times() -> None:
    assert queue_score(num_waiting=1, num_running=0) == 4
    assert queue_score(num_waiting=0, num_running=3) == 3
    snap = make_core().snapshot()
    assert snap.queue_score == 0 and snap.num_unfinished == 0 and snap.kv_usage == 0.0
