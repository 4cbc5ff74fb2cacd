"""A sweep spec (YAML): the workload, the flags every point shares, the axes and the SLO."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mocker.errors import ConfigError

__all__ = ["MAX_POINTS", "MAX_SPEC_BYTES", "Slo", "SweepSpec", "flag_name", "load_spec"]

# The grid is expanded (and every point's configuration checked) before anything runs.
MAX_POINTS = 10_000
MAX_SPEC_BYTES = 1 << 20

_KEYS = ("trace", "synthetic", "flags", "axes", "slo", "gpu-hour-price")
# Flags the sweep itself sets for every point (or that would write outside its table).
_OWNED = ("output-dir", "quiet", "no-plots", "help", "trace")
# Flags that shape the trace file as it is read: read once, shared by every point.
_TRACE_SHAPING = ("trace-block-size", "max-requests", "skip-bad-lines")
_SLO_BOUNDS = ("ttft", "tpot", "e2e")
_PERCENTILES = ("p50", "p90", "p99")  # the percentiles a replay's summary holds


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request bounds (seconds; None: unbounded), the share of requests that must meet
    every bound at once (vLLM bench's goodput rule), a least goodput (requests/s), and
    bounds on the point's percentiles (column name, e.g. "ttft_p99_s", to seconds)."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    attainment: float = 0.9
    min_goodput: float = 0.0
    percentiles: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        parts = []
        bounds = [f"{n} <= {getattr(self, n):g} s" for n in _SLO_BOUNDS if getattr(self, n)]
        if bounds:
            parts.append(f"{self.attainment:.0%} of requests within {', '.join(bounds)}")
        for column, bound in self.percentiles:
            metric, q, _ = column.split("_")
            parts.append(f"{metric} {q} <= {bound:g} s")
        if self.min_goodput:
            parts.append(f"goodput >= {self.min_goodput:g} req/s")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """The parsed spec: a trace file (or None with a synthetic workload), the shared flags,
    the axes in their order (flag name -> values), the SLO and the GPU-hour prices."""

    trace: Path | None
    flags: dict[str, Any]
    axes: dict[str, list[Any]]
    slo: Slo
    prices: dict[str, float]

    @property
    def num_points(self) -> int:
        return math.prod(len(v) for v in self.axes.values())


def flag_name(key: object, where: str) -> str:
    """A flag as the spec may write it (`--max-num-seqs`, `max_num_seqs`) in one spelling."""
    if not isinstance(key, str) or not key.strip("-_ "):
        raise ConfigError(f"{where}: {key!r} is not a flag name")
    return key.strip().lstrip("-").replace("_", "-")


def _mapping(raw: object, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping of flag to value")
    return raw


def _flags(raw: object, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in _mapping(raw, where).items():
        name = flag_name(key, where)
        if name in _OWNED:
            raise ConfigError(f"{where}: --{name} is the sweep's own (each point's outputs "
                              "go to the sweep's table)")  # fmt: skip
        if name in out:
            raise ConfigError(f"{where}: --{name} is given twice")
        if not isinstance(value, list):  # (an axis's list is checked value by value)
            _check_value(value, f"{where}: --{name}")
        out[name] = value
    return out


def _check_value(value: object, where: str) -> None:
    """A flag's value: a string, a finite number, a boolean, null, or JSON (a mapping or list)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a finite number")
    if not isinstance(value, str | int | float | bool | dict | list | None):
        raise ConfigError(f"{where}: {value!r} is not a flag's value")


def _axes(raw: object) -> dict[str, list[Any]]:
    axes: dict[str, list[Any]] = {}
    for name, values in _flags(raw, "axes").items():
        if name in _TRACE_SHAPING:
            raise ConfigError(f"axes: --{name} shapes the trace every point shares; set it "
                              "under flags")  # fmt: skip
        if not isinstance(values, list) or not values:
            raise ConfigError(f"axes: --{name} must be a non-empty list of values")
        for value in values:
            _check_value(value, f"axes: --{name}")
        if len(set(map(repr, values))) < len(values):
            raise ConfigError(f"axes: --{name} lists a value twice")
        axes[name] = values
    if not axes:
        raise ConfigError("axes: name at least one flag and its values")
    n = math.prod(len(v) for v in axes.values())
    if n > MAX_POINTS:
        raise ConfigError(f"axes: {n:,} points; at most {MAX_POINTS:,}")
    return axes


def _bound(raw: dict[str, Any], key: str, *, upper: float | None = None) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0 or (upper and value > upper):
        limit = f"in (0, {upper:g}]" if upper else "a finite number > 0"
        raise ConfigError(f"slo: {key} must be {limit}, got {value!r}")
    return float(value)


