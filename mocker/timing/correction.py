"""A correction profile (`mocker calibrate` writes it, `--timing-profile FILE.json` loads it):
scales, a fixed cost per pass and a cost per request in it, on top of any timing model."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mocker.errors import ConfigError
from mocker.jsonfile import read_json_object
from mocker.timing.shape import PassShape, TimingModel

__all__ = ["FORMAT", "CorrectedTiming", "Correction", "load_correction"]

FORMAT = "mocker-timing-correction/1"
# The ranges a fit may choose from (a wider one means the base model is not this GPU's).
SCALE_RANGE = (0.2, 5.0)
OVERHEAD_RANGE_MS = (0.0, 100.0)
REQUEST_RANGE_MS = (0.0, 5.0)


@dataclass(frozen=True, slots=True)
class Correction:
    """t' = decode_scale × (the pass's decode part) + prefill_scale × (the rest) + overhead
    + request_ms × (requests in the pass): the decode part is the pass's time with its prefill
    chunks left out; the per-request cost is the host's work for each (inputs, sampling,
    outputs), which kernel timings leave out."""

    decode_scale: float = 1.0
    prefill_scale: float = 1.0
    overhead_ms: float = 0.0
    request_ms: float = 0.0
    deployment: str = ""  # what it was fitted for (informational)
    fit: dict[str, Any] = field(default_factory=dict)  # the fit's report

    def __post_init__(self) -> None:
        for name, (lo, hi) in (("decode_scale", SCALE_RANGE), ("prefill_scale", SCALE_RANGE),
                               ("overhead_ms", OVERHEAD_RANGE_MS),
                               ("request_ms", REQUEST_RANGE_MS)):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"timing correction: {name} must be a number, got {value!r}")
            if not (math.isfinite(value) and lo <= value <= hi):
                raise ConfigError(f"timing correction: {name}={value!r} must be in [{lo}, {hi}]")

    def to_json(self) -> str:
        return json.dumps(_finite({"format": FORMAT, **asdict(self)}), indent=2) + "\n"


def load_correction(path: str | Path) -> Correction:
    """A correction profile from its JSON file (a ConfigError naming the file otherwise)."""
    raw = read_json_object(path, f"invalid timing_profile={str(path)!r}")
    if raw.get("format") != FORMAT:
        raise ConfigError(
            f"invalid timing_profile={str(path)!r}: not a correction profile (format "
            f"{FORMAT!r}, as `mocker calibrate` writes)"
        )
    known = {"decode_scale", "prefill_scale", "overhead_ms", "request_ms", "deployment", "fit"}
    unknown = sorted(set(raw) - known - {"format"})
    if unknown:
        raise ConfigError(f"invalid timing_profile={str(path)!r}: unknown key(s) {unknown}")
    try:
        return Correction(**{k: raw[k] for k in known if k in raw})
    except TypeError as exc:
        raise ConfigError(f"invalid timing_profile={str(path)!r}: {exc}") from None


class CorrectedTiming:
    """A timing model with a correction applied to every pass."""

    def __init__(self, base: TimingModel, correction: Correction) -> None:
        self.base = base
        self.correction = correction
        self.reads_context = base.reads_context
        self._decode = correction.decode_scale
        self._prefill = correction.prefill_scale
        self._overhead = correction.overhead_ms
        self._request = correction.request_ms

    def pass_ms(self, shape: PassShape) -> float:
        base = self.base.pass_ms(shape)
        if base <= 0.0:
            return 0.0
        fixed = self._overhead + self._request * (shape.num_decodes + shape.prefill_requests)
        if not shape.prefill_tokens:
            return self._decode * base + fixed
        if not shape.num_decodes:
            return self._prefill * base + fixed
        decode = self.base.pass_ms(shape._replace(prefill_tokens=0, prefill_requests=0,
                                                  prefill_context=0))  # fmt: skip
        prefill = max(0.0, base - decode)
        return self._decode * decode + self._prefill * prefill + fixed

    def decode_span(self, n: int, context: int) -> tuple[float, int]:
        """`pass_ms` of decodes only, and how long the base model keeps it (its own
        `decode_span`, else one pass)."""
        span_of = getattr(self.base, "decode_span", None)
        if span_of is None:
            return self.pass_ms(PassShape(0, 0, 0, n, context, 0, 0)), 1
        base, span = span_of(n, context)
        if base <= 0.0:
            return 0.0, span
        return self._decode * base + self._overhead + self._request * n, span

    def prefill_ms(self, new_tokens: int) -> float:
        """What computing these tokens adds to a pass that runs anyway (what recomputing
        blocks instead of loading them costs): the prefill part, scaled; no pass, no request
        of its own."""
        return self._prefill * self.base.prefill_ms(new_tokens)


def _finite(value: Any) -> Any:
    """JSON has no NaN: a figure that could not be computed is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
