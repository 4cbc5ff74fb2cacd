"""The fit recovers a correction it did not know: measurements made by the engine itself under a
known correction, fitted from the uncorrected model."""

from __future__ import annotations

import dataclasses

import pytest

from mocker.calibration import Measurement, engine_config_for, predict
from mocker.calibration.fit import base_timing, fit_correction
from mocker.timing import CorrectedTiming, Correction
from mocker.timing.serving import SERVING

TRUTH = Correction(decode_scale=1.25, prefill_scale=0.85, overhead_ms=0.6, request_ms=0.05)
# Users, prompt and output tokens: concurrency varies the requests a pass holds.
SHAPES = [(2, 512, 32), (4, 256, 48), (8, 1024, 16), (3, 2048, 24), (16, 128, 32)]


def _measured(truth: Correction) -> list[Measurement]:
    rows = []
    for c, isl, osl in SHAPES:
        m = Measurement("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm", 1, c, isl, osl,
                        1.0, 1.0, num_prompts=3 * c)  # fmt: skip
        p = predict(m, engine_config_for(m), CorrectedTiming(base_timing(m)[0], truth))
        rows.append(dataclasses.replace(m, ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms))
    return rows


def test_a_known_correction_is_recovered() -> None:
    rows = _measured(TRUTH)
    assert base_timing(rows[0])[1] is SERVING  # the fit starts where the engine stands
    result = fit_correction(rows, jobs=2)
    c = result.correction
    assert c.decode_scale == pytest.approx(1.25, rel=0.05)
    assert c.prefill_scale == pytest.approx(0.85, rel=0.05)
    assert c.overhead_ms == pytest.approx(0.6, abs=0.3)
    assert c.request_ms == pytest.approx(0.05, abs=0.02)
    assert result.after["tpot_mean_ape"] < 0.01 < result.before["tpot_mean_ape"]
    assert result.after["ttft_mean_ape"] < 0.02 < result.before["ttft_mean_ape"]
    assert c.fit["rows"] == len(SHAPES)


def test_one_row_that_cannot_be_reproduced_does_not_pull_the_rest() -> None:
    rows = _measured(TRUTH)
    # A queue the replay cannot build: one row's TTFT measured ten times over.
    rows[0] = dataclasses.replace(rows[0], ttft_ms=10 * rows[0].ttft_ms)
    c = fit_correction(rows, jobs=1).correction
    assert c.decode_scale == pytest.approx(1.25, rel=0.08)
    assert c.prefill_scale == pytest.approx(0.85, rel=0.08)
