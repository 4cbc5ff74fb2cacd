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
  - `none`: no tiers, the baseline. Target: `cpu_fs` <= 1.2x per pass.
- mooncake: `mocker replay` of ../shared/traces/mooncake_conversation.jsonl on 8 engines,
  round robin (a conversation's turns land on different engines), each run in a child
  pinned to the other core: no tiers; a CPU tier per engine; the CPU tiers plus ONE obj tier
  (25 GB/s) shared by the eight engines. Hit rate per tier, TTFT p50/p99, bytes per link, wall time
  and peak RSS of the child.

The machine has two shared, noisy cores: compare ratios within one run, not absolute
figures across runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import CLIENT_CPU, MACHINE, ROOT, SERVER_CPU, attempt, emit, log, pin, pinned
from offload import (
    NUM_GPU_BLOCKS,
    NUM_HOST_BLOCKS,
    REPLAY_RATE,
    SATURATED_RATE,
    Config,
    replay_requests,
    time_configs,
    working_set,
)

from mocker.config import StorageTierSpec

# -- step cost --
REPS = 15  # replays per config and workload
FS = StorageTierSpec("fs", 16_384, read_gbps=8.0, write_gbps=4.0, latency_ms=0.1)  # type: ignore[arg-type]
SMALL_CPU_BLOCKS = 3_000  # < the working set (~8,000 blocks): hits come from fs
CPU_FS = Config("cpu_fs", NUM_HOST_BLOCKS, "write-through", (FS,))
CPU_FS_EVICT = Config("cpu_fs_evict", NUM_HOST_BLOCKS, "evict", (FS,))
SMALL_CPU_FS = Config("small_cpu_fs", SMALL_CPU_BLOCKS, "write-through", (FS,))
NONE = Config("none", 0)
STEP_COST_TARGET = 1.20

# -- mooncake --
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
ENGINES = 8
ROUTER = "round-robin"
TIMEOUT_S = 400
GIB = 2**30
CPU_BYTES = 32 * GIB  # per engine: 16,384 blocks of 2 MiB, as many as the device pool
# One obj tier for all eight engines, as a storage cluster: 25 GB/s each way, 2 ms a copy.
# (At the mock's default obj figures, 2 / 1 GB/s, the cascades of eight engines' prompts
# saturate the shared write link: see the README.)
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
        timed = time_configs(label, replay_requests(prompts, rate), configs, NONE, REPS)
        out[label] = {"arrival_rate_per_s": rate, **timed["timing"]}
        out[label]["hits_rounds_2plus"] = {
            name: {k: first["rounds_2plus"][k] for k in
                   ("device_hit_rate", "tier_hit_rates", "ttft_p50_ms", "ttft_p99_ms")}
            for name, first in timed["firsts"].items()
        }  # fmt: skip
    return out


def mooncake_once(name: str, flags: list[str]) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"tiers-{name}-"))
    argv = pinned([
        sys.executable, "-c", _CHILD, "replay", str(TRACE), "--output-dir", str(out),
        "--quiet", "--no-plots", "--num-engines", str(ENGINES), "--router", ROUTER, *flags,
    ], SERVER_CPU)  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(argv, check=True, timeout=TIMEOUT_S, cwd=ROOT, capture_output=True)
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
    log(f"mooncake: {TRACE.name} on {ENGINES} engines, {ROUTER}")
    trace = attempt(errors, "mooncake", mooncake) or {}
    ratio = cost.get("scenario", {}).get("ratio_per_pass", {}).get(CPU_FS.name)
    runs = trace.get("runs", {})
    summary: dict[str, Any] = {
        "step_cost_ratio_cpu_fs": ratio,
        "step_cost_ratio_cpu_fs_saturated": cost.get("saturated", {})
        .get("ratio_per_pass", {})
        .get(CPU_FS.name),
        "step_cost_target": STEP_COST_TARGET,
        "step_cost_target_met": None if ratio is None else ratio <= STEP_COST_TARGET,
        "mooncake_obj_hit_rate": runs.get("cpu_obj", {}).get("hit_rate", {}).get("obj"),
        "mooncake_ttft_p50_ms": {name: r["ttft_p50_ms"] for name, r in runs.items()},
        "mooncake_ttft_p99_ms": {name: r["ttft_p99_ms"] for name, r in runs.items()},
        "notes": (
            "step_cost_ratio_* = median us of EngineCore.step() per pass, config / none "
            "(idle calls' time counted, divided by the calls that ran a pass). Hit rates are "
            "hit tokens / prompt tokens, per tier; mooncake TTFTs are simulated."
        ),
        "step_cost": cost,
        "mooncake": trace,
        "wall_s": round(time.perf_counter() - started, 1),
        "machine": MACHINE,
        "errors": errors,
    }
    emit(summary)
    return 1 if errors or ratio is None else 0


if __name__ == "__main__":
    sys.exit(main())
