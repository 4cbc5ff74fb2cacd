"""Measured serving runs to compare with: rows of aiconfigurator's silicon table (its columns, in
any CSV) and `vllm bench serve --save-result` JSON files."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mocker.errors import ConfigError

__all__ = [
    "Measurement",
    "load_measurements",
    "silicon_rows",
    "silicon_table",
]

# How the silicon table's vLLM rows were run, by source (aiconfigurator's accuracy tools and
# the harness each source names): SemiAnalysis InferenceX runs `benchmark_serving.py
# --num-prompts 10×C --max-concurrency C --request-rate inf --ignore-eos --dataset-name
# random` with random lengths in [0.8 L, L] (RANDOM_RANGE_RATIO 0.8), against `vllm serve
# --max-num-seqs C --max-num-batched-tokens 8192 --kv-cache-dtype fp8
# --gpu-memory-utilization 0.9 --no-enable-prefix-caching`; the other rows' harness is
# aiconfigurator's genai-perf runner (fixed lengths, 10×C requests) against vLLM's defaults.
INFERENCEX_RANGE_RATIO = 0.8
PROMPTS_PER_USER = 10


@dataclass(frozen=True, slots=True)
class Measurement:
    """One closed-loop run: the deployment, the workload, and the measured means."""

    model: str
    gpu: str
    tensor_parallel_size: int
    concurrency: int
    isl: int  # the prompt length asked for (the longest when ranged)
    osl: int
    ttft_ms: float  # mean time to first token
    tpot_ms: float  # mean time per output token after the first
    pipeline_parallel_size: int = 1
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    num_prompts: int = 0  # 0: PROMPTS_PER_USER per user
    range_ratio: float = 1.0  # lengths drawn from [range_ratio × L, L]
    lengths: tuple[tuple[int, int], ...] = ()  # exact (prompt, output) lengths, if known
    max_num_seqs: int | None = None  # None: vLLM's default for the GPU
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = 0.9
    block_size: int = 16
    source: str = ""

    @property
    def label(self) -> str:
        return (f"{self.model} {self.gpu} TP{self.tensor_parallel_size} "
                f"{self.isl}x{self.osl} c{self.concurrency}")  # fmt: skip

    def workload(self) -> list[tuple[int, int]]:
        """Each request's (prompt, output) length, in sending order."""
        if self.lengths:
            return list(self.lengths)
        import numpy as np

        n = self.num_prompts or PROMPTS_PER_USER * self.concurrency
        rng = np.random.RandomState(0)  # (the benchmark clients' seed)
        ins = rng.randint(int(self.isl * self.range_ratio), self.isl + 1, size=n)
        outs = rng.randint(int(self.osl * self.range_ratio), self.osl + 1, size=n)
        return [(int(i), max(1, int(o))) for i, o in zip(ins, outs, strict=True)]


def silicon_table() -> Path:
    """aiconfigurator-core's own table of measured serving runs."""
    return Path(str(resources.files("aiconfigurator_core") / "systems" / "silicon_sample.csv"))


def _float(row: Mapping[str, str], key: str) -> float | None:
    try:
        value = float(row.get(key) or "nan")
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _silicon_measurement(row: Mapping[str, str]) -> Measurement | None:
    """A table row as a Measurement (None: not an aggregated vLLM run mocker can replay)."""
    if row.get("backend") != "vllm" or row.get("mode") != "agg":
        return None
    tp, c = _float(row, "tp_size"), _float(row, "batch_size")
    isl, osl = _float(row, "isl"), _float(row, "osl")
    ttft, tpot = _float(row, "silicon_ttft_ms"), _float(row, "silicon_tpot_ms")
    if None in (tp, c, isl, osl, ttft, tpot):
        return None
    assert tp is not None and c is not None and isl is not None and osl is not None
    assert ttft is not None and tpot is not None
    model = row["model_path"]
    precision = (row.get("precision") or "").strip().lower()
    gemm = (row.get("gemm_quant_mode") or "").strip().lower()
    if "gpt-oss" in model:
        quant = None  # its own MXFP4 experts ("fp4" in the table)
    elif precision == "fp4" or gemm == "nvfp4":
        quant = "nvfp4"
    elif precision == "fp8" or gemm == "fp8":
        quant = None if model.lower().endswith("-fp8") else "fp8"
    else:
        quant = None
    source = row.get("silicon_data_source") or ""
    inferencex = not source.startswith("source_file=/")
    return Measurement(
        model=model,
        gpu=row["system"],
        tensor_parallel_size=int(tp),
        pipeline_parallel_size=int(_float(row, "pp_size") or 1),
        concurrency=int(c),
        isl=int(isl),
        osl=int(osl),
        ttft_ms=ttft,
        tpot_ms=tpot,
        quantization=quant,
        kv_cache_dtype="fp8" if inferencex else "auto",
        range_ratio=INFERENCEX_RANGE_RATIO if inferencex else 1.0,
        max_num_seqs=int(c) if inferencex else None,
        max_num_batched_tokens=8192 if inferencex else None,
        source=row.get("id") or "",
    )


