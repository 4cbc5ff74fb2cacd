"""KV stack assembly: which parts an engine config gives, and the offload policy's knobs."""

from __future__ import annotations

from typing import Any

from mocker.engine.kv_stack import KVStack, build_kv_stack
from mocker.timing import PolynomialTiming
from tests.support.engines import small_config


def _stack(**changes: Any) -> KVStack:
    return build_kv_stack(small_config(**changes), PolynomialTiming().prefill_ms)


def test_device_only_without_a_host_tier() -> None:
    stack = _stack()
    assert stack.host is None and stack.offload is None
    assert stack.kv.pool is stack.pool and stack.pool.num_blocks == 64
    assert not stack.write_through and stack.evict_ahead == 0


def test_offload_on_eviction_copies_ahead_an_eighth_of_the_pool_at_most() -> None:
    stack = _stack(num_host_blocks=32, max_num_batched_tokens=64)
    assert stack.host is not None and stack.offload is not None
    assert stack.pool.offload_on_evict and not stack.write_through
    assert stack.evict_ahead == min(64 // 4, 64 // 8)


def test_write_through_leaves_eviction_plain() -> None:
    stack = _stack(num_host_blocks=32, offload_policy="write-through")
    assert stack.write_through and stack.evict_ahead == 0
    assert not stack.pool.offload_on_evict
