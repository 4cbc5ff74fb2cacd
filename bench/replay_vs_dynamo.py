"""`mocker replay` against NVIDIA Dynamo's Rust replay on the same trace, same core, same run.

Run from the repo root with no arguments: `.venv/bin/python bench/replay_vs_dynamo.py`.
Progress goes to stderr; the last stdout line is one JSON object.

The configuration is the one Dynamo's `dynamo.replay.run_trace_replay` runs with
`num_gpu_blocks=200000`, `block_size=16`, `trace_block_size=512`, one worker, round robin,
offline: the whole `../shared/traces/mooncake_conversation.jsonl` (12,031 requests) on ONE
engine of 200,000 blocks of 16 tokens, every other setting at its default. Both run in a
child pinned to the same core, alternating, RUNS times each; the figures are medians.

ai-dynamo 1.6.1 goes into a venv of its own under `.bench-tools/` (git-ignored, reused):
the wheels of `ai-dynamo` and `ai-dynamo-runtime` are fetched with `pip download
--no-deps`, the runtime installed with its dependencies, `ai-dynamo` without (the recipe
of ../shared/TOOLS.md). If pip cannot fetch them, the Dynamo side is skipped, loudly, and
mocker's own figures are still printed.

Beside the wall times and peak memory, the two summaries are printed side by side: the
simulated duration, TTFT p50 / p99 and the prefix reuse ratio (prompt tokens served from
the prefix cache over prompt tokens); they must agree within 2%.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path
from typing import Any

from harness import ROOT, SERVER_CPU, emit, log, pinned

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
DYNAMO_VERSION = "1.6.1"
TOOLS = ROOT / ".bench-tools" / f"dynamo-{DYNAMO_VERSION}"
RUNS = 3
TIMEOUT_S = 600
AGREEMENT = 0.02  # the summaries must agree within 2%
NUM_GPU_BLOCKS = 200_000
BLOCK_SIZE = 16
TRACE_BLOCK_SIZE = 512

# Each side prints one JSON line: wall seconds inside the call, peak RSS and the summary.
_MOCKER = """
import json, resource, sys, time
from mocker.config import EngineConfig
from mocker.replay.runner import replay
from mocker.replay.report import summarize
from mocker.replay.trace import load_trace
started = time.perf_counter()
trace, _ = load_trace(sys.argv[1], trace_block_size=int(sys.argv[4]))
config = EngineConfig.of(num_gpu_blocks=int(sys.argv[2]), block_size=int(sys.argv[3]))
result = replay(trace, config, num_engines=1, router="round-robin")
wall = time.perf_counter() - started
s = summarize(result)
prompt = s["prompt_tokens"]
print(json.dumps({
    "wall_s": wall,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "sim_duration_s": s["sim_duration_s"],
    "ttft_p50_ms": s["ttft_s"]["p50"] * 1000,
    "ttft_p99_ms": s["ttft_s"]["p99"] * 1000,
    "prefix_reuse_ratio": s["prefix_hit_rate"]["device"],
    "finished": s["finished"],
}))
"""

_DYNAMO = """
import json, resource, sys, time
from dynamo.replay import run_trace_replay
started = time.perf_counter()
report = run_trace_replay(
    [sys.argv[1]],
    extra_engine_args={"engine": {"num_gpu_blocks": int(sys.argv[2]),
                                  "block_size": int(sys.argv[3])},
                       "num_gpu_blocks_is_explicit": True},
    num_workers=1, router_mode="round_robin", replay_mode="offline",
    trace_block_size=int(sys.argv[4]),
)
wall = time.perf_counter() - started
s = report.summary
print(json.dumps({
    "wall_s": wall,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "sim_duration_s": s["duration_ms"] / 1000,
    "ttft_p50_ms": s["median_ttft_ms"],
    "ttft_p99_ms": s["p99_ttft_ms"],
    "prefix_reuse_ratio": s["prefix_cache_reused_ratio"],
    "finished": s["completed_requests"],
}))
"""

COMPARED = ("sim_duration_s", "ttft_p50_ms", "ttft_p99_ms", "prefix_reuse_ratio")


def dynamo_python() -> Path | None:
    """The venv's python with ai-dynamo installed, or None (said why) if it cannot be."""
    python = TOOLS / "bin" / "python"
    stamp = TOOLS / ".installed"
    if stamp.is_file():
        return python
    log(f"installing ai-dynamo {DYNAMO_VERSION} into {TOOLS} (once)")
    venv.create(TOOLS, with_pip=True, clear=True)
    wheels = Path(tempfile.mkdtemp(prefix="dynamo-wheels-"))
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    steps = [
        [*pip, "download", "--no-deps", "-d", str(wheels),
         f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=TIMEOUT_S)
        if done.returncode != 0:
            log(f"SKIPPED Dynamo: pip could not fetch ai-dynamo {DYNAMO_VERSION}: "
                f"{done.stderr.strip()[-400:]}")  # fmt: skip
            return None
    runtime = next(wheels.glob("ai_dynamo_runtime-*.whl"))
    frontend = next(wheels.glob("ai_dynamo-*.whl"))
    for step in ([*pip, "install", str(runtime)], [*pip, "install", "--no-deps", str(frontend)]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=TIMEOUT_S)
        if done.returncode != 0:
            log(f"SKIPPED Dynamo: installing {Path(step[-1]).name} failed: "
                f"{done.stderr.strip()[-400:]}")  # fmt: skip
            return None
    stamp.write_text(DYNAMO_VERSION + "\n")
    return python


def run_once(python: str, code: str) -> dict[str, Any]:
    argv = pinned([python, "-c", code, str(TRACE), str(NUM_GPU_BLOCKS), str(BLOCK_SIZE),
                   str(TRACE_BLOCK_SIZE)], SERVER_CPU)  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[3]} exited {done.returncode}: {done.stderr[-800:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - started
    return result


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def main() -> int:
    if not TRACE.is_file():
        log(f"no trace at {TRACE}")
        return 1
    dynamo = dynamo_python()
    sides: dict[str, tuple[str, str]] = {"mocker": (sys.executable, _MOCKER)}
    if dynamo is not None:
        sides["dynamo"] = (str(dynamo), _DYNAMO)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for i in range(RUNS):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            python, code = sides[name]
            result = run_once(python, code)
            runs[name].append(result)
            wall, rss, ttft = result["wall_s"], result["peak_rss_mb"], result["ttft_p50_ms"]
            log(f"  run {i + 1} {name:6s}: {wall:.2f} s, {rss:.0f} MB, TTFT p50 {ttft:.0f} ms")
    out: dict[str, Any] = {"trace": TRACE.name, "runs_each": RUNS,
                           "num_gpu_blocks": NUM_GPU_BLOCKS, "block_size": BLOCK_SIZE,
                           "trace_block_size": TRACE_BLOCK_SIZE}  # fmt: skip
    for name, results in runs.items():
        out[name] = {
            "wall_s_median": round(median_of(results, "wall_s"), 3),
            "wall_s_runs": [round(r["wall_s"], 3) for r in results],
            "peak_rss_mb_median": round(median_of(results, "peak_rss_mb"), 1),
            "summary": {k: round(results[0][k], 4) for k in (*COMPARED, "finished")},
        }
    if "dynamo" in out:
        m, d = out["mocker"], out["dynamo"]
        out["time_ratio_mocker_over_dynamo"] = round(m["wall_s_median"] / d["wall_s_median"], 3)
        out["memory_ratio_mocker_over_dynamo"] = round(
            m["peak_rss_mb_median"] / d["peak_rss_mb_median"], 3
        )
        gaps = {k: round(abs(m["summary"][k] / d["summary"][k] - 1), 4) for k in COMPARED}
        out["summary_relative_gaps"] = gaps
        out["summaries_agree"] = all(g <= AGREEMENT for g in gaps.values())
        out["target_met"] = m["wall_s_median"] <= d["wall_s_median"]
        log(f"mocker {m['wall_s_median']} s vs Dynamo {d['wall_s_median']} s: "
            f"{out['time_ratio_mocker_over_dynamo']}x; summaries agree: "
            f"{out['summaries_agree']} {gaps}")  # fmt: skip
    else:
        out["dynamo"] = "skipped: ai-dynamo could not be installed (see stderr)"
    emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
