"""Metric values from engine results: histogram buckets, counters, and scrape-time gauges."""

from __future__ import annotations

from prometheus_client import generate_latest

from mocker.engine.virtual import VirtualDriver
from mocker.metrics import (
    BUCKETS,
    EngineMetrics,
    EngineSnapshot,
    Histogram,
    MetricsCollector,
    build_registry,
    one_two_five_buckets,
)
from tests.support.engines import make_core, req


def test_histogram_buckets_are_le_inclusive_and_weighted() -> None:
    h = Histogram((1.0, 2.0))
    h.observe(1.0)
    h.observe(1.5, 3)
    h.observe(9.0)
    assert h.cumulative() == [("1.0", 1), ("2.0", 4), ("+Inf", 5)]
    assert h.total == 1.0 + 4.5 + 9.0 and h.count == 5


def test_one_two_five_buckets() -> None:
    assert one_two_five_buckets(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert one_two_five_buckets(131072)[-1] == 100000


def test_vllm_bucket_tables() -> None:
    assert BUCKETS["ttft"][:3] == (0.001, 0.005, 0.01) and BUCKETS["ttft"][-1] == 2560.0
    assert len(BUCKETS["ttft"]) == 22 and len(BUCKETS["itl"]) == 19
    assert len(BUCKETS["request_time"]) == 21 and BUCKETS["request_time"][-1] == 7680.0
    assert BUCKETS["iteration_tokens"][-1] == 16384
    assert BUCKETS["preemptions"] == (1, 2, 3, 4, 5, 10, 20)


def test_counters_follow_a_virtual_run() -> None:
    core = make_core()
    metrics = EngineMetrics(core.config, lookup=core.requests.get)
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
    metrics = EngineMetrics(core.config, lookup=core.requests.get)
    core.add_request(req("a", [1] * 8, max_tokens=50))
    metrics.on_step(core.step(0.0))
    request = core.requests["a"]
    core.abort_request("a", 1.0)
    metrics.on_finish(request)
    assert metrics.finished["abort"] == 1 and metrics.e2e.count == 1


def test_collector_renders_names_labels_and_live_gauges() -> None:
    core = make_core()
    metrics = EngineMetrics(core.config, engine="0")
    metrics.snapshot = lambda: EngineSnapshot(3, 2, 0.25)
    text = generate_latest(
        build_registry(MetricsCollector([metrics], "m", legacy_names=True), process=False)
    ).decode()
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 3.0' in text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25' in text
    assert 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25' in text  # legacy alias
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    assert "vllm:prompt_tokens_total{" in text and "_created" not in text
    assert 'vllm:iteration_tokens_total_bucket{engine="0",le="16384.0",model_name="m"}' in text
    assert 'block_size="4"' in text and 'num_gpu_blocks="64"' in text


def test_a_dropped_final_output_leaves_no_per_request_state() -> None:
    core = make_core()
    metrics = EngineMetrics(core.config, lookup=core.requests.get)
    core.add_request(req("r", [1] * 4, max_tokens=2))
    metrics.on_step(core.step(0.0))
    assert "r" in metrics._last_token_time
    last = core.step(1.0)
    last.outputs = []  # the live driver drops it when the client left during the pass
    metrics.on_step(last)
    assert metrics._last_token_time == {} and metrics.finished["length"] == 1
