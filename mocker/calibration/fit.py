"""Fit a correction profile to measurements: the decode and prefill scales, the fixed cost per pass
and the cost per request in a pass that bring the replayed closed loops' mean TTFT and TPOT
closest to the measured ones."""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

from mocker.calibration.closed_loop import Prediction, engine_config_for, predict
from mocker.calibration.measurements import Measurement
from mocker.calibration.stats import error_summary
from mocker.timing import CorrectedTiming, Correction, TimingModel, load_timing_model
from mocker.timing.correction import OVERHEAD_RANGE_MS, REQUEST_RANGE_MS, SCALE_RANGE

__all__ = ["FitResult", "base_timing", "fit_correction"]

# Levenberg-Marquardt steps on the log errors (each costs five replays of every measurement).
MAX_STEPS = 6
# Finite-difference steps: a 4% change of a scale, 0.5 ms a pass, 0.01 ms a request.
_DELTAS = (math.log(1.04), math.log(1.04), 0.5, 0.01)
# The Cauchy loss's scale: log errors well beyond it weigh little, so a row the engine cannot
# reproduce (a measured queue the replay does not build, a harness that differs) does not
# pull the others off.
_ROBUST = 0.1


def _cost(r: np.ndarray) -> float:
    """The robust (Cauchy) loss of the log errors."""
    return float(np.sum(_ROBUST**2 * np.log1p((r / _ROBUST) ** 2)))


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted correction, and the errors before and after it."""

    correction: Correction
    before: dict[str, float | int]
    after: dict[str, float | int]
    predictions: list[tuple[Prediction, Prediction]]  # (before, after) per measurement


def base_timing(m: Measurement) -> tuple[TimingModel, Correction]:
    """The uncorrected model a measurement's engine times passes with, and the correction the
    engine applies to it by default (none: the neutral one)."""
    model = load_timing_model(engine_config_for(m).timing)
    if isinstance(model, CorrectedTiming):
        return model.base, model.correction
    return model, Correction()


def _params(c: Correction) -> np.ndarray:
    return np.array([math.log(c.decode_scale), math.log(c.prefill_scale), c.overhead_ms,
                     c.request_ms])  # fmt: skip


def _clip(value: float, bounds: tuple[float, float]) -> float:
    return float(min(bounds[1], max(bounds[0], value)))


def _correction(p: np.ndarray) -> Correction:
    return Correction(
        decode_scale=_clip(math.exp(p[0]), SCALE_RANGE),
        prefill_scale=_clip(math.exp(p[1]), SCALE_RANGE),
        overhead_ms=_clip(p[2], OVERHEAD_RANGE_MS),
        request_ms=_clip(p[3], REQUEST_RANGE_MS),
    )


def _summary(ms: Sequence[Measurement], ps: Sequence[Prediction]) -> dict[str, float | int]:
    return error_summary([p.ttft_ms for p in ps], [m.ttft_ms for m in ms],
                         [p.tpot_ms for p in ps], [m.tpot_ms for m in ms])  # fmt: skip


def _predict_corrected(job: tuple[Measurement, Correction]) -> Prediction:
    """One closed loop under a correction of its base model (a pool worker's task)."""
    m, correction = job
    return predict(m, engine_config_for(m), CorrectedTiming(base_timing(m)[0], correction))


def fit_correction(
    measurements: Sequence[Measurement],
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    start: Correction | None = None,
) -> FitResult:
    """Robust (Cauchy) least squares on log(predicted / measured) of every measurement's mean
    TTFT and TPOT, by Levenberg-Marquardt with a numeric Jacobian (each probe a replay of every
    closed loop, in `jobs` processes), from `start` (default: the correction the engine
    applies by default)."""
    rows = list(measurements)
    measured = np.log([[m.ttft_ms, m.tpot_ms] for m in rows]).ravel()
    pool: Executor | None = None
    if jobs > 1 and len(rows) > 1:
        # Spawned, not forked: the timing library's threads are running in this process.
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))

    def run(c: Correction) -> list[Prediction]:
        tasks = [(m, c) for m in rows]
        if pool is None:
            return [_predict_corrected(t) for t in tasks]
        return list(pool.map(_predict_corrected, tasks))

    def residuals(ps: list[Prediction]) -> np.ndarray:
        logs = np.log([[max(p.ttft_ms, 1e-6), max(p.tpot_ms, 1e-6)] for p in ps]).ravel()
        return logs - measured

    try:
        if start is None:
            start = replace(base_timing(rows[0])[1], deployment="", fit={})
        first = run(start)
        current, preds, r = start, first, residuals(first)
        damping = 1e-2
        for step in range(MAX_STEPS):
            # Iteratively reweighted: the loss's weights at the current errors.
            w = np.sqrt(1.0 / (1.0 + (r / _ROBUST) ** 2))
            p0 = _params(current)
            jac = np.empty((r.size, p0.size))
            for k, delta in enumerate(_DELTAS):
                probe = p0.copy()
                probe[k] += delta
                jac[:, k] = (residuals(run(_correction(probe))) - r) / delta
            wj, wr = jac * w[:, None], r * w
            jtj, grad = wj.T @ wj, wj.T @ wr
            improved = False
            for _ in range(4):  # damped more until the step helps
                move = np.linalg.solve(jtj + damping * np.diag(np.diag(jtj) + 1e-9), -grad)
                trial = _correction(p0 + move)
                trial_preds = run(trial)
                trial_r = residuals(trial_preds)
                if _cost(trial_r) < _cost(r) - 1e-9:
                    improved = True
                    damping = max(damping / 10, 1e-4)
                    break
                damping *= 10
            if progress is not None:
                reached = _cost(trial_r if improved else r)
                progress(f"step {step + 1}: robust log error {_cost(r):.5f} -> {reached:.5f}")
            if not improved:
                break
            gain = 1.0 - _cost(trial_r) / max(_cost(r), 1e-12)
            current, preds, r = trial, trial_preds, trial_r
            if gain < 1e-3:  # converged: another step would cost replays for nothing
                break
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    before, after = _summary(rows, first), _summary(rows, preds)
    fitted = replace(current, fit={"rows": len(rows), "before": before, "after": after})
    return FitResult(fitted, before, after, list(zip(first, preds, strict=True)))
