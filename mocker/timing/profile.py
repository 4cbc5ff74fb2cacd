"""Interpolation over a measured latency profile in Dynamo's NPZ layout (`--timing-profile`)."""

from __future__ import annotations

import bisect
from itertools import pairwise
from pathlib import Path

import numpy as np

from mocker.errors import ConfigError
from mocker.timing.shape import PassShape

__all__ = ["ProfileTiming"]


def _interp_weights(axis: list[float], x: float) -> tuple[int, int, float]:
    """Indices and weight for linear interpolation on a sorted axis, clamped at the ends."""
    if x <= axis[0] or len(axis) == 1:
        return 0, 0, 0.0
    if x >= axis[-1]:
        last = len(axis) - 1
        return last, last, 0.0
    hi = bisect.bisect_right(axis, x)
    lo = hi - 1
    return lo, hi, (x - axis[lo]) / (axis[hi] - axis[lo])


class ProfileTiming:
    """Interpolation over a measured profile in Dynamo's NPZ layout.

    Prefill: TTFT over new tokens (1-D linear). Decode: ITL over
    (active KV tokens, context length = active KV tokens / decodes), bilinear.
    Outside the measured range the nearest edge value is used (no extrapolation).
    """

    __slots__ = ("_ctx", "_isl", "_itl", "_kv", "_ttft")

    reads_context = False

    def __init__(
        self,
        prefill_isl: np.ndarray,
        prefill_ttft_ms: np.ndarray,
        decode_active_kv_tokens: np.ndarray,
        decode_context_length: np.ndarray,
        decode_itl: np.ndarray,
    ) -> None:
        self._isl = [float(v) for v in np.asarray(prefill_isl, dtype=float).ravel()]
        self._ttft = [float(v) for v in np.asarray(prefill_ttft_ms, dtype=float).ravel()]
        self._kv = [float(v) for v in np.asarray(decode_active_kv_tokens, dtype=float).ravel()]
        self._ctx = [float(v) for v in np.asarray(decode_context_length, dtype=float).ravel()]
        itl = np.asarray(decode_itl, dtype=float)
        if len(self._isl) == 0 or len(self._isl) != len(self._ttft):
            raise ConfigError(
                "timing profile: prefill_isl and prefill_ttft_ms must be non-empty "
                "and of equal length"
            )
        if itl.shape != (len(self._kv), len(self._ctx)) or itl.size == 0:
            raise ConfigError(
                f"timing profile: decode_itl has shape {itl.shape}, expected "
                f"(len(decode_active_kv_tokens), len(decode_context_length)) = "
                f"({len(self._kv)}, {len(self._ctx)})"
            )
        for name, axis in (
            ("prefill_isl", self._isl),
            ("decode_active_kv_tokens", self._kv),
            ("decode_context_length", self._ctx),
        ):
            if any(b <= a for a, b in pairwise(axis)):
                raise ConfigError(f"timing profile: {name} must be strictly increasing")
        if not (np.isfinite(itl).all() and all(np.isfinite(self._ttft))):
            raise ConfigError("timing profile: latencies must be finite numbers")
        self._itl = itl.tolist()

    @classmethod
    def from_npz(cls, path: str | Path) -> ProfileTiming:
        try:
            data = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"invalid timing_profile={str(path)!r}: cannot read NPZ: {exc}"
            ) from exc
        keys = (
            "prefill_isl",
            "prefill_ttft_ms",
            "decode_active_kv_tokens",
            "decode_context_length",
            "decode_itl",
        )
        missing = [k for k in keys if k not in data]
        if missing:
            raise ConfigError(
                f"invalid timing_profile={str(path)!r}: missing key(s) {', '.join(missing)}"
            )
        return cls(*(data[k] for k in keys))

    def prefill_ms(self, new_tokens: int) -> float:
        if new_tokens <= 0:
            return 0.0
        lo, hi, w = _interp_weights(self._isl, float(new_tokens))
        return self._ttft[lo] * (1.0 - w) + self._ttft[hi] * w

    def decode_ms(self, active_kv_tokens: int, total_kv_tokens: int, num_decodes: int) -> float:
        if num_decodes <= 0:
            return 0.0
        kv = float(active_kv_tokens)
        i0, i1, wi = _interp_weights(self._kv, kv)
        j0, j1, wj = _interp_weights(self._ctx, kv / num_decodes)
        g = self._itl
        top = g[i0][j0] * (1.0 - wj) + g[i0][j1] * wj
        bottom = g[i1][j0] * (1.0 - wj) + g[i1][j1] * wj
        itl: float = top * (1.0 - wi) + bottom * wi
        return max(0.0, itl)

    def pass_ms(self, shape: PassShape) -> float:
        return self.prefill_ms(shape.prefill_tokens) + self.decode_ms(
            shape.active_kv_tokens, shape.total_kv_tokens, shape.num_decodes
        )