def silicon_rows(path: str | Path | None = None) -> list[Measurement]:
    """The replayable rows of a table in the silicon table's columns (default: the one
    aiconfigurator-core ships)."""
    path = silicon_table() if path is None else Path(path)
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read measurements {str(path)!r}: {exc}") from None
    out = [m for m in map(_silicon_measurement, rows) if m is not None]
    return out


def _bench_json(path: Path, raw: dict[str, Any], defaults: Mapping[str, Any]) -> Measurement:
    """A `vllm bench serve --save-result` file: its means, its concurrency and lengths (per
    request with --save-detailed), the deployment from its --metadata or the flags."""
    keys = ("gpu", "tensor_parallel_size", "quantization", "kv_cache_dtype")
    meta: dict[str, Any] = {**defaults, **{k: raw[k] for k in keys if k in raw}}
    completed = int(raw.get("completed") or 0)
    c = raw.get("max_concurrency")
    for key in ("mean_ttft_ms", "mean_tpot_ms"):
        if not isinstance(raw.get(key), int | float):
            raise ConfigError(f"{path}: no {key} (not a vllm bench serve result?)")
    if not completed or not isinstance(c, int) or c < 1:
        raise ConfigError(f"{path}: needs completed requests and --max-concurrency (closed loop)")
    if meta.get("gpu") is None:
        raise ConfigError(f"{path}: which GPU? give --gpu, or --metadata gpu=... to vllm bench")
    ins, outs = raw.get("input_lens"), raw.get("output_lens")
    lengths: tuple[tuple[int, int], ...] = ()
    if isinstance(ins, list) and isinstance(outs, list) and len(ins) == len(outs):
        lengths = tuple((int(i), max(1, int(o))) for i, o in zip(ins, outs, strict=True))
    isl = max(1, round(int(raw.get("total_input_tokens") or 0) / completed))
    osl = max(1, round(int(raw.get("total_output_tokens") or 0) / completed))
    return Measurement(
        model=str(meta.get("model") or raw.get("model_id")),
        gpu=str(meta["gpu"]),
        tensor_parallel_size=int(meta.get("tensor_parallel_size") or 1),
        concurrency=c,
        isl=isl,
        osl=osl,
        ttft_ms=float(raw["mean_ttft_ms"]),
        tpot_ms=float(raw["mean_tpot_ms"]),
        quantization=meta.get("quantization"),
        kv_cache_dtype=str(meta.get("kv_cache_dtype") or "auto"),
        num_prompts=completed,
        lengths=lengths,
        gpu_memory_utilization=meta.get("gpu_memory_utilization"),
        source=str(path),
    )


def load_measurements(
    paths: Iterable[str | Path], defaults: Mapping[str, Any]
) -> list[Measurement]:
    """Measurements from CSV tables (the silicon table's columns) and vllm bench JSON files;
    `defaults` fills what a JSON file does not say (model, gpu, tensor_parallel_size...)."""
    out: list[Measurement] = []
    for given in paths:
        path = Path(given)
        if path.suffix.lower() == ".csv":
            rows = silicon_rows(path)
            out += [r for r in rows if _matches(r, defaults)]
            continue
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read measurements {str(path)!r}: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a vllm bench serve result is a JSON object")
        out.append(_bench_json(path, raw, defaults))
    if not out:
        raise ConfigError("no measurement to calibrate against (a CSV's rows must match --model "
                          "and --gpu when given)")  # fmt: skip
    return out


def _matches(row: Measurement, defaults: Mapping[str, Any]) -> bool:
    """A table row is used when it is the model and GPU asked for (if asked)."""
    model, gpu = defaults.get("model"), defaults.get("gpu")
    return (model is None or row.model.lower() == str(model).lower()) and (
        gpu is None or row.gpu == gpu
    )
