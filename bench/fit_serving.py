"""How GPU timing's serving correction (`mocker/timing/serving.py`) was fitted: `mocker
calibrate`'s fit on the silicon table's SemiAnalysis InferenceX rows of Llama-3.1-70B on H100
and H200 (the rows whose harness and server flags are public), from the uncorrected kernel data.

Run from the repo root with no arguments: `.venv/bin/python bench/fit_serving.py` (about ten
minutes on two cores). Progress goes to stderr; the last stdout line is one JSON object with
the fitted values and the errors on those rows before (kernel data alone) and after. The
correction's other figures (rows it was not fitted on) are bench/silicon.py's.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from harness import emit, log

from mocker.calibration.fit import fit_correction
from mocker.calibration.measurements import silicon_rows
from mocker.timing import Correction

MODEL = "meta-llama/Llama-3.1-70B"
GPUS = ("h100_sxm", "h200_sxm")
WORKERS = 2


def main() -> int:
    started = time.perf_counter()
    rows = [m for m in silicon_rows() if m.model == MODEL and m.gpu in GPUS]
    log(f"fitting on {len(rows)} rows ({MODEL} on {', '.join(GPUS)}), {WORKERS} workers")
    result = fit_correction(rows, progress=log, jobs=WORKERS, start=Correction())
    c = replace(result.correction, fit={})
    log(f"decode x{c.decode_scale:.4f}, prefill x{c.prefill_scale:.4f}, "
        f"+{c.overhead_ms:.4f} ms a pass, +{c.request_ms:.4f} ms a request")  # fmt: skip
    emit({
        "benchmark": "fit_serving",
        "wall_s": round(time.perf_counter() - started, 1),
        "rows": len(rows),
        "correction": {"decode_scale": round(c.decode_scale, 4),
                       "prefill_scale": round(c.prefill_scale, 4),
                       "overhead_ms": round(c.overhead_ms, 4),
                       "request_ms": round(c.request_ms, 4)},
        "before": result.before,
        "after": result.after,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
