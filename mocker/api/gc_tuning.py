"""The cyclic garbage collector as the server runs it: start-up objects frozen, collections of
the requests in flight rare."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["MIDDLE_THRESHOLD", "YOUNG_THRESHOLD", "serving_gc"]

# Allocations (net of frees) between young collections while serving (CPython's default is
# 700), and young collections between collections of the middle generation (CPython's: 10).
# A young collection walks the objects made since the last one: a few thousand were made
# moments ago and are still in the CPU's caches, so the walk is cheap. What survives it (the
# objects of the requests in flight: ~100 a stream) goes to the middle generation, whose
# collection walks all of it from memory, ~0.4 us an object: 20 ms at 500 streams. Measured
# in-process (uvicorn's protocol and the app on stand-in transports, 500 streams of 2 and of
# 200 tokens, one core, a gc.callbacks timer): young collections every 50,000 allocations
# (each one such walk) cost 36 us of collector a request, and every 700 with the middle
# generation every 10 cost 97 (the middle and the full collections); every 2,000 with the
# middle generation every 1,000 cost 9-11 us, and a request's whole CPU time went 193 -> 145
# us (2 tokens) and 318 -> 288 us (200 tokens). (Instruction counts, which an earlier choice
# of 50,000 rested on, do not see cache misses.) Streams leave no garbage cycles
# (tests/api/test_responses.py), so the middle collections find little; they still run, for
# what errors and disconnects leave.
YOUNG_THRESHOLD = 2_000
MIDDLE_THRESHOLD = 1_000


@contextmanager
def serving_gc() -> Iterator[None]:
    """For the server's lifetime: everything built so far frozen out of the collector's
    walks (KV blocks, tokenizer tables, routes: full collections over them stalled every
    stream for 100+ ms, and vLLM freezes its heap after start-up too), young collections
    every YOUNG_THRESHOLD allocations and middle ones every MIDDLE_THRESHOLD young ones
    (higher thresholds already set stay). The thresholds are restored after; automatic
    collection that was off (threshold 0) stays off."""
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    if before[0]:
        gc.set_threshold(
            max(before[0], YOUNG_THRESHOLD), max(before[1], MIDDLE_THRESHOLD), *before[2:]
        )
    try:
        yield
    finally:
        gc.set_threshold(*before)
