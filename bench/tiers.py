"""Tiered KV stack: the step cost of CPU + fs tiers against no tiers, and the Mooncake trace on
eight engines with and without a shared obj tier.

Run from the repo root with no arguments: `.venv/bin/python bench/tiers.py`. Progress goes to
stderr; the last stdout line is one JSON object. The trace is read from ../shared and never
copied into the project.

Two parts, each comparing configurations in the same run:

- step cost: bench/offload.py's eviction-heavy scenario (125 prompts, a working set ~4x the
  device pool, sent 3 times in the same order) replayed on the virtual clock in this process,
  pinned to one core, every `EngineCore.step()` timed, the configs' order rotated each rep:
  - `cpu_fs`: the CPU tier sized as offload.py's host tier (it holds the working set) with
    an fs tier below it, write-through with the cascade (vLLM's TieringOffloadingSpec);
  - `cpu_fs_evict`: the same tiers, stores on device eviction (KVBM's write-back);
  - `small_cpu_fs`: a CPU tier smaller than the working set, so rounds 2+ are promoted
    from fs (the staged fs -> CPU -> device path on every hit);
  - `none`: no tiers, the baseline. Target: `cpu_fs` <= 1.2x per pass, on the default build
    (the engine `mocker serve` and `mocker replay` run; the Python code is reported too).
  Two more views of the `cpu_fs` / `none` ratio, because single replays on this machine swing
  by 2x within seconds (the other tenants' load):
  - co-stepped: both replays run in this process at once, a few passes of one, then of the
    other, each kept at the same share of its passes, so a slow second hits both alike;
    the median of COSTEP_RUNS runs is the headline figure;
  - instructions: each config replayed once under `valgrind --tool=callgrind`, counting only
    inside `EngineCore.step()` (a deterministic count of work; cache misses are not in it,
    so time ratios run above it; counts do not depend on the load, so these runs are not
    pinned and use both cores). Skipped, saying so, without valgrind.
  All of the above on the Python code (MOCKER_COMPILED=0: the device pool, the tiers'
  LRU order and every other compiled part off, tiered and tier-free engines alike), then
  co-stepped and instructions again on the default build (every compiled part that was
  built: what `mocker serve` and `mocker replay` run).
- mooncake: `mocker replay` of ../shared/traces/mooncake_conversation.jsonl on 8 engines,
  round robin (a conversation's turns land on different engines), each run in a child
  pinned to the other core, on the default build: no tiers; a CPU tier per engine; the CPU
  tiers plus ONE obj tier (25 GB/s) shared by the eight engines. Hit rate per tier, TTFT
  p50/p99, bytes per link, wall time and peak RSS of the child.

The machine has two shared, noisy cores: compare ratios within one run, not absolute
figures across runs.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import CLIENT_CPU, MACHINE, ROOT, SERVER_CPU, attempt, emit, log, pin, pinned
from offload import (
    NUM_GPU_BLOCKS,
    NUM_HOST_BLOCKS,
    REPLAY_RATE,
    REPLAY_SPEEDUP,
    SATURATED_RATE,
    Config,
    replay_requests,
    time_configs,
    working_set,
)

from mocker.compiled import ENV as COMPILED_ENV
from mocker.engine.core import EngineCore
from mocker.engine.outputs import StepResult
from mocker.engine.virtual import VirtualDriver, VirtualRun
from mocker.request import EngineRequest
from mocker.storage_spec import StorageTierSpec

# (Importing offload set MOCKER_COMPILED=0, unless set: the tier-free baselines run on
# the Python pool as the tiered engines do, so the ratios measure the tiers.)

# -- step cost --
REPS = 9  # replays per config and workload
FS = StorageTierSpec("fs", 16_384, read_gbps=8.0, write_gbps=4.0, latency_ms=0.1)  # type: ignore[arg-type]
SMALL_CPU_BLOCKS = 3_000  # < the working set (~8,000 blocks): hits come from fs
CPU_FS = Config("cpu_fs", NUM_HOST_BLOCKS, "write-through", (FS,))
CPU_FS_EVICT = Config("cpu_fs_evict", NUM_HOST_BLOCKS, "evict", (FS,))
SMALL_CPU_FS = Config("small_cpu_fs", SMALL_CPU_BLOCKS, "write-through", (FS,))
NONE = Config("none", 0)
STEP_COST_TARGET = 1.20
COSTEP_RUNS = 6
COSTEP_CHUNK = 8  # passes of one replay before the other's turn
CALLGRIND_TIMEOUT_S = 400

# -- mooncake --
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
ENGINES = 8
ROUTER = "round-robin"
TIMEOUT_S = 400
GIB = 2**30
CPU_BYTES = 32 * GIB  # per engine: 16,384 blocks of 2 MiB, as many as the device pool
# One obj tier for all eight engines, as a storage cluster: 25 GB/s each way, 2 ms a copy.
# (At the mock's default obj figures, 2 / 1 GB/s, the cascades of eight engines' prompts
# saturate the shared write link: docs/offload.md.)
OBJ = {"type": "obj", "capacity_bytes": 1024 * GIB, "read_gbps": 25, "write_gbps": 25,
       "latency_ms": 2}  # fmt: skip
_CHILD = """
import json, resource, sys
from mocker.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def tiering(secondary: list[dict[str, Any]] | None) -> str:
    """vLLM's --kv-transfer-config for a CPU tier and (TieringOffloadingSpec) tiers below."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": CPU_BYTES}
    if secondary:
        extra |= {"spec_name": "TieringOffloadingSpec", "secondary_tiers": secondary}
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": extra})  # fmt: skip


MOONCAKE_CONFIGS: dict[str, list[str]] = {
    "none": [],
    "cpu": ["--kv-transfer-config", tiering(None)],
    "cpu_obj": ["--kv-transfer-config", tiering([OBJ])],
}


def step_cost() -> dict[str, Any]:
    pin(CLIENT_CPU)
    prompts = working_set()
    configs = [CPU_FS, CPU_FS_EVICT, SMALL_CPU_FS]
    out: dict[str, Any] = {"reps_per_config": REPS}
    for label, rate in (("scenario", REPLAY_RATE), ("saturated", SATURATED_RATE)):
        requests = replay_requests(prompts, rate)
        timed = time_configs(label, requests, configs, NONE, REPS)
        out[label] = {"arrival_rate_per_s": rate, **timed["timing"]}
        out[label]["hits_rounds_2plus"] = {
            name: {k: first["rounds_2plus"][k] for k in
                   ("device_hit_rate", "tier_hit_rates", "ttft_p50_ms", "ttft_p99_ms")}
            for name, first in timed["firsts"].items()
        }  # fmt: skip
        out[label]["costepped"] = costepped(label, requests, CPU_FS, NONE)
        with build(DEFAULT_BUILD):
            out[label]["costepped_default_build"] = costepped(
                f"{label} (default build)", replay_requests(prompts, rate), CPU_FS, NONE
            )
    return out


# The build compared with the Python code alone (what the ratios above have always measured):
# the default, every compiled part that was built (the device pool, the hash chain, the
# pass's decode tokens, the tiers' LRU order).
DEFAULT_BUILD = "auto"


@contextmanager
def build(pool: str) -> Iterator[None]:
    """Engines (and their requests' hashes) made inside run on this build: MOCKER_COMPILED is
    read when each part is built."""
    before = os.environ[COMPILED_ENV]
    os.environ[COMPILED_ENV] = pool
    try:
        yield
    finally:
        os.environ[COMPILED_ENV] = before


# -- co-stepped timing ------------------------------------------------------------------------


class _Timed:
    """A replay whose `EngineCore.step()` calls are timed, advanced from outside."""

    def __init__(self, cfg: Config, requests: list[EngineRequest]) -> None:
        core = EngineCore(cfg.engine(REPLAY_SPEEDUP))
        real = core.step
        self.ns = 0
        self.passes = 0

        def step(now: float) -> StepResult:
            t0 = time.perf_counter_ns()
            result = real(now)
            self.ns += time.perf_counter_ns() - t0
            self.passes += not result.idle
            return result

        core.step = step  # type: ignore[method-assign]
        self.results: Iterator[StepResult] | None = VirtualDriver(core).steps(
            requests, run=VirtualRun()
        )

    def advance(self, n: int) -> None:
        for _ in range(n):
            if self.results is None or next(self.results, None) is None:
                self.results = None
                return

    @property
    def us_per_pass(self) -> float:
        return self.ns / max(1, self.passes) / 1000


def costep_once(cfg: Config, baseline: Config, requests: list[EngineRequest],
                passes: dict[str, int]) -> float:  # fmt: skip
    """Both replays at once: whichever is behind in its share of its passes goes next, for
    COSTEP_CHUNK passes. Returns cfg's µs per pass over baseline's."""
    a, b = _Timed(cfg, requests), _Timed(baseline, requests)
    na, nb = passes[cfg.name], passes[baseline.name]
    gc.collect()
    gc.disable()
    try:
        while a.results is not None or b.results is not None:
            a_behind = a.passes / na <= b.passes / nb
            nxt = a if a.results is not None and (b.results is None or a_behind) else b
            nxt.advance(COSTEP_CHUNK)
    finally:
        gc.enable()
    return a.us_per_pass / b.us_per_pass


def costepped(
    label: str, requests: list[EngineRequest], cfg: Config, baseline: Config
) -> dict[str, Any]:
    passes = {}
    for c in (cfg, baseline):
        t = _Timed(c, requests)
        t.advance(10**9)
        passes[c.name] = t.passes
    ratios = [costep_once(cfg, baseline, requests, passes) for _ in range(COSTEP_RUNS)]
    runs = ", ".join(f"{r:.3f}" for r in ratios)
    log(f"  {label} co-stepped {cfg.name}/{baseline.name}: {runs}")
    return {
        "ratio_per_pass_median": round(statistics.median(ratios), 3),
        "ratio_per_pass_runs": [round(r, 3) for r in ratios],
        "passes": passes,
    }


# -- instructions -----------------------------------------------------------------------------

# Run under callgrind with --toggle-collect=functools_reduce: every step() goes through
# functools.reduce (a C function nothing else on this path calls), so only step()'s own
# instructions are counted.
_COUNTED = """
import functools, sys
sys.path.insert(0, {bench!r})
import tiers
from offload import REPLAY_RATE, SATURATED_RATE, replay_requests, working_set
from mocker.engine.core import EngineCore
from mocker.engine.virtual import VirtualDriver, VirtualRun
configs = (tiers.CPU_FS, tiers.CPU_FS_EVICT, tiers.SMALL_CPU_FS, tiers.NONE)
cfg = {{c.name: c for c in configs}}[sys.argv[1]]
rate = {{"scenario": REPLAY_RATE, "saturated": SATURATED_RATE}}[sys.argv[2]]
core = EngineCore(cfg.engine(tiers.REPLAY_SPEEDUP))
real, passes = core.step, [0]
def step(now):
    result = functools.reduce(lambda _a, _b: real(now), (0, 0))
    passes[0] += not result.idle
    return result
core.step = step
for _ in VirtualDriver(core).steps(replay_requests(working_set(), rate), run=VirtualRun()):
    pass
print("passes", passes[0])
"""


def count_instructions(name: str, label: str, pool: str | None = None) -> dict[str, int]:
    """Instructions inside step() of one replay; `pool`: the build (None: this process's, as
    the co-stepped runs take it)."""
    out = Path(tempfile.mkdtemp(prefix="tiers-cg-")) / "callgrind.out"
    argv = ["valgrind", "--tool=callgrind", "--toggle-collect=functools_reduce",
            f"--callgrind-out-file={out}", sys.executable, "-c",
            _COUNTED.format(bench=str(ROOT / "bench")), name, label]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True,
                          timeout=CALLGRIND_TIMEOUT_S,
                          env={**os.environ,
                               COMPILED_ENV: pool or os.environ[COMPILED_ENV]})  # fmt: skip
    passes = int(done.stdout.split()[-1])
    collected = next(line for line in done.stderr.splitlines() if "Collected" in line)
    instructions = int(collected.rsplit(":", 1)[1].strip())
    shutil.rmtree(out.parent, ignore_errors=True)
    return {"instructions": instructions, "passes": passes,
            "per_pass": instructions // max(1, passes)}  # fmt: skip


def instructions() -> dict[str, Any]:
    """Instructions per pass of every config (the scenario workload), counted in parallel
    (the counts do not depend on the machine's load)."""
    if shutil.which("valgrind") is None:
        log("  instructions: SKIPPED, valgrind is not installed (apt-get install valgrind)")
        return {"skipped": "valgrind is not installed"}
    names = [c.name for c in (CPU_FS, CPU_FS_EVICT, SMALL_CPU_FS, NONE)]
    # The four configs on this process's build (the Python code unless MOCKER_COMPILED was
    # set), then the default build's cpu_fs and none.
    runs = [(n, None) for n in names] + [(CPU_FS.name, DEFAULT_BUILD),
                                         (NONE.name, DEFAULT_BUILD)]  # fmt: skip
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        counted = list(pool.map(lambda r: count_instructions(r[0], "scenario", r[1]), runs))
    counts = dict(zip(names, counted, strict=False))
    base = counts[NONE.name]["per_pass"]
    ratios = {n: round(counts[n]["per_pass"] / base, 3) for n in names if n != NONE.name}
    log(f"  instructions per pass: {ratios} ({base:,} without tiers)")
    tiered, tier_free = counted[len(names) :]
    default = round(tiered["per_pass"] / tier_free["per_pass"], 3)
    log(f"  default build: cpu_fs {default} ({tier_free['per_pass']:,} without tiers)")
    return {"per_config": counts, "ratio_per_pass": ratios,
            "default_build": {CPU_FS.name: tiered, NONE.name: tier_free,
                              "ratio_per_pass": default}}  # fmt: skip


def mooncake_once(name: str, flags: list[str]) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"tiers-{name}-"))
    argv = pinned([
        sys.executable, "-c", _CHILD, "replay", str(TRACE), "--output-dir", str(out),
        "--quiet", "--no-plots", "--num-engines", str(ENGINES), "--router", ROUTER, *flags,
    ], SERVER_CPU)  # fmt: skip
    started = time.perf_counter()
    # On the default build, as `mocker replay` runs for its users.
    done = subprocess.run(argv, check=True, timeout=TIMEOUT_S, cwd=ROOT, capture_output=True,
                          env={**os.environ, COMPILED_ENV: DEFAULT_BUILD})  # fmt: skip
    wall = time.perf_counter() - started
    child = json.loads(done.stdout.decode().strip().splitlines()[-1])
    if child["code"] != 0:
        raise RuntimeError(f"mocker replay ({name}) exited {child['code']}: {done.stderr!r}")
    s = json.loads((out / "summary.json").read_text())
    result = {
        "finished": s["finished"],
        "rejected": s["rejected"],
        "hit_rate": s["prefix_hit_rate"],
        "ttft_p50_ms": round(s["ttft_s"]["p50"] * 1000, 1),
        "ttft_p99_ms": round(s["ttft_s"]["p99"] * 1000, 1),
        "sim_duration_s": s["sim_duration_s"],
        "link_gib": {k: round(v / GIB, 1) for k, v in s["offload"]["link_bytes"].items()},
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(child["peak_rss_mb"], 1),
    }
    log(f"  {name:8s}: {result}")
    return result