def _slo(raw: object) -> Slo:
    slo = _mapping(raw, "slo")
    percentiles = {f"{m}-{q}": f"{m}_{q}_s" for m in _SLO_BOUNDS for q in _PERCENTILES}
    unknown = sorted(set(map(str, slo)) - {*_SLO_BOUNDS, *percentiles, "attainment",
                                           "min-goodput"})  # fmt: skip
    if unknown:
        raise ConfigError(
            f"slo: unknown key {unknown[0]!r} (ttft, tpot, e2e: seconds per request; "
            "attainment: a share of requests; ttft-p90 and the like: seconds at a percentile "
            "(p50, p90, p99); min-goodput: requests/s)"
        )
    bounds = {k: _bound(slo, k) for k in _SLO_BOUNDS}
    at = tuple((column, b) for key, column in percentiles.items()
               if (b := _bound(slo, key)) is not None)  # fmt: skip
    if not any(bounds.values()) and not at:
        raise ConfigError("slo: give at least one bound: ttft, tpot, e2e (seconds per request) "
                          "or a percentile's (ttft-p90: seconds)")  # fmt: skip
    attainment = _bound(slo, "attainment", upper=1.0)
    return Slo(**bounds, attainment=0.9 if attainment is None else attainment,
               min_goodput=_bound(slo, "min-goodput") or 0.0, percentiles=at)  # fmt: skip


def _prices(raw: object) -> dict[str, float]:
    prices = {}
    for gpu, price in _mapping(raw, "gpu-hour-price").items():
        ok = isinstance(price, int | float) and not isinstance(price, bool)
        if not ok or not math.isfinite(price) or price < 0:
            raise ConfigError(f"gpu-hour-price: {gpu}: must be a number >= 0, got {price!r}")
        prices[str(gpu)] = float(price)
    return prices


class _Loader(yaml.SafeLoader):
    """Safe YAML without aliases: an alias of an alias of... is a few bytes that expand to
    more values than memory holds."""

    def fetch_alias(self) -> None:
        raise yaml.YAMLError("aliases (*name) are not allowed in a sweep spec")


def _read(where: Path, what: str) -> str:
    """A regular file's text, at most MAX_SPEC_BYTES of it (a device or FIFO never ends)."""
    if not where.is_file():
        raise ConfigError(f"{what} {where}: no such file")
    with where.open("rb") as f:
        data = f.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise ConfigError(f"{what} {where}: larger than {MAX_SPEC_BYTES >> 20} MiB")
    return data.decode("utf-8")


def load_spec(path: str | Path) -> SweepSpec:
    """The spec the file holds, checked; a ConfigError names what is wrong."""
    where = Path(path)
    try:
        raw = yaml.load(_read(where, "sweep spec"), Loader=_Loader)  # a SafeLoader
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"sweep spec {path}: cannot read it: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep spec {path}: must hold a mapping ({', '.join(_KEYS)})")
    unknown = sorted(set(map(str, raw)) - set(_KEYS))
    if unknown:
        raise ConfigError(f"sweep spec {path}: unknown key {unknown[0]!r} ({', '.join(_KEYS)})")
    flags = _flags(raw.get("flags"), "flags")
    trace = raw.get("trace")
    if (trace is None) == (raw.get("synthetic") is None):
        raise ConfigError("sweep spec: give a trace (a file) or synthetic (its flags), one of them")
    if trace is not None:
        if not isinstance(trace, str):
            raise ConfigError(f"trace: must be a file name, got {trace!r}")
        # Relative to the spec, so a spec and its trace travel together.
        trace_file = where.parent / Path(trace).expanduser()
        if not trace_file.is_file():  # (a device or FIFO would be hashed forever)
            raise ConfigError(f"trace: no such file: {trace_file}")
        trace_path: Path | None = trace_file
    else:
        trace_path = None
        synthetic = _flags(raw.get("synthetic"), "synthetic")
        for name in set(synthetic) & set(flags):
            raise ConfigError(f"synthetic: --{name} is also under flags")
        flags = {"synthetic": True, **synthetic, **flags}
    axes = _axes(raw.get("axes"))
    for name in set(axes) & set(flags):
        raise ConfigError(f"axes: --{name} is also under flags (a point takes the axis value)")
    return SweepSpec(trace_path, flags, axes, _slo(raw.get("slo")),
                     _prices(raw.get("gpu-hour-price")))  # fmt: skip
