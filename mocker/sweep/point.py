"""One point's replay as a worker runs it: its summary and every request's latencies."""

from __future__ import annotations

from typing import Any

from mocker import __version__
from mocker.replay.command import engine_values, replay_config, run_trace, workload
from mocker.replay.report import summarize
from mocker.replay.trace import TraceRequest
from mocker.sweep.grid import parse_point

__all__ = ["Outcome", "execute_point", "failure"]

# A finished point: {"mocker", "summary", "ttft", "tpot", "e2e"}; a failed one: {"error"}.
Outcome = dict[str, Any]

# Figures of the host, not of the simulated engine: they differ run to run.
_HOST_FIGURES = ("wall_s", "speedup_over_real_time")


def failure(reason: str) -> Outcome:
    return {"error": reason}


def execute_point(argv: list[str], loaded: list[TraceRequest] | None) -> Outcome:
    """Replay the point (`loaded`: the trace file's requests, read once by the driver)."""
    args = parse_point(argv)
    values = engine_values(args, environ={})
    config = replay_config(args, values)
    result = run_trace(args, config, workload(args, config.seed, loaded))
    summary = summarize(result)
    for name in _HOST_FIGURES:
        summary.pop(name, None)
    finished = [r.status == "finished" for r in result.records]
    # Per request, in trace order (None: rejected), for the SLO the driver applies: a
    # finished point is reused when only the SLO changes.
    return {
        "mocker": __version__,
        "summary": summary,
        "ttft": [r.ttft if ok else None for r, ok in zip(result.records, finished, strict=True)],
        "tpot": [
            r.mean_itl if ok else None for r, ok in zip(result.records, finished, strict=True)
        ],
        "e2e": [r.e2e if ok else None for r, ok in zip(result.records, finished, strict=True)],
    }
