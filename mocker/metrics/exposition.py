"""Prometheus text format (0.0.4) written directly: what `generate_latest` prints, without its
per-sample objects, name validation and label sorting."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

__all__ = ["Series", "go_float", "header", "histogram_text", "metric_text", "value_lines"]

# Go's float formatting, as Prometheus prints values and bucket bounds (untyped upstream).
_go_float: Callable[[float], str] = floatToGoString

# A scrape runs on the event loop that also runs the engine's passes: every millisecond it
# takes delays a pass, and the streams see it as an inter-token gap. generate_latest runs
# label-name regexes, a dict and a sort per sample; this writes each sample's known text.


def go_float(value: float) -> str:
    """`floatToGoString(value)`; an int below a million (most counters and bucket counts)
    without the float round trip (`repr(float(n))` is `f"{n}.0"` there)."""
    if type(value) is int and -1_000_000 < value < 1_000_000:
        return f"{value}.0"
    return _go_float(value)


def escape(value: str) -> str:
    """A label value as the text format quotes it (backslash, newline, double quote)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def header(name: str, help_text: str, kind: str) -> str:
    """The HELP and TYPE lines of a family."""
    doc = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


def _braces(pairs: Sequence[tuple[str, str]]) -> str:
    """'{a="x",b="y"}' for escaped pairs in order ('' for none, as generate_latest)."""
    return "{" + ",".join([f'{k}="{v}"' for k, v in pairs]) + "}" if pairs else ""


class Series:
    """The label pairs of one series, escaped once: rendered in name order, as the text
    format's writer sorts them, with room for one more label (`le`, or a family's own)."""

    __slots__ = ("around_le", "pairs")

    def __init__(self, names: Sequence[str], values: Sequence[str]) -> None:
        self.pairs = sorted([(k, escape(v)) for k, v in zip(names, values, strict=True)])
        self.around_le = self.around("le")

    def text(self, extra: str | None = None, value: str = "") -> str:
        """'{a="x",b="y"}' with `extra="value"` among them (names sorted)."""
        pairs = self.pairs if extra is None else sorted([*self.pairs, (extra, escape(value))])
        return _braces(pairs)

    def around(self, extra: str) -> tuple[str, str]:
        """The label text before and after `extra`'s value: `before + value + after` is
        `text(extra, value)` for a value that needs no escaping (a bucket bound)."""
        marker = "\x00"
        whole = self.text(extra, marker)
        cut = whole.index(marker)
        return whole[:cut], whole[cut + 1 :]


def value_lines(
    out: list[str], name: str, series: Series, value: object, label: str | None
) -> None:
    """A counter's or gauge's sample lines for one series: a number, or with `label` one
    line per (label value, number) pair."""
    if label is None:
        out.append(f"{name}{series.text()} {go_float(value)}\n")  # type: ignore[arg-type]
        return
    for extra, v in value:  # type: ignore[attr-defined]
        out.append(f"{name}{series.text(label, extra)} {go_float(v)}\n")


def histogram_text(
    name: str, series: Series, bounds: Sequence[str], counts: Iterable[int], total: float
) -> str:
    """A histogram's bucket lines (cumulative, `+Inf` last), then `_count` and `_sum`.
    `bounds` are the bucket bounds already formatted, `+Inf` included."""
    before, after = series.around_le
    bucket = f"{name}_bucket{before}"
    out = []
    running = 0
    for bound, n in zip(bounds, counts, strict=True):
        running += n
        out.append(f"{bucket}{bound}{after} {go_float(running)}\n")
    labels = series.text()
    out.append(f"{name}_count{labels} {go_float(running)}\n")
    out.append(f"{name}_sum{labels} {go_float(total)}\n")
    return "".join(out)


def metric_text(metric: Metric) -> str:
    """One family built as a prometheus_client `Metric` (a collector's small extras, the
    process and GC collectors), as generate_latest prints it: counters and gauges here,
    anything else by generate_latest itself."""
    name = metric.name + "_total" if metric.type == "counter" else metric.name
    plain = metric.type in ("counter", "gauge") and all(
        s.name == name and s.timestamp is None for s in metric.samples
    )
    if not plain:  # (a _created sample, say: generate_latest moves it to a family of its own)
        return generate_latest(_One(metric)).decode()
    out = [header(name, metric.documentation, metric.type)]
    for sample in metric.samples:
        labels = _braces(sorted([(k, escape(v)) for k, v in sample.labels.items()]))
        out.append(f"{sample.name}{labels} {go_float(sample.value)}\n")
    return "".join(out)


class _One:
    """A registry of one metric, for generate_latest."""

    __slots__ = ("metric",)

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric
