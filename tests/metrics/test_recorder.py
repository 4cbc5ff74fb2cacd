"""The stats recorder: counters and histograms from a run's step results and finishes."""

from __future__ import annotations

from dataclasses import replace

from mocker.engine.virtual import VirtualDriver
from mocker.metrics import StatsRecorder
from mocker.request import ParallelSampling, RequestStatus
from tests.support.engines import make_core, req


def test_counters_follow_a_virtual_run() -> None:
    core = make_core()
    metrics = StatsRecorder(core.config)
    shared = list(range(100, 116))
    requests = [req(f"r{i}", [*shared, i], max_tokens=5, arrival=i * 0.5) for i in range(4)]
    for result in VirtualDriver(core).steps(requests):
        metrics.on_step(result)
    assert metrics.generation_tokens == 20
    assert metrics.prompt_tokens == 4 * 17
    assert metrics.prefix_queries == 4 * 17 and metrics.prefix_hits == 3 * 16
    assert metrics.prompt_tokens_cached == metrics.prefix_hits
    assert metrics.finished["length"] == 4
    assert metrics.ttft.count == 4 and metrics.itl.count == 4 * 4
    assert metrics.e2e.count == metrics.queue.count == metrics.decode.count == 4
    assert metrics.tpot.count == 4


def test_aborts_outside_a_pass_are_counted() -> None:
    core = make_core()
    metrics = StatsRecorder(core.config)
    core.add_request(req("a", [1] * 8, max_tokens=50))
    metrics.on_step(core.step(0.0))
    finished = core.finish_request("a", 1.0, RequestStatus.FINISHED_ABORTED)
    assert finished is not None
    metrics.on_finish(finished)
    assert metrics.finished["abort"] == 1 and metrics.e2e.count == 1


def test_a_dropped_final_output_counts_the_finish_but_not_its_token() -> None:
    core = make_core()
    metrics = StatsRecorder(core.config)
    core.add_request(req("r", [1] * 4, max_tokens=2))
    metrics.on_step(core.step(0.0))
    assert metrics.generation_tokens == 1 and metrics.ttft.count == 1
    last = core.step(1.0)
    last.outputs = []  # the live driver drops it when the client left during the pass
    metrics.on_step(last)
    assert metrics.finished["length"] == 1 and metrics.e2e.count == 1
    assert metrics.generation_tokens == 1 and metrics.itl.count == 0


def test_n_and_the_longest_output_are_observed_once_per_request() -> None:
    core = make_core()
    metrics = StatsRecorder(core.config)
    parent = ParallelSampling(2)
    requests = [
        replace(req("0_r", [1] * 8, max_tokens=3), parent=parent),
        replace(req("1_r", [1] * 8, max_tokens=6), parent=parent),
        req("solo", [2] * 8, max_tokens=4),
    ]
    for result in VirtualDriver(core).steps(requests):
        metrics.on_step(result)
    assert metrics.finished["length"] == 3  # per engine request, as vLLM's
    assert metrics.request_generation_tokens.count == 3
    assert metrics.request_params_n.count == 2 and metrics.request_params_n.total == 3
    assert metrics.request_max_generation_tokens.count == 2
    assert metrics.request_max_generation_tokens.total == 6 + 4
