"""The sweep's table: a row a point, its cost, its SLO attainment, the Pareto front and
the best point."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from mocker.sweep.grid import Point
from mocker.sweep.point import Outcome
from mocker.sweep.spec import Slo, SweepSpec

__all__ = [
    "attainment",
    "best",
    "closest",
    "make_rows",
    "misses",
    "text_table",
    "write_csv",
]

_FIGURES = (("ttft", "ttft_s"), ("tpot", "itl_s"), ("e2e", "e2e_s"))


def attainment(outcome: Outcome, slo: Slo) -> tuple[float, int]:
    """The share of the point's requests that met every bound, and how many did (a
    rejected request meets none; one without a second token has no TPOT to miss)."""
    ttft, tpot, e2e = outcome["ttft"], outcome["tpot"], outcome["e2e"]
    good = 0
    for first, per_token, whole in zip(ttft, tpot, e2e, strict=True):
        if first is None or whole is None:
            continue
        if slo.ttft is not None and first > slo.ttft:
            continue
        if slo.tpot is not None and per_token is not None and per_token > slo.tpot:
            continue
        if slo.e2e is not None and whole > slo.e2e:
            continue
        good += 1
    return (good / len(ttft) if ttft else 0.0), good


def _row(point: Point, outcome: Outcome | None, spec: SweepSpec) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point.index, **point.values, "gpu": point.gpu,
                           "gpus": point.gpus}  # fmt: skip
    if point.invalid is not None:
        return {**row, "status": f"invalid: {point.invalid}"}
    if outcome is None or "summary" not in outcome:
        reason = "not run" if outcome is None else outcome["error"]
        return {**row, "status": f"failed: {reason}"}
    s = outcome["summary"]
    hours = point.gpus * s["sim_duration_s"] / 3600
    share, good = attainment(outcome, spec.slo)
    goodput = good / s["sim_duration_s"] if s["sim_duration_s"] else 0.0
    row.update(status="ok", gpu_hours=round(hours, 6))
    if spec.prices:
        row["cost_usd"] = round(hours * spec.prices[point.gpu], 6)
    row.update(requests=s["requests"], finished=s["finished"], rejected=s["rejected"],
               sim_duration_s=s["sim_duration_s"])  # fmt: skip
    for name, key in _FIGURES:
        for q in ("p50", "p90", "p99"):
            row[f"{name}_{q}_s"] = s[key][q]
    row.update(
        requests_per_s=s["requests_per_s"],
        output_tokens_per_s=s["output_tokens_per_s"],
        prefix_hit_rate=s["prefix_hit_rate"]["device"],
        preemptions=s["preemptions"],
        slo_attainment=round(share, 6),
        goodput_rps=round(goodput, 6),
    )
    row["meets_slo"] = _score(row, spec.slo) >= 1.0
    return row


def _score(row: dict[str, Any], slo: Slo) -> float:
    """How near the point comes to the SLO: its worst condition's achieved share of what is
    required (1: every condition met)."""
    shares = [row["slo_attainment"] / slo.attainment]
    if slo.min_goodput:
        shares.append(row["goodput_rps"] / slo.min_goodput)
    for column, bound in slo.percentiles:
        value = row[column]
        shares.append(0.0 if value is None else bound / value if value else 1.0)
    return float(min(1.0, *shares))


def misses(row: dict[str, Any], slo: Slo) -> str:
    """What the point falls short of, in words."""
    out = []
    if row["slo_attainment"] < slo.attainment:
        out.append(f"{row['slo_attainment']:.1%} of requests within the bounds "
                   f"({slo.attainment:.0%} needed)")  # fmt: skip
    if row["goodput_rps"] < slo.min_goodput:
        out.append(f"goodput {row['goodput_rps']:.3g} req/s ({slo.min_goodput:g} needed)")
    for column, bound in slo.percentiles:
        value = row[column]
        if value is None or value > bound:
            metric, q, _ = column.split("_")
            shown = "none finished" if value is None else f"{value:.3g} s"
            out.append(f"{metric} {q} {shown} ({bound:g} s allowed)")
    return "; ".join(out)


def _cost(row: dict[str, Any]) -> float:
    return float(row.get("cost_usd", row["gpu_hours"]))


def make_rows(
    grid: list[Point], outcomes: dict[str, Outcome], spec: SweepSpec
) -> list[dict[str, Any]]:
    """A row a point in grid order, the Pareto front (least cost, most attainment) and the
    best point (the cheapest within the SLO; then the most goodput) marked."""
    rows = [_row(p, outcomes.get(p.key), spec) for p in grid]
    front = _front([r for r in rows if r["status"] == "ok"])
    for row in rows:
        row["pareto"] = id(row) in front
    chosen = best(rows)
    for row in rows:
        row["best"] = row is chosen
    return rows


def _front(ran: list[dict[str, Any]]) -> set[int]:
    """The rows no other row beats on both cost and attainment (ids): by cost, each that
    attains more than every cheaper one (or ties the last such exactly)."""
    front: set[int] = set()
    top, last = -1.0, None
    for row in sorted(ran, key=lambda r: (_cost(r), -r["slo_attainment"])):
        pair = (_cost(row), row["slo_attainment"])
        if pair[1] > top or pair == last:
            front.add(id(row))
            top, last = pair[1], pair
    return front


def best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The cheapest point that meets the SLO (ties: more goodput, then the grid's order)."""
    meets = [r for r in rows if r.get("meets_slo")]
    return min(meets, key=lambda r: (_cost(r), -r["goodput_rps"], r["point"]), default=None)


def closest(rows: list[dict[str, Any]], slo: Slo) -> dict[str, Any] | None:
    """The point nearest the SLO: the highest share of its worst condition (ties: the
    cheapest)."""
    ran = [r for r in rows if r["status"] == "ok"]
    return min(ran, key=lambda r: (-_score(r, slo), _cost(r), r["point"]), default=None)


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """One CSV row a point; a column absent from a row (a failed point's figures) is empty."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def text_table(rows: list[dict[str, Any]], axes: list[str]) -> str:
    """The Pareto front and the best point, as `mocker sweep` prints them."""
    cost = "cost_usd" if any("cost_usd" in r for r in rows) else "gpu_hours"
    head = ["point", *axes, cost, "attain", "goodput", "TTFT p90", "TPOT p90", ""]
    lines = [head]
    for r in sorted((r for r in rows if r["pareto"]), key=_cost):
        mark = "best" if r["best"] else ("meets SLO" if r["meets_slo"] else "")
        lines.append([str(r["point"]), *(str(r[a]) for a in axes), f"{r[cost]:.4g}",
                      f"{r['slo_attainment']:.1%}", f"{r['goodput_rps']:.3g}/s",
                      _ms(r["ttft_p90_s"]), _ms(r["tpot_p90_s"]), mark])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)  # fmt: skip


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"