def mooncake() -> dict[str, Any]:
    if not TRACE.is_file():
        raise FileNotFoundError(f"no trace at {TRACE}")
    runs = {name: mooncake_once(name, flags) for name, flags in MOONCAKE_CONFIGS.items()}
    return {"engines": ENGINES, "router": ROUTER, "cpu_gib_per_engine": CPU_BYTES // GIB,
            "obj_shared": OBJ, "runs": runs}  # fmt: skip


def main() -> int:
    started = time.perf_counter()
    errors: list[str] = []
    log(f"step cost: {REPS} reps per config, device pool {NUM_GPU_BLOCKS} blocks")
    cost = attempt(errors, "step cost", step_cost) or {}
    log("instructions per pass (callgrind)")
    counted = attempt(errors, "instructions", instructions) or {}
    log(f"mooncake: {TRACE.name} on {ENGINES} engines, {ROUTER}")
    trace = attempt(errors, "mooncake", mooncake) or {}
    ratio = cost.get("scenario", {}).get("costepped", {}).get("ratio_per_pass_median")
    default = cost.get("scenario", {}).get("costepped_default_build", {})
    default_ratio = default.get("ratio_per_pass_median")
    runs = trace.get("runs", {})
    summary: dict[str, Any] = {
        "step_cost_ratio_cpu_fs": ratio,
        "step_cost_ratio_cpu_fs_alternating": cost.get("scenario", {})
        .get("ratio_per_pass", {})
        .get(CPU_FS.name),
        "step_instructions_ratio_cpu_fs": counted.get("ratio_per_pass", {}).get(CPU_FS.name),
        "step_cost_ratio_cpu_fs_default_build": default_ratio,
        "step_instructions_ratio_cpu_fs_default_build": counted.get("default_build", {}).get(
            "ratio_per_pass"
        ),
        "step_cost_ratio_cpu_fs_saturated": cost.get("saturated", {})
        .get("ratio_per_pass", {})
        .get(CPU_FS.name),
        "step_cost_target": STEP_COST_TARGET,
        # The target is the engine's: the default build, what `mocker serve` and `mocker
        # replay` run (a plain `pip install .` builds every compiled part); the Python code
        # (MOCKER_COMPILED=0, the fallback without a C compiler) is reported beside it.
        "step_cost_target_met": None
        if default_ratio is None
        else default_ratio <= STEP_COST_TARGET,
        "step_cost_target_met_python_code": None if ratio is None else ratio <= STEP_COST_TARGET,
        "mooncake_obj_hit_rate": runs.get("cpu_obj", {}).get("hit_rate", {}).get("obj"),
        "mooncake_ttft_p50_ms": {name: r["ttft_p50_ms"] for name, r in runs.items()},
        "mooncake_ttft_p99_ms": {name: r["ttft_p99_ms"] for name, r in runs.items()},
        "notes": (
            "step_cost_ratio_cpu_fs = median over co-stepped runs of us of EngineCore.step() "
            "per pass, cpu_fs / none (idle calls' time counted, divided by the calls that ran "
            "a pass), on the Python code; *_default_build = the same on the default build "
            "(every compiled part: what mocker serve and replay run), which "
            "step_cost_target_met judges; *_alternating = the same ratio from medians of "
            "whole replays in rotated order; step_instructions_ratio = instructions per "
            "pass under callgrind. Hit rates are hit tokens / prompt tokens, per tier; "
            "mooncake TTFTs are simulated."
        ),
        "step_cost": cost,
        "step_instructions": counted,
        "mooncake": trace,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": MACHINE,
        "errors": errors,
    }
    emit(summary)
    return 1 if errors or ratio is None else 0


if __name__ == "__main__":
    sys.exit(main())
