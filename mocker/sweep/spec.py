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


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-request bounds (seconds; None: unbounded), the share of requests that must meet
    every bound at once (vLLM bench's goodput rule), and a least goodput (requests/s)."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    attainment: float = 0.9
    min_goodput: float = 0.0

    def describe(self) -> str:
        bounds = [f"{n} <= {getattr(self, n):g} s" for n in _SLO_BOUNDS if getattr(self, n)]
        text = f"{self.attainment:.0%} of requests within {', '.join(bounds)}"
        return text + (f", goodput >= {self.min_goodput:g} req/s" if self.min_goodput else "")


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
        out[name] = value
    return out


def _axes(raw: object) -> dict[str, list[Any]]:
    axes: dict[str, list[Any]] = {}
    for name, values in _flags(raw, "axes").items():
        if name in _TRACE_SHAPING:
            raise ConfigError(f"axes: --{name} shapes the trace every point shares; set it "
                              "under flags")  # fmt: skip
        if not isinstance(values, list) or not values:
            raise ConfigError(f"axes: --{name} must be a non-empty list of values")
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
    unknown = sorted(set(slo) - {*_SLO_BOUNDS, "attainment", "min-goodput"})
    if unknown:
        raise ConfigError(f"slo: unknown key {unknown[0]!r} (ttft, tpot, e2e: seconds; "
                          "attainment: a share of requests; min-goodput: requests/s)")  # fmt: skip
    bounds = {k: _bound(slo, k) for k in _SLO_BOUNDS}
    if not any(bounds.values()):
        raise ConfigError("slo: give at least one of ttft, tpot, e2e (seconds per request)")
    attainment = _bound(slo, "attainment", upper=1.0)
    return Slo(**bounds, attainment=0.9 if attainment is None else attainment,
               min_goodput=_bound(slo, "min-goodput") or 0.0)  # fmt: skip


def _prices(raw: object) -> dict[str, float]:
    prices = {}
    for gpu, price in _mapping(raw, "gpu-hour-price").items():
        ok = isinstance(price, int | float) and not isinstance(price, bool)
        if not ok or not math.isfinite(price) or price < 0:
            raise ConfigError(f"gpu-hour-price: {gpu}: must be a number >= 0, got {price!r}")
        prices[str(gpu)] = float(price)
    return prices


def load_spec(path: str | Path) -> SweepSpec:
    """The spec the file holds, checked; a ConfigError names what is wrong."""
    where = Path(path)
    try:
        if where.stat().st_size > MAX_SPEC_BYTES:
            raise ConfigError(f"sweep spec {path}: larger than {MAX_SPEC_BYTES >> 20} MiB")
        raw = yaml.safe_load(where.read_text(encoding="utf-8"))
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
        trace_path: Path | None = where.parent / Path(trace).expanduser()
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
