"""Fit a correction profile to measurements: the decode and prefill scales and the fixed cost per
pass that bring the replayed closed loops' mean TTFT and TPOT closest to the measured ones."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from mocker.calibration.closed_loop import Prediction, engine_config_for, predict
from mocker.calibration.measurements import Measurement
from mocker.calibration.stats import error_summary
from mocker.config import EngineConfig
from mocker.timing import CorrectedTiming, Correction, load_timing_model
from mocker.timing.correction import OVERHEAD_RANGE_MS, SCALE_RANGE

__all__ = ["FitResult", "fit_correction"]

# Gauss-Newton steps on the log errors (each costs four replays of every measurement).
MAX_STEPS = 6
# Finite-difference steps: a 4% change of a scale, 0.5 ms of fixed cost.
_DELTAS = (math.log(1.04), math.log(1.04), 0.5)


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted correction, and the errors before and after it."""

    correction: Correction
    before: dict[str, float | int]
    after: dict[str, float | int]
    predictions: list[tuple[Prediction, Prediction]]  # (before, after) per measurement


def _params(c: Correction) -> np.ndarray:
    return np.array([math.log(c.decode_scale), math.log(c.prefill_scale), c.overhead_ms])


def _correction(p: np.ndarray) -> Correction:
    lo, hi = SCALE_RANGE
    olo, ohi = OVERHEAD_RANGE_MS
    return Correction(
        decode_scale=float(min(hi, max(lo, math.exp(p[0])))),
        prefill_scale=float(min(hi, max(lo, math.exp(p[1])))),
        overhead_ms=float(min(ohi, max(olo, p[2]))),
    )


def _summary(ms: Sequence[Measurement], ps: Sequence[Prediction]) -> dict[str, float | int]:
    return error_summary([p.ttft_ms for p in ps], [m.ttft_ms for m in ms],
                         [p.tpot_ms for p in ps], [m.tpot_ms for m in ms])  # fmt: skip


def fit_correction(
    measurements: Sequence[Measurement],
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Least squares on log(predicted / measured) of every measurement's mean TTFT and TPOT,
    by Gauss-Newton with a numeric Jacobian (each probe a replay of every closed loop)."""
    configs: list[EngineConfig] = [engine_config_for(m) for m in measurements]
    bases = [load_timing_model(c.timing) for c in configs]
    measured = np.log([[m.ttft_ms, m.tpot_ms] for m in measurements]).ravel()

    def run(c: Correction) -> list[Prediction]:
        return [predict(m, cfg, CorrectedTiming(base, c))
                for m, cfg, base in zip(measurements, configs, bases, strict=True)]  # fmt: skip

    def residuals(ps: list[Prediction]) -> np.ndarray:
        logs = np.log([[max(p.ttft_ms, 1e-6), max(p.tpot_ms, 1e-6)] for p in ps]).ravel()
        return logs - measured

    current = Correction()
    first = run(current)
    preds, r = first, residuals(first)
    damping = 1e-2
    for step in range(MAX_STEPS):
        p0 = _params(current)
        jac = np.empty((r.size, 3))
        for k, delta in enumerate(_DELTAS):
            probe = p0.copy()
            probe[k] += delta
            jac[:, k] = (residuals(run(_correction(probe))) - r) / delta
        # Levenberg-Marquardt: a damped Gauss-Newton step, damped more until it helps.
        jtj, grad = jac.T @ jac, jac.T @ r
        improved = False
        for _ in range(4):
            move = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-9), -grad)
            trial = _correction(p0 + move)
            trial_preds = run(trial)
            trial_r = residuals(trial_preds)
            if trial_r @ trial_r < r @ r - 1e-6:
                improved = True
                damping = max(damping / 10, 1e-4)
                break
            damping *= 10
        if progress is not None:
            progress(f"step {step + 1}: squared log error {float(r @ r):.4f} -> "
                     f"{float(trial_r @ trial_r if improved else r @ r):.4f}")  # fmt: skip
        if not improved:
            break
        current, preds, r = trial, trial_preds, trial_r
    before, after = _summary(measurements, first), _summary(measurements, preds)
    fitted = replace(current, fit={"rows": len(measurements), "before": before, "after": after})
    return FitResult(fitted, before, after, list(zip(first, preds, strict=True)))
