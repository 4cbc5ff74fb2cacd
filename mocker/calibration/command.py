"""`mocker calibrate`: fit a correction profile to a user's own measurements and report the error
before and after it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mocker.calibration.fit import fit_correction
from mocker.calibration.measurements import load_measurements
from mocker.errors import ConfigError

__all__ = ["add_calibrate_parser", "run_calibrate"]


def add_calibrate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit a timing correction to your own measurements (vllm bench serve results, or "
        "rows in aiconfigurator's silicon table columns)",
        description="Replay each measured closed loop through the engine, fit the decode and "
        "prefill scales, a fixed cost per pass and a cost per request in a pass that bring its "
        "mean TTFT and TPOT closest to the measured ones, write them as a correction profile "
        "(load it with --timing-profile FILE) and print the error before and after.",
    )
    p.add_argument(
        "measurements",
        nargs="+",
        metavar="FILE",
        help="`vllm bench serve --save-result` JSON (closed loop: --max-concurrency), or a CSV "
        "with the silicon table's columns (backend, model_path, system, tp_size, isl, osl, "
        "batch_size, silicon_ttft_ms, silicon_tpot_ms, ...)",
    )
    p.add_argument(
        "--output", default="timing-correction.json", metavar="FILE",
        help="where the correction profile goes (timing-correction.json)",
    )  # fmt: skip
    p.add_argument("--model", default=None, help="the model (for JSON results; filters a CSV)")
    p.add_argument("--gpu", default=None, help="the GPU (for JSON results; filters a CSV)")
    p.add_argument("--tensor-parallel-size", type=int, default=None, metavar="N")
    p.add_argument("--quantization", default=None, metavar="METHOD")
    p.add_argument("--kv-cache-dtype", default=None, metavar="DTYPE")
    p.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
        help="replay the measurements in N processes (this machine's cores)",
    )  # fmt: skip


def run_calibrate(args: argparse.Namespace) -> int:
    given = {"model": args.model, "gpu": args.gpu, "quantization": args.quantization,
             "tensor_parallel_size": args.tensor_parallel_size,
             "kv_cache_dtype": args.kv_cache_dtype}  # fmt: skip
    defaults = {k: v for k, v in given.items() if v is not None}
    for path in args.measurements:
        if not Path(path).is_file():
            raise ConfigError(f"invalid measurements={path!r}: no such file")
    folder = Path(args.output).resolve().parent
    if not (folder.is_dir() and os.access(folder, os.W_OK)) or Path(args.output).is_dir():
        raise ConfigError(f"invalid output={args.output!r}: not a file that can be written")
    if args.jobs < 1:
        raise ConfigError(f"invalid jobs={args.jobs!r}: must be >= 1")
    rows = load_measurements(args.measurements, defaults)
    print(f"mocker: calibrating on {len(rows)} measurement(s)", file=sys.stderr)
    result = fit_correction(rows, progress=lambda line: print(f"mocker: {line}", file=sys.stderr),
                            jobs=args.jobs)  # fmt: skip
    c = result.correction
    Path(args.output).write_text(c.to_json())
    print(f"{'':<10}{'TTFT median':>12}{'mean':>8}{'TPOT median':>13}{'mean':>8}")
    for name, s in (("before", result.before), ("after", result.after)):
        print(f"{name:<10}{s['ttft_median_ape']:>12.1%}{s['ttft_mean_ape']:>8.1%}"
              f"{s['tpot_median_ape']:>13.1%}{s['tpot_mean_ape']:>8.1%}")  # fmt: skip
    print(f"decode x{c.decode_scale:.3f}, prefill x{c.prefill_scale:.3f}, "
          f"+{c.overhead_ms:.2f} ms a pass, +{c.request_ms:.3f} ms a request: wrote "
          f"{args.output} (use --timing-profile {args.output})")  # fmt: skip
    return 0
