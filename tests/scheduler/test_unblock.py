"""Requests whose KV loaded and that hold the pool while none of them can resume: the newest
give their blocks back until the oldest resumes, and nothing takes those blocks first."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from mocker.kv.block_pool import BlockPool
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.manager import KVCacheManager
from mocker.model_shape import ModelShape
from mocker.request import Request, RequestStatus, SamplingParams
from mocker.scheduler.scheduler import Scheduler
from tests.support.engines import core_request, small_config

BLOCK = 4


class RetryingConnector:
    """A connector whose every lookup answers "retry later" (a promotion in flight, started
    again on each lookup), so it always has something pending; no device block is in
    flight."""

    has_pending = True
    num_loading = 0
    stores_in_flight = False
    sync_loads = None  # (vLLM's own loads: between passes)
    policy = SimpleNamespace(has_staged=False)  # its store policy: nothing staged

    def num_matched_blocks(self, request: Request, num_device_blocks: int) -> int | None:
        return None


def make_scheduler(num_blocks: int, connector: Any = None) -> tuple[Scheduler, KVCacheManager]:
    config = small_config(num_gpu_blocks=num_blocks, max_num_batched_tokens=64)
    kv = KVCacheManager(BlockPool(num_blocks, BLOCK, enable_caching=False))
    return Scheduler(config, kv, connector), kv


def request(rid: str, num_tokens: int) -> Request:
    return core_request(rid, range(num_tokens), 4, SamplingParams(ignore_eos=True))


def loaded(sched: Scheduler, kv: KVCacheManager, rid: str, num_tokens: int, blocks: int) -> Request:
    """A request whose load of `blocks` blocks ended: it holds them and waits to resume."""
    r = request(rid, num_tokens)
    assert kv.allocate_slots(r, blocks * BLOCK)
    r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
    r.load_hits = (0, blocks * BLOCK)
    sched.loading.add(r)
    kv.finish_load(r)
    sched.resume(r)
    return r


def test_released_requests_wait_until_the_oldest_loaded_one_resumes() -> None:
    sched, kv = make_scheduler(12)
    # a needs 8 more blocks, 2 are free: b and c must both give theirs back.
    a = loaded(sched, kv, "a", 40, 2)
    b = loaded(sched, kv, "b", 20, 4)
    c = loaded(sched, kv, "c", 20, 4)
    out = sched.schedule()
    # c, released first, fits the room its release made, but is not admitted again ahead
    # of a (it would take a's blocks back, and a would wait for ever).
    assert out.num_scheduled == {a: 32} and out.loads == []
    assert list(sched.waiting) == [b, c] and sched.ready == []
    assert b.blocks == [] and c.blocks == [] and b.num_computed_tokens == 0


def test_a_fresh_request_waits_behind_a_loaded_one() -> None:
    sched, kv = make_scheduler(12)
    running = request("r", 24)
    sched.add(running)
    assert sched.schedule().num_scheduled == {running: 24}  # 6 blocks
    running.num_computed_tokens = 24
    a = loaded(sched, kv, "a", 24, 2)  # needs 4 more blocks, 4 are free
    fresh = request("w", 8)
    sched.add(fresh)
    running.append_output_token(1)  # its next decode needs a 7th block: 3 are left
    out = sched.schedule()
    # As vLLM stops at the first waiting request it cannot allocate: the fresh one, which
    # would fit, does not take the blocks the loaded one waits for.
    assert out.num_scheduled == {running: 1} and list(sched.waiting) == [fresh]
    assert sched.ready == [a]


def test_a_retried_promotion_does_not_keep_loaded_requests_waiting() -> None:
    sched, kv = make_scheduler(12, RetryingConnector())
    waiting = request("p", 16)  # its lookup answers "retry later" on every pass
    sched.add(waiting)
    a = loaded(sched, kv, "a", 40, 4)  # needs 6 more blocks, 2 are free
    b = loaded(sched, kv, "b", 28, 6)
    out = sched.schedule()
    # The connector is busy with a promotion, which frees no device block: b gives its
    # blocks back at once and a resumes.
    assert out.num_scheduled == {a: 24}
    assert list(sched.waiting) == [b, waiting]


def test_a_loaded_request_resumes_before_a_fresh_one_in_every_group() -> None:
    # The rule for a hybrid model (sliding window 8 + full attention, block 4): the
    # loaded request's tables grow in both groups, so it needs two blocks per position.
    shape = ModelShape(num_layers=2, num_kv_heads=1, head_dim=8, layer_types=(
        "sliding_attention", "full_attention"), sliding_window=8)  # fmt: skip
    config = small_config(model=shape, num_gpu_blocks=24, max_num_batched_tokens=64)
    pool = BlockPool(24, BLOCK, enable_caching=False, groups=config.layout.groups)
    kv = HybridKVCacheManager(pool, config.layout)
    sched = Scheduler(config, kv)
    running = request("r", 24)
    sched.add(running)
    assert sched.schedule().num_scheduled == {running: 24}  # 6 positions × 2 groups: 12
    running.num_computed_tokens = 24
    a = request("a", 24)  # its load of 2 positions (4 blocks) ended
    assert kv.allocate_slots(a, 2 * BLOCK)
    a.status = RequestStatus.WAITING_FOR_REMOTE_KVS
    a.load_hits = (0, 2 * BLOCK)
    sched.loading.add(a)
    kv.finish_load(a)
    sched.resume(a)
    assert pool.num_used == 16
    fresh = request("w", 8)  # 2 positions: 4 blocks
    sched.add(fresh)
    running.append_output_token(1)  # its next decode needs a 7th position: 2 blocks
    out = sched.schedule()
    # r first releases the sliding blocks wholly before 24 − 8 + 1 = 17 (positions 0..3: 4
    # blocks), then takes 2: 14 in use, 10 free. a needs 4 more positions (8 blocks) and goes
    # before the fresh request, which would have fitted first (4 blocks) and left a short.
    assert out.num_scheduled == {running: 1, a: 16} and list(sched.waiting) == [fresh]
    assert sched.ready == [] and pool.num_used == 22
