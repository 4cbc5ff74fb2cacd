"""Dynamo's polynomial (exact values) and the speedup's scaling of a pass."""

import math

import pytest

from mocker.timing import (
    PassShape,
    PolynomialTiming,
    TimingSpec,
    load_timing_model,
    pass_duration_s,
)


def test_prefill_polynomial_exact() -> None:
    m = PolynomialTiming()
    assert m.prefill_ms(0) == 0.0
    assert m.prefill_ms(1) == pytest.approx(4.209989e-7 + 1.518344e-2 + 16.50142)
    assert m.prefill_ms(1000) == pytest.approx(0.4209989 + 15.18344 + 16.50142)
    assert m.prefill_ms(8192) == pytest.approx(
        4.209989e-7 * 8192**2 + 1.518344e-2 * 8192 + 16.50142
    )


def test_decode_polynomial_exact_and_floor() -> None:
    m = PolynomialTiming()
    assert m.decode_ms(0, 1000, 1) == pytest.approx(5.74)
    assert m.decode_ms(500, 1000, 3) == pytest.approx(-25.74 * 0.25 + 54.01 * 0.5 + 5.74)
    assert m.decode_ms(1000, 1000, 1) == pytest.approx(-25.74 + 54.01 + 5.74)
    assert m.decode_ms(10, 1000, 0) == 0.0  # no decode, no decode term


def test_decode_floor_is_one_ms() -> None:
    # u > ~2.2 would go negative; the floor holds the model at 1 ms.
    assert PolynomialTiming().decode_ms(3000, 1000, 1) == 1.0


def test_pass_duration_sums_parts_and_divides_by_speedup() -> None:
    m = PolynomialTiming()
    shape = PassShape(
        prefill_tokens=512, prefill_requests=2, prefill_context=100, num_decodes=10,
        decode_context=20_000, active_kv_tokens=2048, total_kv_tokens=8192,
    )  # fmt: skip
    ms = m.prefill_ms(512) + m.decode_ms(2048, 8192, 10)
    assert pass_duration_s(m, shape, 1.0) == pytest.approx(ms / 1000)
    assert pass_duration_s(m, shape, 10.0) == pytest.approx(ms / 10000)
    prefill_only = PassShape(512, 1, 0, 0, 0, 2048, 8192)
    assert pass_duration_s(m, prefill_only, 1.0) == pytest.approx(m.prefill_ms(512) / 1000)
    # The context counts are not the polynomial's: it reads blocks in use only.
    assert m.pass_ms(shape._replace(decode_context=1, prefill_context=5000)) == m.pass_ms(shape)
    assert not m.reads_context


def test_default_spec_is_the_polynomial() -> None:
    model = load_timing_model(TimingSpec())
    assert isinstance(model, PolynomialTiming) and load_timing_model(TimingSpec()) is model
    assert math.isclose(model.prefill_ms(1), PolynomialTiming().prefill_ms(1))
