"""Small sweep specs and traces for the sweep's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

__all__ = ["TRACE_FLAGS", "trace_file", "write_spec"]

# A small engine that still queues under the trace below at one engine.
TRACE_FLAGS = {"trace-block-size": 64, "max-model-len": 4096, "block-size": 16,
               "timing-model": "polynomial"}  # fmt: skip


def trace_file(tmp_path: Path, n: int = 24) -> Path:
    rows = [
        {
            "timestamp": i * 50,
            "input_length": 60 + 5 * i,
            "output_length": 8 + i % 5,
            "hash_ids": [0, i % 3 + 1, 100 + i],
        }
        for i in range(n)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_spec(tmp_path: Path, **parts: Any) -> Path:
    """A spec over the small trace (or `parts`' own workload), two axes, a loose SLO."""
    spec: dict[str, Any] = {
        "trace": trace_file(tmp_path).name,
        "flags": dict(TRACE_FLAGS),
        "axes": {"num-engines": [1, 2], "max-num-seqs": [2, 8]},
        "slo": {"ttft": 5.0, "attainment": 0.5},
    }
    spec.update(parts)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
