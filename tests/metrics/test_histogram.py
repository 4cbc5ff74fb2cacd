"""Histograms as counts: le-inclusive buckets, weighted observations, vLLM's bucket tables."""

from __future__ import annotations

from mocker.metrics.histogram import BUCKETS, Histogram, one_two_five_buckets


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


def test_observe_each_is_observe_in_order_bit_for_bit() -> None:
    values = [0.1, 0.1, 0.1, 0.30000000000000004, 0.005, 0.005, 7.5, 0.1, 1e-9, 400.0, 0.1]
    one, each = Histogram(BUCKETS["itl"]), Histogram(BUCKETS["itl"])
    for v in values:
        one.observe(v)
    each.observe_each(values)
    each.observe_each([])
    assert each.counts == one.counts and each.total == one.total  # the same float, not close
    assert each.count == len(values)
