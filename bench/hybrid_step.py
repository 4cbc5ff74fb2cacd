"""Hybrid-model step cost: one step() with 256 running decodes, hybrid shapes vs dense ones.

Run from the repo root with no arguments: `python bench/hybrid_step.py`. Pins itself to one
core, prints progress lines and one JSON object as its last line.

Each hybrid preset is measured against a dense shape of the same layer count, KV heads and
head size (every layer full attention), on the same prompts. The two engines are stepped in
turn, one step each (these 2-core machines are shared and noisy, and a slow second then
hits both alike), ROUNDS times with fresh engines: each round's figure is the ratio of the
medians of its steps, and the figure reported is the median round (with the spread).
Prompts are staggered so that decode steps keep crossing block boundaries (the allocator,
sliding-window releases and Mamba state moves all run).
Target (issue 17): hybrid ≤ 1.5 × dense.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import emit, log, pin

from mocker.config import EngineConfig
from mocker.engine.core import EngineCore
from mocker.model_shape import MODEL_PRESETS, ModelShape
from mocker.request import EngineRequest, SamplingParams

NUM_RUNNING = 256
MEASURED_STEPS = 400
ROUNDS = 5
HYBRIDS = ("gpt-oss-20b", "gemma-3-12b", "qwen3-next-80b-a3b", "granite-4.0-h-micro")


def dense_twin(shape: ModelShape) -> ModelShape:
    """The same layers, KV heads and head size, every layer full attention."""
    return replace(shape, layer_types=(), sliding_window=None, mamba_state_bytes=0)


def running_engine(config: EngineConfig) -> tuple[EngineCore, float]:
    """An engine with NUM_RUNNING requests decoding, and its clock."""
    core = EngineCore(config)
    bs = config.block_size
    for i in range(NUM_RUNNING):
        # Prompt ends spread over a block: some request crosses a boundary every step.
        n = 4 * bs + (i * bs) // NUM_RUNNING + 1
        prompt = [(i * 1009 + j) % 100_000 + 2 for j in range(n)]
        core.add_request(
            EngineRequest(f"r{i}", prompt, SamplingParams(max_tokens=4000, ignore_eos=True))
        )
    now = 0.0
    started: set[str] = set()
    while len(started) < NUM_RUNNING:
        result = core.step(now)
        now = result.end
        started.update(o.request_id for o in result.outputs)
    for _ in range(20):  # warm up: settle the one-pass-later releases
        now = core.step(now).end
    return core, now


def step_medians_ms(dense: EngineConfig, hybrid: EngineConfig) -> tuple[float, float]:
    """Median ms of a decode step with NUM_RUNNING running requests, of each engine, the
    two stepped in turn."""
    engines = [running_engine(dense), running_engine(hybrid)]
    costs: list[list[float]] = [[], []]
    for _ in range(MEASURED_STEPS):
        for k, (core, now) in enumerate(engines):
            t0 = time.perf_counter_ns()
            result = core.step(now)
            costs[k].append((time.perf_counter_ns() - t0) / 1e6)
            engines[k] = (core, result.end)
            if result.stats.num_generated_tokens != NUM_RUNNING:
                raise SystemExit(f"a measured step produced {result.stats.num_generated_tokens}")
    return statistics.median(costs[0]), statistics.median(costs[1])


def main() -> None:
    cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if cpu is not None:
        pin(cpu)
    log(f"pinned to cpu {cpu}")
    results: dict[str, dict[str, object]] = {}
    for name in HYBRIDS:
        shape = MODEL_PRESETS[name]
        common = {"num_gpu_blocks": 200_000, "max_model_len": 65536}
        hybrid = EngineConfig.of(model=shape, **common)
        # The twin's block: the hybrid's, or (a Mamba hybrid's 544 is no power of two) the
        # largest power of two below it.
        twin_bs = 1 << (hybrid.block_size.bit_length() - 1)
        dense = EngineConfig.of(model=dense_twin(shape), block_size=twin_bs, **common)
        dense_ms: list[float] = []
        hybrid_ms: list[float] = []
        ratios: list[float] = []
        for r in range(ROUNDS):
            d, h = step_medians_ms(dense, hybrid)
            dense_ms.append(d)
            hybrid_ms.append(h)
            ratios.append(h / d)
            log(f"{name} round {r + 1}: dense {d:.3f} ms, hybrid {h:.3f} ms ({h / d:.2f}x)")
        ratio = statistics.median(ratios)
        results[name] = {
            "groups": len(hybrid.layout.groups),
            "block_size": hybrid.block_size,
            "dense_block_size": twin_bs,
            "dense_step_ms_median": round(statistics.median(dense_ms), 4),
            "hybrid_step_ms_median": round(statistics.median(hybrid_ms), 4),
            "dense_step_ms_runs": [round(x, 4) for x in dense_ms],
            "hybrid_step_ms_runs": [round(x, 4) for x in hybrid_ms],
            "hybrid_vs_dense": round(ratio, 3),
            "hybrid_vs_dense_runs": [round(x, 3) for x in ratios],
            "target_met": ratio <= 1.5,
        }
    emit({"cpu": cpu, "num_running": NUM_RUNNING, "shapes": results,
          "targets_met": all(r["target_met"] for r in results.values())})  # fmt: skip


if __name__ == "__main__":
    main()
