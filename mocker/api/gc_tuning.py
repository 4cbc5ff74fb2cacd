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
# collection walks all of it from memory, a long stall with hundreds of streams open. Young
# collections every 2,000 allocations keep their walks in the caches; far rarer ones walk
# memory like the middle ones, and CPython's 700 with its middle generation every 10 walks
# the streams' objects too often (timed with a gc.callbacks timer on 500 streams; instruction
# counts do not see the cache misses). Streams leave no garbage cycles
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
