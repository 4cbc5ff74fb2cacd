"""Traces to replay: Mooncake JSONL, simple JSONL/CSV rows, or a synthetic generator."""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "SyntheticSpec",
    "TraceError",
    "TraceRequest",
    "load_trace",
    "scale_trace",
    "synthetic_trace",
]

# Prompt-block ids of rows that carry no hash_ids live above every Mooncake id, one fresh id
# per block, so such prompts share nothing unless a generator says so.
_UNIQUE_ID_BASE = 1 << 40
# A trace's own ids at or above this (64-bit block hashes, say) are renumbered from it, in
# order of appearance: equal ids stay equal, and none reaches the generated ones.
_LARGE_ID = 1 << 39
# No model reads a longer context: a row beyond it is a mistake, refused before its prompt
# blocks are counted out.
MAX_TRACE_TOKENS = 1 << 24


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One recorded request: when it arrived, how long its prompt and output are, and which
    prompt blocks it has (equal ids mean equal blocks, Mooncake's `hash_ids`)."""

    arrival: float  # seconds from the start of the trace
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    line: int  # where it came from (1-based; 0 for generated requests)
    lora: str | None = None  # the LoRA adapter it names (`lora_name` or `adapter`)


def _int_field(row: dict[str, Any], names: tuple[str, ...], what: str) -> int:
    for name in names:
        if name in row:
            value = row[name]
            if isinstance(value, str):
                value = value.strip()
                try:
                    value = float(value)
                except ValueError:
                    raise ValueError(f"{name} must be a number, got {row[name]!r}") from None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {row[name]!r}")
            if value != int(value):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            if value > MAX_TRACE_TOKENS:
                raise ValueError(f"{name}={row[name]!r} is more than {MAX_TRACE_TOKENS} tokens")
            return int(value)
    raise ValueError(f"missing {what} (one of: {', '.join(names)})")


def _arrival(row: dict[str, Any]) -> float:
    """Seconds: Mooncake's `timestamp` is milliseconds; `arrival`/`arrival_time` are seconds."""
    for name, scale in (("timestamp", 1e-3), ("arrival", 1.0), ("arrival_time", 1.0)):
        if name in row:
            raw = row[name]
            try:
                value = float(raw) * scale
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a number, got {raw!r}") from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {raw!r}")
            return value
    raise ValueError("missing arrival time (timestamp in ms, or arrival in s)")


class _Renumbering:
    """A trace's large block ids, renumbered from `_LARGE_ID` in order of appearance."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}

    def __call__(self, ids: list[int]) -> list[int]:
        if all(h < _LARGE_ID for h in ids):
            return ids
        table = self.ids
        out = []
        for h in ids:
            if h >= _LARGE_ID:
                h = table.setdefault(h, _LARGE_ID + len(table))
            out.append(h)
        if len(table) >= _UNIQUE_ID_BASE - _LARGE_ID:
            raise ValueError("more than 2^39 distinct large hash_ids")
        return out


def _row_to_request(
    row: dict[str, Any], line: int, trace_block_size: int, renumber: _Renumbering
) -> TraceRequest:
    arrival = _arrival(row)
    n_in = _int_field(row, ("input_length", "input_tokens", "prompt_tokens"), "input length")
    n_out = _int_field(row, ("output_length", "output_tokens", "max_tokens"), "output length")
    if n_in < 1:
        raise ValueError(f"the input length must be >= 1, got {n_in}")
    if n_out < 1:
        raise ValueError(f"the output length must be >= 1, got {n_out}")
    ids = row.get("hash_ids")
    if ids is None:
        first = _UNIQUE_ID_BASE + line * MAX_TRACE_TOKENS  # (a row has fewer blocks)
        ids = list(range(first, first + -(-n_in // trace_block_size)))
    elif not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
    ):
        raise ValueError("hash_ids must be a list of integers >= 0")
    elif len(ids) * trace_block_size < n_in:
        raise ValueError(
            f"{len(ids)} hash_ids of {trace_block_size} tokens cover fewer than the "
            f"{n_in} input tokens (is --trace-block-size right?)"
        )
    else:
        ids = renumber(ids)
    lora = row.get("lora_name", row.get("adapter"))
    if lora is not None and (not isinstance(lora, str) or not lora):
        raise ValueError(f"lora_name must be a non-empty string, got {lora!r}")
    return TraceRequest(arrival, n_in, n_out, tuple(ids), line, lora)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line number, parsed row or the reason it is not one)."""
    with path.open(encoding="utf-8", newline="") as f:
        if path.suffix.lower() == ".csv":
            reader = csv.DictReader(f)
            for row in reader:
                yield reader.line_num, {k.strip(): v for k, v in row.items() if k is not None}
            return
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                yield number, f"not valid JSON ({exc.msg} at column {exc.colno})"
                continue
            yield number, row if isinstance(row, dict) else "not a JSON object"


