"""Histograms as plain counts, with vLLM's bucket bounds for every histogram it exports."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from functools import cache

from prometheus_client.utils import floatToGoString

# Go's float formatting, as Prometheus prints bucket bounds (the library leaves it untyped).
_go_float: Callable[[float], str] = floatToGoString

__all__ = [
    "BUCKETS",
    "ITERATION_TOKEN_BUCKETS",
    "ITL_BUCKETS",
    "NIXL_BYTES_BUCKETS",
    "NIXL_DESCRIPTORS_BUCKETS",
    "NIXL_XFER_TIME_BUCKETS",
    "PARAMS_N_BUCKETS",
    "PREEMPTION_BUCKETS",
    "REQUEST_TIME_BUCKETS",
    "TRANSFER_SIZE_BUCKETS",
    "TTFT_BUCKETS",
    "Histogram",
    "bound_texts",
    "one_two_five_buckets",
]

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_TIME_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                        60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
TRANSFER_SIZE_BUCKETS = (1e6, 5e6, 1e7, 2e7, 4e7, 6e7, 8e7, 1e8, 1.5e8, 2e8)
# vLLM 0.34's tiering promotion latency (TieringOffloadingSpec), seconds.
PROMOTION_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                             60.0)  # fmt: skip
# vLLM's NixlPromMetrics (nixl/stats.py): transfer seconds, bytes (2^(10+i), i = 1, 3, .. 23)
# and descriptors per transfer.
NIXL_XFER_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 24, 2))
NIXL_DESCRIPTORS_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000,
                            50000)  # fmt: skip

BUCKETS = {
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "request_time": REQUEST_TIME_BUCKETS,
    "iteration_tokens": ITERATION_TOKEN_BUCKETS,
    "preemptions": PREEMPTION_BUCKETS,
    "params_n": PARAMS_N_BUCKETS,
    "transfer_size": TRANSFER_SIZE_BUCKETS,
    "nixl_xfer_time": NIXL_XFER_TIME_BUCKETS,
    "nixl_bytes": NIXL_BYTES_BUCKETS,
    "nixl_descriptors": NIXL_DESCRIPTORS_BUCKETS,
}


def one_two_five_buckets(limit: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, … up to `limit` (vLLM's token-count buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > limit:
                return tuple(out)
            out.append(value)
        exponent += 1


@cache
def bound_texts(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """Bucket bounds as `le` label values (Go's float format), `+Inf` last: formatted once
    per set of bounds, not at every scrape."""
    return (*map(_go_float, bounds), "+Inf")


class Histogram:
    """Bucket counts; `observe(v, n)` records n equal observations at once."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n  # le: value <= bound
        self.total += value * n

    def observe_each(self, values: Iterable[float]) -> None:
        """`observe(v)` for each value in order (the same sum, bit for bit), in one call: a
        pass's inter-token latencies are mostly one value, found in the buckets once."""
        counts, bounds, total = self.counts, self.bounds, self.total
        last, index = None, 0
        for value in values:
            if value != last:
                last, index = value, bisect_left(bounds, value)
            counts[index] += 1
            total += value
        self.total = total

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip(bound_texts(self.bounds), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out
