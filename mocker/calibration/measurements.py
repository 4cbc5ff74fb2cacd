"""Measured serving runs to compare with: rows of aiconfigurator's silicon table (its columns, in
any CSV) and `vllm bench serve --save-result` JSON files."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mocker.errors import ConfigError
from mocker.jsonfile import read_json_object

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


# The columns a table must have (backend and mode default to vllm and agg).
COLUMNS = ("model_path", "system", "tp_size", "isl", "osl", "batch_size", "silicon_ttft_ms",
           "silicon_tpot_ms")  # fmt: skip


def _number(row: Mapping[str, str | None], key: str, where: str, least: float) -> float:
    try:
        value = float(row.get(key) or "nan")
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= least):
        raise ConfigError(f"{where}: {key}={row.get(key)!r} must be a number >= {least:g}")
    return value


def _silicon_measurement(row: Mapping[str, str | None], where: str) -> Measurement | None:
    """A table row as a Measurement (None: not an aggregated vLLM run; a ConfigError naming
    the row if a value cannot be one)."""
    if (row.get("backend") or "vllm") != "vllm" or (row.get("mode") or "agg") != "agg":
        return None
    tp = _number(row, "tp_size", where, 1)
    c = _number(row, "batch_size", where, 1)
    isl, osl = _number(row, "isl", where, 1), _number(row, "osl", where, 2)
    ttft = _number(row, "silicon_ttft_ms", where, 1e-9)
    tpot = _number(row, "silicon_tpot_ms", where, 1e-9)
    model, system = row.get("model_path") or "", row.get("system") or ""
    if not model or not system:
        raise ConfigError(f"{where}: model_path and system must be given")
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
    pp = _number(row, "pp_size", where, 1) if row.get("pp_size") else 1
    return Measurement(
        model=model,
        gpu=system,
        tensor_parallel_size=int(tp),
        pipeline_parallel_size=int(pp),
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
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if missing:
                raise ConfigError(f"{path}: no column(s) {', '.join(missing)}")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read measurements {str(path)!r}: {exc}") from None
    out = []
    for line, row in enumerate(rows, start=2):  # (line 1 is the header)
        m = _silicon_measurement(row, f"{path}:{line}")
        if m is not None:
            out.append(m)
    return out


def _bench_json(path: Path, raw: dict[str, Any], defaults: Mapping[str, Any]) -> Measurement:
    """A `vllm bench serve --save-result` file: its means, its concurrency and lengths (per
    request with --save-detailed), the deployment from its --metadata or the flags."""
    keys = ("gpu", "tensor_parallel_size", "quantization", "kv_cache_dtype")
    meta: dict[str, Any] = {**defaults, **{k: raw[k] for k in keys if k in raw}}
    for key in ("mean_ttft_ms", "mean_tpot_ms"):
        if key not in raw:
            raise ConfigError(f"{path}: no {key} (not a vllm bench serve result?)")
    # vLLM's --metadata values are strings: numbers are read from their text.
    text = {k: str(v) for k, v in raw.items() if isinstance(v, str | int | float)}
    if raw.get("max_concurrency") is None or not raw.get("completed"):
        raise ConfigError(f"{path}: needs completed requests and --max-concurrency (closed loop)")
    completed = int(_number(text, "completed", str(path), 1))
    c = int(_number(text, "max_concurrency", str(path), 1))
    ttft = _number(text, "mean_ttft_ms", str(path), 1e-9)
    tpot = _number(text, "mean_tpot_ms", str(path), 1e-9)  # (one output token has none)
    if meta.get("gpu") is None:
        raise ConfigError(f"{path}: which GPU? give --gpu, or --metadata gpu=... to vllm bench")
    tp = int(_number({"tensor_parallel_size": str(meta.get("tensor_parallel_size") or 1)},
                     "tensor_parallel_size", str(path), 1))  # fmt: skip
    ins, outs = raw.get("input_lens"), raw.get("output_lens")
    lengths: tuple[tuple[int, int], ...] = ()
    if isinstance(ins, list) and isinstance(outs, list) and len(ins) == len(outs):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in ins + outs):
            raise ConfigError(f"{path}: input_lens and output_lens must be counts >= 1")
        lengths = tuple(zip(ins, outs, strict=True))
    isl = max(1, round(_number(text, "total_input_tokens", str(path), 0) / completed))
    osl = max(2, round(_number(text, "total_output_tokens", str(path), 0) / completed))
    quant, kv = meta.get("quantization"), meta.get("kv_cache_dtype") or "auto"
    if not (quant is None or isinstance(quant, str)) or not isinstance(kv, str):
        raise ConfigError(f"{path}: quantization and kv_cache_dtype must be names")
    return Measurement(
        model=str(meta.get("model") or raw.get("model_id")),
        gpu=str(meta["gpu"]),
        tensor_parallel_size=tp,
        concurrency=c,
        isl=isl,
        osl=osl,
        ttft_ms=ttft,
        tpot_ms=tpot,
        quantization=quant,
        kv_cache_dtype=kv,
        num_prompts=completed,
        lengths=lengths,
        gpu_memory_utilization=None,
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
        raw = read_json_object(path, f"measurements {str(path)!r}")
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
