"""splitmix64: the one 64-bit mixer behind generated tokens and replayed prompts."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["GOLDEN", "MASK64", "splitmix64", "splitmix64_array"]

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / φ: splitmix64's increment


def splitmix64(x: int) -> int:
    """Distinct (even consecutive) inputs give independent-looking 64-bit outputs."""
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def splitmix64_array(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """`splitmix64` over a uint64 array (numpy's wrapping arithmetic is the masked one)."""
    if x.ndim == 0:  # numpy warns when a scalar wraps around; arrays wrap silently
        with np.errstate(over="ignore"):
            return _mix(x)
    # (No errstate for arrays: entering one costs more than mixing a short array, and the
    # replay mixes one per prompt and per run of decode passes.)
    return _mix(x)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    x = x + np.uint64(GOLDEN)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
