"""What each compiled part buys: a user-visible figure with every part, and with that one left
out (MOCKER_COMPILED_SKIP), in the same run.

Run from the repo root with no arguments: `.venv/bin/python bench/compiled_parts.py`
(about 5 minutes). Each run is a child pinned to the server core; progress goes to stderr,
the last stdout line is one JSON object. The project keeps a compiled part only where it
buys at least 10% on such a figure.

- `replay`: the Mooncake trace's first REPLAY_REQUESTS requests on 8 engines behind the
  kv-aware router, seconds in `replay()` (the device pool, the hash chain, replay prompts'
  mixing, the pass's draws);
- `replay_tiers`: the same with a CPU tier under each engine (write-through): the tiers'
  LRU order and the channels between them;
- `stream`: bench/stream_core.py's streaming core at 500 streams, wall microseconds per
  token (a pass's tokens applied and handed out, the renderers' text table and sinks).

Per part, PAIRS pairs alternate the two (who goes first swaps); the figure is the median
ratio, time without the part over time with every part.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from harness import ROOT, emit, log, pinned

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
REPLAY_REQUESTS = 4000
PAIRS = 5  # (single pairs swing widely on a shared machine: the median of five)
TIMEOUT_S = 300
KEEP = 1.10  # a part is worth keeping from this ratio on

_REPLAY = """
import sys, time
from mocker.config import EngineConfig
from mocker.replay.runner import replay
from mocker.replay.trace import load_trace
trace, _ = load_trace(sys.argv[1], max_requests=int(sys.argv[2]))
changes = {"num_cpu_blocks": 16384, "offload_policy": "write-through"} if sys.argv[3] == "1" else {}
config = EngineConfig.of(**changes)
started = time.perf_counter()
replay(trace, config, num_engines=8, router="kv-aware")
print(time.perf_counter() - started)
"""

# Which figure each part's work shows in.
SCENARIOS: dict[str, tuple[str, ...]] = {
    "replay": ("_cpool", "_chash", "_cprompts", "_cpass"),
    "replay_tiers": ("_clru", "_clink"),
    "stream": ("_cpass", "_ctext"),
}


def _figure(scenario: str, skip: str) -> float:
    """One run's figure (lower is better) with the part `skip` left out ("" for none)."""
    env = {**os.environ, "MOCKER_COMPILED": "auto", "MOCKER_COMPILED_SKIP": skip}
    if scenario == "stream":
        argv = [sys.executable, str(ROOT / "bench" / "stream_core.py"), "--child", "mocker"]
    else:
        tiers = "1" if scenario == "replay_tiers" else "0"
        argv = [sys.executable, "-c", _REPLAY, str(TRACE), str(REPLAY_REQUESTS), tiers]
    done = subprocess.run(pinned(argv), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=True)  # fmt: skip
    last = done.stdout.strip().splitlines()[-1]
    if scenario == "stream":
        return float(json.loads(last)["wall_us_per_token"])
    return float(last)


def main() -> int:
    if not TRACE.exists():
        log(f"SKIPPED: {TRACE} is missing (../shared beside the checkout)")
        emit({"skipped": f"{TRACE} missing"})
        return 0
    started = time.perf_counter()
    parts: dict[str, dict[str, Any]] = {}
    for scenario, names in SCENARIOS.items():
        for name in names:
            ratios, with_all, without = [], [], []
            for i in range(PAIRS):
                order = ("", name) if i % 2 == 0 else (name, "")
                got = {skip: _figure(scenario, skip) for skip in order}
                with_all.append(got[""])
                without.append(got[name])
                ratios.append(got[name] / got[""])
            ratio = statistics.median(ratios)
            each = ", ".join(f"{r:.3f}" for r in ratios)
            log(f"{scenario:12s} {name:9s} without/with {ratio:.3f} ({each})")
            parts.setdefault(name, {})[scenario] = {
                "with_all": round(statistics.median(with_all), 3),
                "without": round(statistics.median(without), 3),
                "ratio": round(ratio, 3),
                "ratios": [round(r, 3) for r in ratios],
            }
    summary = {
        name: {
            "best_ratio": max(s["ratio"] for s in scenarios.values()),
            "keep": max(s["ratio"] for s in scenarios.values()) >= KEEP,
            **scenarios,
        }
        for name, scenarios in parts.items()
    }
    emit({"pairs": PAIRS, "replay_requests": REPLAY_REQUESTS, "keep_from": KEEP,
          "wall_s": round(time.perf_counter() - started, 1), "parts": summary})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
