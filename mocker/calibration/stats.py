"""How close predictions are to measurements: absolute percentage errors and rank correlation."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["ape", "error_summary", "spearman"]


def ape(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured."""
    return abs(predicted - measured) / measured


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson's of the ranks); nan for fewer than 3 pairs."""
    if len(xs) != len(ys):
        raise ValueError("spearman: sequences of different lengths")
    if len(xs) < 3:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else float("nan")


def error_summary(
    pred_ttft: Sequence[float],
    real_ttft: Sequence[float],
    pred_tpot: Sequence[float],
    real_tpot: Sequence[float],
) -> dict[str, float | int]:
    """Median and mean absolute percentage error of TTFT and TPOT, and their rank
    correlations, over paired predictions and measurements."""
    e_ttft = [ape(p, r) for p, r in zip(pred_ttft, real_ttft, strict=True)]
    e_tpot = [ape(p, r) for p, r in zip(pred_tpot, real_tpot, strict=True)]
    if not e_ttft:
        return {"rows": 0}
    return {
        "rows": len(e_ttft),
        "ttft_median_ape": statistics.median(e_ttft),
        "ttft_mean_ape": statistics.fmean(e_ttft),
        "tpot_median_ape": statistics.median(e_tpot),
        "tpot_mean_ape": statistics.fmean(e_tpot),
        "ttft_spearman": spearman(pred_ttft, real_ttft),
        "tpot_spearman": spearman(pred_tpot, real_tpot),
    }
