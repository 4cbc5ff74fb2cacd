"""Block-hash cost per algorithm: the fast default against vLLM's four (--prefix-caching-hash-algo).

Run from the repo root with no arguments: `.venv/bin/python bench/hashing.py`. The last stdout
line is one JSON object. Pinned to one core; each rep hashes the same 64k-token prompt (4,096
blocks of 16) with every algorithm, in an order rotated each rep; the median µs per block and
its ratio to `fast` (the default, measured in the same run) are reported. A request's
prompt is hashed once at admission and each generated block once when it fills.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import MACHINE, SERVER_CPU, emit, log, pin

from mocker.kv.hashing import BlockHash, HashAlgo, make_hasher

BLOCK_SIZE = 16
NUM_BLOCKS = 4096
REPS = 15
ALGOS = [a.value for a in HashAlgo]


def per_block_us(algo: str, tokens: list[int]) -> float:
    hasher = make_hasher(algo, 0, "0")
    hashes: list[BlockHash] = []
    chain = hasher.chain("adapter", None)  # a LoRA's extra key on every block: the costly case
    t0 = time.perf_counter_ns()
    chain.extend(hashes, tokens, BLOCK_SIZE)
    elapsed = time.perf_counter_ns() - t0
    assert len(hashes) == NUM_BLOCKS
    return elapsed / 1e3 / NUM_BLOCKS


def main() -> None:
    pin(SERVER_CPU)
    tokens = [(i * 7919) % 128_000 for i in range(NUM_BLOCKS * BLOCK_SIZE)]
    samples: dict[str, list[float]] = {a: [] for a in ALGOS}
    for rep in range(REPS):
        order = ALGOS[rep % len(ALGOS) :] + ALGOS[: rep % len(ALGOS)]
        for algo in order:
            samples[algo].append(per_block_us(algo, tokens))
    medians = {a: statistics.median(s) for a, s in samples.items()}
    base = medians["fast"]
    for algo in ALGOS:
        log(f"{algo:12} {medians[algo]:6.2f} us/block  {medians[algo] / base:5.2f}x fast")
    emit(
        {
            "machine": MACHINE,
            "blocks_per_rep": NUM_BLOCKS,
            "reps": REPS,
            "us_per_block_median": {a: round(m, 3) for a, m in medians.items()},
            "ratio_to_fast": {a: round(m / base, 3) for a, m in medians.items()},
        }
    )


if __name__ == "__main__":
    main()
