"""The sweep's Pareto plot: every point's cost against its SLO attainment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mocker.sweep.spec import Slo

__all__ = ["pareto_plot"]


def pareto_plot(rows: list[dict[str, Any]], slo: Slo, path: Path) -> None:
    """Points as dots, the front as a line, the SLO's attainment as a rule, the best ringed."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    cost = "cost_usd" if any("cost_usd" in r for r in rows) else "gpu_hours"
    ran = [r for r in rows if r["status"] == "ok"]
    front = sorted((r for r in ran if r["pareto"]), key=lambda r: r[cost])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([r[cost] for r in ran], [r["slo_attainment"] for r in ran], s=18, alpha=0.6,
               label="point")  # fmt: skip
    ax.step([r[cost] for r in front], [r["slo_attainment"] for r in front], where="post",
            color="tab:red", label="Pareto front")  # fmt: skip
    for r in front:
        ax.annotate(str(r["point"]), (r[cost], r["slo_attainment"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.axhline(slo.attainment, color="gray", linestyle="--", label="SLO attainment")
    for r in ran:
        if r["best"]:
            ax.scatter([r[cost]], [r["slo_attainment"]], s=120, facecolors="none",
                       edgecolors="black", label="best")  # fmt: skip
    ax.set_xlabel("cost ($)" if cost == "cost_usd" else "cost (GPU-hours)")
    ax.set_ylabel("SLO attainment (share of requests)")
    ax.set_title(slo.describe(), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