def load_trace(
    path: str | Path,
    *,
    trace_block_size: int = 512,
    skip_bad_lines: bool = False,
    max_requests: int | None = None,
) -> tuple[list[TraceRequest], list[str]]:
    """The requests of a Mooncake or simple JSONL / CSV trace, sorted by arrival, and the
    problems of the lines skipped (with `skip_bad_lines`; otherwise the first raises)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    requests: list[TraceRequest] = []
    skipped: list[str] = []
    renumber = _Renumbering()
    try:
        for number, row in _rows(path):
            try:
                if isinstance(row, str):
                    raise ValueError(row)
                requests.append(_row_to_request(row, number, trace_block_size, renumber))
            except ValueError as exc:
                problem = f"{path}:{number}: {exc}"
                if not skip_bad_lines:
                    raise TraceError(problem + " (--skip-bad-lines to continue)") from None
                skipped.append(problem)
            if max_requests is not None and len(requests) >= max_requests:
                break
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: cannot be read: {exc}") from None
    requests.sort(key=lambda r: r.arrival)  # stable: equal times keep file order
    return requests, skipped


def scale_trace(requests: Iterable[TraceRequest], time_scale: float) -> list[TraceRequest]:
    """Arrival gaps multiplied by `time_scale` (0.5: twice the load); a ValueError if an
    arrival would no longer be a finite number."""
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"the time scale must be a finite number > 0, got {time_scale!r}")
    out = [replace(r, arrival=r.arrival * time_scale) for r in requests]
    if out and not math.isfinite(max(r.arrival for r in out)):
        raise ValueError(f"time scale {time_scale!r} puts the last arrival beyond any finite time")
    return out


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """A generated workload: Poisson arrivals, length distributions, shared prefixes."""

    num_requests: int = 1000
    rate: float = 10.0  # requests per second
    input_length: int = 1024  # mean
    output_length: int = 128  # mean
    distribution: str = "fixed"  # fixed | uniform (0.5x-1.5x the mean) | exponential
    shared_prefix_fraction: float = 0.0  # of each prompt, taken from one of num_prefixes
    num_prefixes: int = 4
    seed: int = 0


def _draw(rng: random.Random, mean: int, distribution: str) -> int:
    if distribution == "fixed":
        return mean
    if distribution == "uniform":
        return max(1, round(rng.uniform(0.5 * mean, 1.5 * mean)))
    if distribution == "exponential":
        return max(1, round(rng.expovariate(1.0 / mean)))
    raise ValueError(f"unknown length distribution {distribution!r}")


def synthetic_trace(spec: SyntheticSpec, trace_block_size: int = 512) -> list[TraceRequest]:
    """Requests whose prompts start with a shared prefix block run (one of `num_prefixes`)
    for `shared_prefix_fraction` of their length; the rest is unique."""
    rng = random.Random(spec.seed)
    out: list[TraceRequest] = []
    t = 0.0
    next_unique = _UNIQUE_ID_BASE
    for _ in range(spec.num_requests):
        t += rng.expovariate(spec.rate)
        n_in = _draw(rng, spec.input_length, spec.distribution)
        n_out = _draw(rng, spec.output_length, spec.distribution)
        blocks = -(-n_in // trace_block_size)
        shared = min(blocks, int(n_in * spec.shared_prefix_fraction) // trace_block_size)
        prefix = rng.randrange(spec.num_prefixes)
        ids = [prefix * 100_000 + b for b in range(shared)]
        ids += range(next_unique, next_unique + blocks - shared)
        next_unique += blocks - shared
        out.append(TraceRequest(t, n_in, n_out, tuple(ids), 0))
    return out
