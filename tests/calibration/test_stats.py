"""Error figures: absolute percentage errors, their median and mean, Spearman's rho."""

from __future__ import annotations

import math

import pytest

from mocker.calibration import ape, error_summary, spearman


def test_spearman_by_hand() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Ranks (1, 2, 3, 4) against (1, 3, 2, 4): 1 - 6 * (0 + 1 + 1 + 0) / (4 * 15) = 0.8.
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    # Ties take their mean rank: (1.5, 1.5, 3) against (1, 2, 3).
    assert spearman([5, 5, 9], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(spearman([1, 2], [1, 2]))
    with pytest.raises(ValueError, match="different lengths"):
        spearman([1, 2, 3], [1, 2])


def test_summary_by_hand() -> None:
    assert ape(110, 100) == pytest.approx(0.1) and ape(80, 100) == pytest.approx(0.2)
    s = error_summary([110, 80, 100], [100, 100, 100], [9, 12, 10], [10, 10, 10])
    assert s["rows"] == 3
    assert s["ttft_median_ape"] == pytest.approx(0.1)
    assert s["ttft_mean_ape"] == pytest.approx(0.1)
    assert s["tpot_median_ape"] == pytest.approx(0.1)
    assert s["tpot_mean_ape"] == pytest.approx(0.1)
    assert error_summary([], [], [], []) == {"rows": 0}
