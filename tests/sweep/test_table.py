"""The table: SLO attainment, cost, the Pareto front, the best and the closest point."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from mocker.sweep.grid import Point
from mocker.sweep.point import Outcome
from mocker.sweep.spec import Slo, SweepSpec
from mocker.sweep.table import (
    attainment,
    best,
    closest,
    make_rows,
    misses,
    text_table,
    write_csv,
)


def _quantiles(v: float) -> dict[str, float]:
    return {"mean": v, "p50": v, "p90": v, "p99": v}


def outcome(ttfts: list[float | None], duration: float = 3600.0) -> Outcome:
    """A finished point whose requests took these TTFTs (None: rejected)."""
    done = [t for t in ttfts if t is not None]
    summary = {"requests": len(ttfts), "finished": len(done), "rejected": len(ttfts) - len(done),
               "sim_duration_s": duration, "ttft_s": _quantiles(max(done)),
               "itl_s": _quantiles(0.01), "e2e_s": _quantiles(1.0), "requests_per_s": 1.0,
               "output_tokens_per_s": 10.0, "prefix_hit_rate": {"device": 0.5},
               "preemptions": 0}  # fmt: skip
    return {"summary": summary, "ttft": ttfts, "tpot": [0.01 if t else None for t in ttfts],
            "e2e": [1.0 if t is not None else None for t in ttfts]}  # fmt: skip


def point(index: int, gpus: int, gpu: str = "h100_sxm", invalid: str | None = None) -> Point:
    return Point(index, {"num-engines": gpus}, [], gpu, gpus, f"k{index}", invalid)


def spec(slo: Slo, prices: dict[str, float] | None = None) -> SweepSpec:
    return SweepSpec(None, {}, {"num-engines": [1, 2, 4, 8]}, slo, prices or {})


def test_attainment_counts_requests_within_every_bound() -> None:
    o = outcome([0.5, 1.5, None, 0.9])
    o["tpot"] = [0.01, 0.01, None, 0.2]
    assert attainment(o, Slo(ttft=1.0)) == (0.5, 2)  # the rejected one meets nothing
    assert attainment(o, Slo(ttft=1.0, tpot=0.1)) == (0.25, 1)
    o["tpot"][0] = None  # one output token: no TPOT to miss
    assert attainment(o, Slo(ttft=1.0, tpot=0.001)) == (0.25, 1)
    assert attainment(o, Slo(e2e=2.0)) == (0.75, 3)


def test_the_best_is_the_cheapest_within_the_slo_and_the_front_is_marked(
    tmp_path: Path,
) -> None:
    grid = [point(0, 1), point(1, 2), point(2, 4), point(3, 8), point(4, 1, invalid="no fit")]
    outcomes = {
        "k0": outcome([3.0, 3.0, 0.5, 0.5]),  # 50%: cheapest, short of 75%
        "k1": outcome([3.0, 0.5, 0.5, 0.5]),  # 75%: meets it
        "k2": outcome([3.0, 0.5, 0.5, 0.5]),  # 75% at twice the cost: dominated
        "k3": outcome([0.5, 0.5, 0.5, 0.5]),  # 100%
    }
    rows = make_rows(grid, outcomes, spec(Slo(ttft=1.0, attainment=0.75)))
    assert [r["gpu_hours"] for r in rows[:4]] == [1.0, 2.0, 4.0, 8.0]
    assert [r["meets_slo"] for r in rows[:4]] == [False, True, True, True]
    assert [r["pareto"] for r in rows] == [True, True, False, True, False]
    assert [r["best"] for r in rows] == [False, True, False, False, False]
    assert rows[4]["status"] == "invalid: no fit" and "gpu_hours" not in rows[4]
    write_csv(rows, tmp_path / "sweep.csv")
    read = list(csv.DictReader((tmp_path / "sweep.csv").read_text().splitlines()))
    assert [r["point"] for r in read] == ["0", "1", "2", "3", "4"]
    assert read[4]["gpu_hours"] == "" and read[1]["best"] == "True"
    printed = text_table(rows, ["num-engines"])
    assert "best" in printed.splitlines()[2] and len(printed.splitlines()) == 4  # head + front


def test_prices_rank_by_dollars() -> None:
    grid = [point(0, 2, "b200_sxm"), point(1, 4, "h100_sxm")]
    outcomes = {"k0": outcome([0.5]), "k1": outcome([0.5])}
    rows = make_rows(grid, outcomes, spec(Slo(ttft=1.0), {"b200_sxm": 6.0, "h100_sxm": 2.0}))
    assert [r["cost_usd"] for r in rows] == [12.0, 8.0]
    assert best(rows) is rows[1]  # more GPUs, fewer dollars


def test_no_point_within_the_slo_names_the_closest() -> None:
    grid = [point(0, 1), point(1, 2), point(2, 4)]
    outcomes: dict[str, Any] = {"k0": outcome([3.0, 0.5]), "k1": outcome([0.5, 0.5, 0.5, 3.0]),
                                "k2": {"error": "its worker died 2 times"}}  # fmt: skip
    rows = make_rows(grid, outcomes, spec(Slo(ttft=1.0, attainment=0.9)))
    assert best(rows) is None
    near = closest(rows, Slo(ttft=1.0, attainment=0.9))
    assert near is not None and near["point"] == 1 and near["slo_attainment"] == 0.75
    assert rows[2]["status"] == "failed: its worker died 2 times"


def test_goodput_is_a_floor_too() -> None:
    rows = make_rows([point(0, 1)], {"k0": outcome([0.5] * 36, duration=3600.0)},
                     spec(Slo(ttft=1.0, min_goodput=0.02)))  # fmt: skip
    assert rows[0]["goodput_rps"] == 0.01 and rows[0]["meets_slo"] is False


def test_percentile_bounds_decide_too_and_the_closest_names_what_it_misses() -> None:
    slo = Slo(attainment=0.5, percentiles=(("ttft_p90_s", 1.0),))
    grid = [point(0, 1), point(1, 2)]
    outcomes = {"k0": outcome([0.5, 3.0]), "k1": outcome([0.5, 1.5])}  # p90: the max here
    rows = make_rows(grid, outcomes, spec(slo))
    assert [r["meets_slo"] for r in rows] == [False, False]
    near = closest(rows, slo)
    assert near is rows[1]  # 1.5 s is nearer 1 s than 3 s is
    assert misses(near, slo) == "ttft p90 1.5 s (1 s allowed)"
    assert make_rows(grid, {"k0": outcome([0.5, 0.9])}, spec(slo))[0]["meets_slo"] is True


def test_the_closest_under_a_goodput_floor_names_the_shortfall() -> None:
    slo = Slo(ttft=5.0, min_goodput=1000.0)
    rows = make_rows([point(0, 1)], {"k0": outcome([0.5, 0.5])}, spec(slo))
    near = closest(rows, slo)
    assert near is not None and misses(near, slo) == "goodput 0.000556 req/s (1000 needed)"
