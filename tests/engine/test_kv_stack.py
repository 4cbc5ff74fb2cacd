"""KV stack assembly: which parts an engine config gives, and the store policy's knobs."""

from __future__ import annotations

from typing import Any

from mocker.engine.kv_stack import KVStack, build_kv_stack
from mocker.kv.manager import KVCacheManager
from mocker.tiers.lru import LruTier
from mocker.tiers.store_policy import WriteBack, WriteThrough
from mocker.timing import PolynomialTiming
from tests.support.engines import small_config


def _stack(**changes: Any) -> KVStack:
    return build_kv_stack(small_config(**changes), PolynomialTiming().prefill_ms)


def test_device_only_without_a_host_tier() -> None:
    stack = _stack()
    assert stack.cpu is None and stack.connector is None
    assert isinstance(stack.kv, KVCacheManager)  # a dense model's manager
    assert stack.kv.pool is stack.pool and stack.pool.num_blocks == 64


def test_write_back_copies_ahead_an_eighth_of_the_pool_at_most() -> None:
    stack = _stack(num_cpu_blocks=32, max_num_batched_tokens=64)
    assert stack.cpu is not None and stack.connector is not None
    assert stack.cpu.capacity == 32 and stack.connector.cpu is stack.cpu
    policy = stack.connector.policy
    assert isinstance(policy, WriteBack) and stack.connector.write_back
    assert policy.evict_ahead == min(64 // 4, 64 // 8)


def test_write_through_is_the_other_store_policy() -> None:
    stack = _stack(num_cpu_blocks=32, offload_policy="write-through")
    assert stack.connector is not None and not stack.connector.write_back
    assert isinstance(stack.connector.policy, WriteThrough)


def test_a_tier_given_from_outside_is_used_and_can_be_shared() -> None:
    shared = LruTier(100, 16)
    config = small_config(offload_policy="write-through")
    a = build_kv_stack(config, PolynomialTiming().prefill_ms, cpu=shared)
    b = build_kv_stack(config, PolynomialTiming().prefill_ms, cpu=shared)
    assert a.cpu is b.cpu is shared and a.pool is not b.pool
    assert a.connector is not None and a.connector.cpu is shared
