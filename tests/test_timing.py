"""Timing formulas (exact values), profile interpolation and speedup scaling."""

import math

import numpy as np
import pytest

from mocker.config import ConfigError
from mocker.timing import (
    PassShape,
    PolynomialTiming,
    ProfileTiming,
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
        prefill_tokens=512, num_decodes=10, active_kv_tokens=2048, total_kv_tokens=8192
    )
    ms = m.prefill_ms(512) + m.decode_ms(2048, 8192, 10)
    assert pass_duration_s(m, shape, 1.0) == pytest.approx(ms / 1000)
    assert pass_duration_s(m, shape, 10.0) == pytest.approx(ms / 10000)
    prefill_only = PassShape(512, 0, 2048, 8192)
    assert pass_duration_s(m, prefill_only, 1.0) == pytest.approx(m.prefill_ms(512) / 1000)


def _profile() -> ProfileTiming:
    return ProfileTiming(
        prefill_isl=np.array([100, 1000]),
        prefill_ttft_ms=np.array([10.0, 100.0]),
        decode_active_kv_tokens=np.array([0, 1000]),
        decode_context_length=np.array([100, 200]),
        decode_itl=np.array([[5.0, 7.0], [9.0, 15.0]]),
    )


def test_profile_prefill_linear_and_clamped() -> None:
    p = _profile()
    assert p.prefill_ms(0) == 0.0
    assert p.prefill_ms(550) == pytest.approx(55.0)
    assert p.prefill_ms(50) == pytest.approx(10.0)  # below the table: first value
    assert p.prefill_ms(5000) == pytest.approx(100.0)  # above: last value


def test_profile_decode_bilinear() -> None:
    p = _profile()
    # kv=500 (halfway), context = 500/3 ≈ 166.7 → wj = 2/3
    wj = (500 / 3 - 100) / 100
    top = 5 + (7 - 5) * wj
    bottom = 9 + (15 - 9) * wj
    assert p.decode_ms(500, 10_000, 3) == pytest.approx((top + bottom) / 2)
    assert p.decode_ms(1000, 10_000, 5) == pytest.approx(15.0)  # corner (1000, 200)
    assert p.decode_ms(0, 10_000, 0) == 0.0


def test_profile_npz_roundtrip(tmp_path) -> None:
    path = tmp_path / "profile.npz"
    np.savez(
        path,
        prefill_isl=np.array([100, 1000]),
        prefill_ttft_ms=np.array([10.0, 100.0]),
        decode_active_kv_tokens=np.array([0, 1000]),
        decode_context_length=np.array([100, 200]),
        decode_itl=np.array([[5.0, 7.0], [9.0, 15.0]]),
    )
    model = load_timing_model(str(path))
    assert isinstance(model, ProfileTiming)
    assert model.prefill_ms(550) == pytest.approx(55.0)


def test_profile_errors_name_the_problem(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_timing_model(str(tmp_path / "missing.npz"))
    bad = tmp_path / "bad.npz"
    np.savez(bad, prefill_isl=np.array([1, 2]))
    with pytest.raises(ConfigError, match="missing key"):
        load_timing_model(str(bad))
    with pytest.raises(ConfigError, match="decode_itl has shape"):
        ProfileTiming(
            np.array([1]), np.array([1.0]), np.array([0, 1]), np.array([1]), np.array([[1.0, 2.0]])
        )
    with pytest.raises(ConfigError, match="strictly increasing"):
        ProfileTiming(
            np.array([2, 1]), np.array([1.0, 2.0]), np.array([0]), np.array([1]), np.array([[1.0]])
        )
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match="cannot read NPZ"):
        load_timing_model(str(garbage))


def test_default_model_is_polynomial() -> None:
    assert isinstance(load_timing_model(None), PolynomialTiming)
    assert math.isclose(load_timing_model(None).prefill_ms(1), PolynomialTiming().prefill_ms(1))
