"""How fast `mocker replay` runs the Mooncake conversation trace (12,031 requests) on one core."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, SERVER_CPU, emit, log, pinned

# Run from the repo root with no arguments: `.venv/bin/python bench/replay_speed.py`.
# The replay runs in a child pinned to one core (the server core of the other benchmarks);
# progress goes to stderr, the last stdout line is one JSON object. The trace is read from
# ../shared and never copied into the project.
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
# Eight engines with the default 16,384-block pools: one engine cannot keep up with this
# hour of traffic (its queue, not the replayer, would then set the pace).
ENGINES = 8
TIMEOUT_S = 540


# The in-run baseline: the same engine stepped pass by pass (EngineCore.step for every pass,
# as the live server runs it) against the default, which takes runs of pure decode passes
# at once, on the trace's first BASELINE_REQUESTS requests, each in its own pinned child.
BASELINE_REQUESTS = 2000
_TIMED = """
import sys, time
from mocker.config import EngineConfig
from mocker.replay.runner import replay
from mocker.replay.trace import load_trace
trace, _ = load_trace(sys.argv[1], max_requests=int(sys.argv[2]))
started = time.perf_counter()
result = replay(trace, EngineConfig(), num_engines=int(sys.argv[3]), router="kv-aware",
                fast=sys.argv[4] == "fast")
print(time.perf_counter() - started, result.num_steps, sum(r.ttft for r in result.records))
"""


def _timed(mode: str) -> tuple[float, int, float]:
    argv = pinned([sys.executable, "-c", _TIMED,
                   str(TRACE), str(BASELINE_REQUESTS), str(ENGINES), mode])  # fmt: skip
    out = subprocess.run(argv, check=True, timeout=TIMEOUT_S, cwd=ROOT, capture_output=True)
    wall, steps, ttft_sum = out.stdout.split()
    return float(wall), int(steps), float(ttft_sum)


def main() -> int:
    if not TRACE.is_file():
        log(f"no trace at {TRACE}")
        return 1
    out = Path(tempfile.mkdtemp(prefix="replay_speed-"))
    argv = pinned([
        sys.executable, "-m", "mocker", "replay", str(TRACE),
        "--output-dir", str(out), "--quiet", "--no-plots",
        "--num-engines", str(ENGINES), "--router", "kv-aware",
    ])  # fmt: skip
    log(f"replaying {TRACE.name} on cpu {SERVER_CPU} with {ENGINES} engines; outputs in {out}")
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, timeout=TIMEOUT_S, cwd=ROOT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads((out / "summary.json").read_text())
    log(f"baseline: the first {BASELINE_REQUESTS} requests pass by pass, then with decode runs")
    slow, fast = _timed("step"), _timed("fast")
    if slow[1:] != fast[1:]:  # the same passes and timings, or the comparison means nothing
        log(f"pass-by-pass and decode runs disagree: {slow} vs {fast}")
        return 1
    requests = summary["requests"]
    result = {
        "requests": requests,
        "finished": summary["finished"],
        "rejected": summary["rejected"],
        "engines": ENGINES,
        "wall_s": round(wall, 2),
        "replay_wall_s": summary["wall_s"],  # the engine loop alone, inside the process
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
        "requests_per_s": round(requests / wall, 1),
        "sim_duration_s": summary["sim_duration_s"],
        "speedup_over_real_time": round(summary["sim_duration_s"] / wall, 1),
        "peak_rss_mb": round(after.ru_maxrss / 1024, 1),
        "prefix_hit_rate_device": summary["prefix_hit_rate"]["device"],
        "ttft_p50_s": summary["ttft_s"]["p50"],
        "baseline_requests": BASELINE_REQUESTS,
        "baseline_step_by_step_s": round(slow[0], 2),
        "baseline_decode_runs_s": round(fast[0], 2),
        "decode_runs_speedup": round(slow[0] / fast[0], 2),
        "target": "whole trace < 30 s on one core (>= 400 requests/s)",
    }
    log(
        f"{requests} requests in {wall:.1f} s: {result['requests_per_s']} requests/s, "
        f"{result['speedup_over_real_time']}x real time, peak RSS {result['peak_rss_mb']} MB"
    )
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
