"""Stats records: per-request times and counts at the finish, per-pass latencies, snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mocker.engine.outputs import RequestOutput, iteration_stats
from mocker.engine.stats import FinishedRequestStats, queue_score
from mocker.engine.virtual import VirtualDriver
from mocker.request import FinishReason, ParallelSampling, RequestStatus
from tests.support.checks import not_none
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
    assert done.mean_time_per_output_token == pytest.approx(not_none(done.decode_time) / 2)
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
    stats = iteration_stats(outputs)
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


def test_siblings_of_n_report_the_request_figures_once_with_the_last_to_end() -> None:
    # n = 3 as vLLM's ParentRequest: each child's own record, but n and the longest output
    # are for the request, observed with whichever child ends last (here the aborted one).
    core = make_core()
    parent = ParallelSampling(3)
    for j, max_tokens in enumerate((2, 5, 50)):
        core.add_request(replace(req(f"{j}_r", [1] * 8, max_tokens=max_tokens), parent=parent))
    assert parent.open == 3
    ended: list[FinishedRequestStats] = []
    now = 0.0
    while len(ended) < 2:
        result = core.step(now)
        ended += result.finished
        now = result.end
    aborted = core.finish_request("2_r", now, RequestStatus.FINISHED_ABORTED)
    assert aborted is not None
    records = [*ended, aborted]
    ended_as = [(r.request_id, r.num_generation_tokens) for r in records]
    assert ended_as == [("0_r", 2), ("1_r", 5), ("2_r", 5)]
    assert [r.n_param for r in records] == [None, None, 3]
    assert records[-1].max_generation_tokens == 5 and parent.open == 0
    alone = core.add_request(req("solo", [1] * 8, max_tokens=1))
    assert alone.parent is None
    [solo] = core.step(now).finished
    assert (solo.n_param, solo.max_generation_tokens) == (1, 1)


def test_siblings_on_two_engines_are_counted_once_whenever_each_engine_takes_its_own() -> None:
    # Data parallel: each rank's loop takes its child at its own time; the first child may
    # end before the other rank has even taken its sibling.
    parent = ParallelSampling(2)
    first, second = make_core(), make_core()
    first.add_request(replace(req("0_r", [1] * 8, max_tokens=1), parent=parent))
    [early] = first.step(0.0).finished
    second.add_request(replace(req("1_r", [1] * 8, max_tokens=2), parent=parent))
    now, late = 0.0, list[FinishedRequestStats]()
    while not late:
        result = second.step(now)
        late, now = result.finished, result.end
    assert (early.n_param, late[0].n_param) == (None, 2)
    assert late[0].max_generation_tokens == 2
