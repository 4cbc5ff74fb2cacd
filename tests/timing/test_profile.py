"""Interpolation over a measured profile in Dynamo's NPZ layout, and its loading errors."""

from pathlib import Path

import numpy as np
import pytest

from mocker.config import ConfigError
from mocker.timing import PassShape, ProfileTiming, TimingSpec, load_timing_model


def _load(path: object) -> object:
    return load_timing_model(TimingSpec.with_profile("polynomial", None, str(path)))


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


def test_profile_npz_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "profile.npz"
    np.savez(
        path,
        prefill_isl=np.array([100, 1000]),
        prefill_ttft_ms=np.array([10.0, 100.0]),
        decode_active_kv_tokens=np.array([0, 1000]),
        decode_context_length=np.array([100, 200]),
        decode_itl=np.array([[5.0, 7.0], [9.0, 15.0]]),
    )
    model = _load(path)
    assert isinstance(model, ProfileTiming)
    assert model.prefill_ms(550) == pytest.approx(55.0)
    both = PassShape(550, 1, 0, 5, 9999, 1000, 10_000)
    assert model.pass_ms(both) == pytest.approx(55.0 + model.decode_ms(1000, 10_000, 5))


def test_profile_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        _load(tmp_path / "missing.npz")
    bad = tmp_path / "bad.npz"
    np.savez(bad, prefill_isl=np.array([1, 2]))
    with pytest.raises(ConfigError, match="missing key"):
        _load(bad)
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
        _load(garbage)
    with pytest.raises(ConfigError, match=r"\.npz, Dynamo's layout\) or a correction"):
        _load(tmp_path / "profile.txt")
