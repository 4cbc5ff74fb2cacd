"""The direct text format: byte for byte what prometheus_client's generate_latest prints."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from mocker.metrics.exposition import Series, escape, go_float, histogram_text, metric_text

# prometheus_client's own float format, typed here (the library leaves it unannotated).
_float_to_go_string: Callable[[float], str] = floatToGoString


class _Collected:
    def __init__(self, *metrics: Metric) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from self.metrics


def _latest(*metrics: Metric) -> str:
    return generate_latest(_Collected(*metrics)).decode()


@pytest.mark.parametrize(
    "value",
    [0, 1, 7, 999_999, 1_000_000, 12_345_678, -5, -999_999, -1_000_000, 10**20, True, False,
     0.0, 0.1, 2.5, -2.5, 1e-9, 123456.75, 1234567.0, 1e21, math.inf, -math.inf, math.nan],
)  # fmt: skip
def test_go_float_is_prometheus_clients_float_format(value: float) -> None:
    assert go_float(value) == _float_to_go_string(value)


def test_label_values_are_escaped_and_names_sorted() -> None:
    assert escape('a\\b\n"c"') == 'a\\\\b\\n\\"c\\"'
    series = Series(["model_name", "engine"], ['m"1', "0"])
    assert series.text() == '{engine="0",model_name="m\\"1"}'
    assert series.text("finished_reason", "stop") == (
        '{engine="0",finished_reason="stop",model_name="m\\"1"}'
    )
    assert series.text("tier", "a\nb") == '{engine="0",model_name="m\\"1",tier="a\\nb"}'
    before, after = series.around_le
    assert before + "0.5" + after == series.text("le", "0.5")
    assert Series([], []).text() == ""


def test_histogram_text_matches_generate_latest() -> None:
    family = HistogramMetricFamily("h_seconds", "A histogram.", labels=["model_name", "engine"])
    buckets = [("0.1", 2), ("1.0", 2), ("+Inf", 7)]
    family.add_metric(['m"x', "3"], buckets, 12.25)
    series = Series(["model_name", "engine"], ['m"x', "3"])
    text = histogram_text("h_seconds", series, ["0.1", "1.0", "+Inf"], [2, 0, 5], 12.25)
    expected = _latest(family)
    assert text == expected[expected.index("h_seconds_bucket") :]


def test_counters_and_gauges_match_generate_latest() -> None:
    counter = CounterMetricFamily(
        "c_total", "A counter,\nwith a \\ in its help.", labels=["zone", "model_name"]
    )
    counter.add_metric(["b\\", 'q"'], 3)
    counter.add_metric(["a", "m"], 2_000_000)
    gauge = GaugeMetricFamily("g", "A gauge.", value=0.25)
    assert metric_text(counter) + metric_text(gauge) == _latest(counter, gauge)


def test_anything_else_is_left_to_generate_latest() -> None:
    """A _created sample (a family of its own there), timestamps, histograms: the same text."""
    created = CounterMetricFamily("c", "Created.", labels=["a"])
    created.add_metric(["x"], 1, created=1_700_000_000.0)
    stamped = GaugeMetricFamily("g", "Stamped.", labels=["a"])
    stamped.add_metric(["x"], 1.5, timestamp=1_700_000_000.0)
    histogram = HistogramMetricFamily("h", "H.", buckets=[("1.0", 1), ("+Inf", 2)], sum_value=3)
    for metric in (created, stamped, histogram):
        assert metric_text(metric) == _latest(metric)
    assert "c_created" in metric_text(created)
