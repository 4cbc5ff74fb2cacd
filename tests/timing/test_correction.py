"""Correction profiles: the arithmetic on a pass, the file's format and its errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mocker.errors import ConfigError
from mocker.timing import (
    CorrectedTiming,
    Correction,
    PassShape,
    PolynomialTiming,
    TimingSpec,
    load_correction,
    load_timing_model,
)


class Parts:
    """A model whose prefill and decode parts are known: 10 ms a prefill token (0.01 here),
    1 ms a decode, added."""

    reads_context = True

    def pass_ms(self, shape: PassShape) -> float:
        return 0.01 * shape.prefill_tokens + 1.0 * shape.num_decodes

    def prefill_ms(self, new_tokens: int) -> float:
        return 0.01 * new_tokens


def test_each_part_is_scaled_and_the_fixed_cost_added() -> None:
    timing = CorrectedTiming(Parts(), Correction(decode_scale=1.5, prefill_scale=2.0,
                                                 overhead_ms=0.25))  # fmt: skip
    assert timing.pass_ms(PassShape(0, 0, 0, 4, 100, 0, 0)) == 1.5 * 4 + 0.25
    assert timing.pass_ms(PassShape(1000, 1, 0, 0, 0, 0, 0)) == 2.0 * 10 + 0.25
    assert timing.pass_ms(PassShape(1000, 1, 0, 4, 100, 0, 0)) == 1.5 * 4 + 2.0 * 10 + 0.25
    assert timing.pass_ms(PassShape(0, 0, 0, 0, 0, 0, 0)) == 0.0  # no pass, no cost
    assert timing.prefill_ms(500) == 2.0 * 5 and timing.prefill_ms(0) == 0.0
    assert timing.reads_context


def test_each_request_in_a_pass_costs_its_share() -> None:
    timing = CorrectedTiming(Parts(), Correction(overhead_ms=0.25, request_ms=0.5))
    assert timing.pass_ms(PassShape(0, 0, 0, 4, 100, 0, 0)) == 4 + 0.25 + 0.5 * 4
    assert timing.pass_ms(PassShape(1000, 2, 0, 0, 0, 0, 0)) == 10 + 0.25 + 0.5 * 2
    assert timing.pass_ms(PassShape(1000, 1, 0, 4, 100, 0, 0)) == 4 + 10 + 0.25 + 0.5 * 5
    assert timing.decode_span(4, 100) == (4 + 0.25 + 0.5 * 4, 1)
    assert timing.prefill_ms(500) == 5  # (inside a pass that runs anyway: no fixed costs)
    assert timing.pass_ms(PassShape(0, 0, 0, 0, 0, 0, 0)) == 0.0


def test_a_profile_round_trips_and_loads_through_timing_profile(tmp_path: Path) -> None:
    c = Correction(1.1, 0.9, 0.5, 0.02, deployment="x",
                   fit={"rows": 3, "after": {"rho": math.nan}})  # fmt: skip
    path = tmp_path / "c.json"
    path.write_text(c.to_json())
    raw = json.loads(path.read_text())  # strict JSON: no NaN
    assert raw["format"] == "mocker-timing-correction/1" and raw["fit"]["after"]["rho"] is None
    assert load_correction(path).decode_scale == 1.1 and load_correction(path).request_ms == 0.02
    model = load_timing_model(TimingSpec.with_profile("polynomial", None, str(path)))
    assert isinstance(model, CorrectedTiming) and isinstance(model.base, PolynomialTiming)
    shape = PassShape(100, 1, 0, 0, 0, 0, 1000)
    assert model.pass_ms(shape) == pytest.approx(0.9 * PolynomialTiming().pass_ms(shape) + 0.52)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read it"),
        ('{"decode_scale": 1}', "not a correction profile"),
        ('{"format": "mocker-timing-correction/1", "speed": 2}', r"unknown key\(s\) \['speed'\]"),
        ('{"format": "mocker-timing-correction/1", "decode_scale": 50}', r"decode_scale=50"),
        ('{"format": "mocker-timing-correction/1", "overhead_ms": "1"}', "must be a number"),
        ('{"format": "mocker-timing-correction/1", "request_ms": -0.1}', r"request_ms=-0.1"),
    ],
)
def test_a_bad_profile_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_correction(path)
