"""The fit recovers a correction it did not know: measurements made by the engine itself under a
known correction, fitted from the uncorrected model."""

from __future__ import annotations

import dataclasses

import pytest

from mocker.calibration import Measurement, engine_config_for, predict
from mocker.calibration.fit import fit_correction
from mocker.timing import CorrectedTiming, Correction, load_timing_model


def test_a_known_correction_is_recovered() -> None:
    truth = Correction(decode_scale=1.25, prefill_scale=0.85, overhead_ms=0.6)
    shapes = [(2, 512, 32), (4, 256, 48), (8, 1024, 16), (3, 2048, 24)]
    rows = []
    for c, isl, osl in shapes:
        m = Measurement("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm", 1, c, isl, osl,
                        1.0, 1.0, num_prompts=3 * c)  # fmt: skip
        config = engine_config_for(m)
        p = predict(m, config, CorrectedTiming(load_timing_model(config.timing), truth))
        rows.append(dataclasses.replace(m, ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms))
    result = fit_correction(rows)
    c = result.correction
    assert c.decode_scale == pytest.approx(1.25, rel=0.05)
    assert c.prefill_scale == pytest.approx(0.85, rel=0.05)
    assert c.overhead_ms == pytest.approx(0.6, abs=0.3)
    assert result.after["tpot_mean_ape"] < 0.01 < result.before["tpot_mean_ape"]
    assert result.after["ttft_mean_ape"] < 0.02 < result.before["ttft_mean_ape"]
    assert c.fit["rows"] == 4
