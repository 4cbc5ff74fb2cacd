"""Fidelity against measured serving runs: the measurements, their closed loops replayed, the
errors, and corrections fitted to them (`mocker calibrate`)."""

from mocker.calibration.closed_loop import Prediction, engine_config_for, predict
from mocker.calibration.measurements import Measurement, load_measurements, silicon_rows
from mocker.calibration.stats import ape, error_summary, spearman

__all__ = [
    "Measurement",
    "Prediction",
    "ape",
    "engine_config_for",
    "error_summary",
    "load_measurements",
    "predict",
    "silicon_rows",
    "spearman",
]
