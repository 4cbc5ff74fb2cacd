"""Scheduling passes: chunked prefill splits, budget sharing, preemption victims, prefix cap."""

from dataclasses import replace

import pytest

from mocker.engine.core import EngineCore
from mocker.kv.events import BlockStored
from mocker.request import EngineRequest, RequestStatus
from tests.support.engines import make_core, req


def _scheduled(core: EngineCore, now: float = 0.0) -> dict[str, int]:
    """Run one pass; return tokens computed per request in it."""
    before = {rid: r.num_computed_tokens for rid, r in core.requests.items()}
    requests = dict(core.requests)
    core.step(now)
    return {
        rid: r.num_computed_tokens - before[rid]
        for rid, r in requests.items()
        if r.num_computed_tokens != before[rid] and r.status != RequestStatus.PREEMPTED
    }


def test_chunked_prefill_splits_by_budget() -> None:
    core = make_core()  # budget 32, block 4
    core.add_request(req("a", range(80), max_tokens=2))
    r = core.requests["a"]
    res = core.step(0.0)
    assert res.stats.prompt_tokens_computed == 32 and res.outputs == []
    res = core.step(res.end)
    assert res.stats.prompt_tokens_computed == 32 and res.outputs == []
    res = core.step(res.end)
    assert res.stats.prompt_tokens_computed == 16
    assert [o.new_token_ids for o in res.outputs] == [r.output_token_ids]
    assert r.num_computed_tokens == 80 and r.num_tokens == 81


def test_long_prefill_token_threshold_caps_each_chunk() -> None:
    """vLLM's long_prefill_token_threshold: no prefill chunk longer, first or later, with a
    prefix hit or not; decodes and the budget's other users go on beside it."""
    core = make_core(long_prefill_token_threshold=12)  # budget 32, block 4
    core.add_request(req("a", range(40), max_tokens=2))
    core.add_request(req("b", [7] * 6, max_tokens=8))
    assert _scheduled(core) == {"a": 12, "b": 6}  # (b is short: not capped)
    now = core.time
    chunks = []
    while core.requests["a"].num_computed_tokens < 40:
        done = _scheduled(core, now)
        chunks.append(done["a"])
        assert done["b"] == 1  # b decodes in every pass beside the chunks
        now = core.time
    assert chunks == [12, 12, 4]
    # A prompt that hits the cache (a's 40 tokens) is capped past its hit.
    core.add_request(req("c", [*range(40), *range(100, 130)], max_tokens=2))
    assert _scheduled(core, now)["c"] == 40 + 12


def test_decodes_and_prefill_share_one_budget() -> None:
    core = make_core()
    for i in range(3):
        core.add_request(req(f"d{i}", [100 + i] * 8, max_tokens=10))
    core.step(0.0)  # 24 prompt tokens for three requests: all admitted
    core.add_request(req("p", range(40), max_tokens=2))
    got = _scheduled(core)
    assert got == {"d0": 1, "d1": 1, "d2": 1, "p": 29}
    assert _scheduled(core) == {"d0": 1, "d1": 1, "d2": 1, "p": 11}


def test_max_num_seqs_caps_running() -> None:
    core = make_core(max_num_seqs=2)
    for i in range(3):
        core.add_request(req(f"r{i}", [i] * 4))
    got = _scheduled(core)
    assert set(got) == {"r0", "r1"} and core.num_running == 2 and core.num_waiting == 1


def test_without_chunking_a_prompt_waits_for_room() -> None:
    core = make_core(enable_chunked_prefill=False, max_model_len=64, max_num_batched_tokens=64)
    for i in range(3):
        core.add_request(req(f"d{i}", [7 + i] * 8, max_tokens=3))
    core.step(0.0)
    core.add_request(req("big", range(62), max_tokens=1))
    # 3 decodes leave 61 tokens of budget: the 62-token prompt is not split; it waits.
    assert _scheduled(core) == {"d0": 1, "d1": 1, "d2": 1}
    assert core.requests["big"].status == RequestStatus.WAITING
    assert _scheduled(core) == {"d0": 1, "d1": 1, "d2": 1}  # d* finish in this pass
    assert _scheduled(core) == {"big": 62}


def _two_growing_requests(victim: str) -> EngineCore:
    # 6 blocks of 4 tokens; two 8-token prompts; each decode crossing a block boundary
    # needs a new block, so the third block each (tokens 9..12) fills the pool.
    core = make_core(num_gpu_blocks=6, preemption_victim=victim)
    core.add_request(req("old", [1] * 8, max_tokens=16))
    core.add_request(req("new", [2] * 8, max_tokens=16))
    now = 0.0
    while core.scheduler.num_preemptions == 0:
        now = core.step(now).end
    return core


def test_preemption_victim_newest_by_default() -> None:
    core = _two_growing_requests("newest")
    new = core.requests["new"]
    assert new.status == RequestStatus.PREEMPTED and new.num_preemptions == 1
    assert new.blocks == [] and new.num_computed_tokens == 0
    assert core.requests["old"].status == RequestStatus.RUNNING
    assert next(iter(core.scheduler.waiting)) is new  # back at the front of waiting


def test_preemption_victim_oldest_as_option() -> None:
    core = _two_growing_requests("oldest")
    assert core.requests["old"].status == RequestStatus.PREEMPTED
    assert core.requests["new"].status == RequestStatus.RUNNING


def test_preempted_request_recomputes_and_keeps_its_outputs() -> None:
    core = _two_growing_requests("newest")
    new = core.requests["new"]
    kept = list(new.output_token_ids)
    assert kept  # it had generated before it was preempted
    now = 10.0
    while "new" in core.requests:
        now = core.step(now).end
    assert new.output_token_ids[: len(kept)] == kept
    assert new.num_output_tokens == 16 and new.status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_a_leading_decode_is_preempted_for_a_prefill_behind_it() -> None:
    # d0 and d1 decode inside blocks they hold, then p's second prompt chunk needs two
    # blocks of a full pool: the oldest running request, d0, already scheduled for this
    # pass, gives them up, and its token comes off the pass: the pass is d1's decode and
    # p's chunk, timed as such.
    core = make_core(num_gpu_blocks=12, preemption_victim="oldest")  # budget 32, block 4
    core.add_request(req("d0", [1] * 5, max_tokens=8))
    core.add_request(req("d1", [2] * 5, max_tokens=8))
    now = core.step(0.0).end  # both prefilled (2 blocks each), first tokens sampled
    core.add_request(req("p", range(40), max_tokens=2))
    before = core.requests["p"].num_computed_tokens
    res = core.step(now)  # d0, d1 decode; p's first chunk, 30 tokens: 8 blocks, pool full
    assert core.requests["p"].num_computed_tokens - before == 30 and core.kv.num_reusable == 0
    d0, d1, p = (core.requests[r] for r in ("d0", "d1", "p"))
    d1_before, p_before = d1.num_computed_tokens, p.num_computed_tokens
    res = core.step(res.end)
    assert (d1.num_computed_tokens - d1_before, p.num_computed_tokens - p_before) == (1, 10)
    assert d0.status == RequestStatus.PREEMPTED and d0.blocks == []
    assert core.scheduler.num_preemptions == 1
    # Timed as one decode and a 10-token chunk (d0's decode was taken off the pass).
    duration = core.pass_duration(10, 1, core.kv.num_used, prefill_requests=1,
                                  prefill_context=p_before, decode_context=0)  # fmt: skip
    assert res.end - res.start == pytest.approx(duration)


def test_prefix_hit_capped_at_prompt_minus_one() -> None:
    core = make_core()
    core.add_request(req("warm", range(12), max_tokens=1))
    now = core.step(0.0).end  # caches 3 full blocks, finishes
    core.add_request(req("same", range(12), max_tokens=1))
    core.add_request(req("longer", [*range(12), 99], max_tokens=1))
    res = core.step(now)
    cached = {o.request_id: o.num_cached_tokens for o in res.outputs}
    # 12 tokens = 3 full blocks, but the last token must be computed: 2 blocks hit.
    assert cached == {"same": 8, "longer": 12}
    assert (res.stats.prefix_queries, res.stats.prefix_hits) == (25, 20)
    assert res.stats.prompt_tokens_computed == 4 + 1


def test_a_request_admitted_later_in_the_same_pass_hits_the_blocks_scheduled_before_it() -> None:
    """vLLM's allocate_slots registers the full blocks a pass will compute before the forward
    pass: a second request with the prefix (a choice of n, a burst of one system prompt),
    admitted in the same pass, hits them and computes only its tail."""
    core = make_core(enable_kv_cache_events=True)  # budget 32, block 4
    core.add_request(req("first", range(20), max_tokens=2))
    core.add_request(req("second", [*range(16), 90, 91], max_tokens=2))
    res = core.step(0.0)
    cached = {o.request_id: o.num_cached_tokens for o in res.outputs}
    assert cached == {"first": 0, "second": 16}
    assert res.stats.prompt_tokens_computed == 20 + 2
    assert (res.stats.prefix_queries, res.stats.prefix_hits) == (38, 16)
    # The first's 5 blocks are published once, in the pass that registered them; the second
    # adds its one full block of its own.
    stored = [len(e.block_hashes) for e in res.kv_events if isinstance(e, BlockStored)]
    assert sum(stored) == 5 + 0 and core.pool.num_used == 5 + 1
    # A chunk of a running prefill is registered as it is scheduled too: a request admitted
    # behind it hits the chunk's blocks in that pass.
    core = make_core()
    core.add_request(req("long", range(60), max_tokens=1))
    now = core.step(0.0).end  # its first 32 tokens
    core.add_request(req("late", [*range(48), 99], max_tokens=1))
    res = core.step(now)  # long's next 28 tokens, then late: 12 blocks hit (48 tokens)
    assert {o.request_id: o.num_cached_tokens for o in res.outputs} == {"long": 0, "late": 48}


def test_a_victim_scheduled_earlier_in_the_pass_leaves_no_uncomputed_block_registered() -> None:
    """With --preemption-victim oldest (or the priority policy) the victim may have been
    scheduled earlier in the pass: the blocks its chunk would have filled were never
    computed, so they are not registered, and it recomputes them when it runs again."""
    core = make_core(num_gpu_blocks=14, max_num_batched_tokens=64,
                     long_prefill_token_threshold=16, preemption_victim="oldest")  # fmt: skip
    core.add_request(req("A", range(1000, 1048), max_tokens=1))  # chunks of 16 tokens
    core.add_request(req("B", range(7), max_tokens=3))
    a = core.requests["A"]
    computed, now, cached_after_preemption = 0, 0.0, None
    while core.requests:
        result = core.step(now)
        now = result.end
        computed += result.stats.prompt_tokens_computed
        if result.stats.num_preemptions and cached_after_preemption is None:
            cached_after_preemption = len(core.pool.lookup_prefix(a.block_hashes))
    # A's third chunk was scheduled, then A was preempted for B's next block: only its first
    # two chunks (8 blocks) were computed, and only they are cached.
    assert core.scheduler.num_preemptions == 1 and cached_after_preemption == 8
    # A's two chunks and B's prompt; then A again: 32 tokens hit, its last 16 computed.
    assert computed == 16 + 7 + 16 + 16


def _lora_req(rid: str, lora: str | None, max_tokens: int = 5) -> EngineRequest:
    spec = req(rid, [ord(rid[-1])] * 8, max_tokens=max_tokens)
    return replace(spec, lora_name=lora)


def test_max_loras_skips_a_request_whose_adapter_would_exceed_it_not_the_queue() -> None:
    """vLLM's rule: with max_loras adapters running, a waiting request for another adapter
    waits; requests behind it for a running adapter, or for the base model, go on."""
    core = make_core(enable_lora=True, max_loras=2)
    core.add_request(_lora_req("a1", "A"))
    core.add_request(_lora_req("b1", "B"))
    core.add_request(_lora_req("c1", "C"))  # a third adapter: over max_loras
    core.add_request(_lora_req("a2", "A"))  # the same adapter as a running one
    core.add_request(_lora_req("n1", None))  # the base model
    assert set(_scheduled(core)) == {"a1", "b1", "a2", "n1"}
    assert core.requests["c1"].status == RequestStatus.WAITING
    now = 0.0
    while "c1" in core.requests and core.requests["c1"].status == RequestStatus.WAITING:
        now = core.step(now).end  # until an adapter's requests have all finished
    running = {r.lora_name for r in core.scheduler.running if r.lora_name}
    assert "C" in running and len(running) <= 2


def test_without_lora_enabled_adapters_are_not_limited() -> None:
    core = make_core(max_loras=1)
    for rid, lora in (("a1", "A"), ("b1", "B"), ("c1", "C")):
        core.add_request(_lora_req(rid, lora))
    assert set(_scheduled(core)) == {"a1", "b1", "c1"}


def test_a_resumed_request_waiting_for_an_adapter_slot_does_not_hold_the_queue() -> None:
    """A request whose KV loaded from the CPU tier but whose adapter has no slot waits; fresh
    requests for the running adapter or the base model are admitted meanwhile (vLLM sends
    it back through the waiting loop, where the same rule skips it)."""
    core = make_core(enable_lora=True, max_loras=1)
    core.add_request(_lora_req("a1", "A", max_tokens=30))
    core.step(0.0)
    blocked = core.requests["a1"]
    resumed = _lora_req("b2", "B")
    core.add_request(resumed)
    request = core.requests["b2"]
    core.scheduler.waiting.remove(request)  # as if its tier load had just ended
    core.scheduler.ready.append(request)
    core.add_request(_lora_req("a3", "A"))
    core.add_request(_lora_req("n4", None))
    got = _scheduled(core, 1.0)
    assert {"a3", "n4"} <= set(got) and "b2" not in got
    assert blocked.status == RequestStatus.RUNNING


def test_requests_passed_over_for_an_adapter_slot_wait_deferred() -> None:
    # vLLM 0.34's num_requests_waiting_by_reason: a request its LoRA budget skips is
    # "deferred", one that waits for room is "capacity".
    core = make_core(enable_lora=True, max_loras=1, max_num_seqs=2)
    for rid, lora in (("a1", "A"), ("b2", "B"), ("b3", "B"), ("a4", "A"), ("a5", "A")):
        core.add_request(_lora_req(rid, lora, max_tokens=30))
    core.step(0.0)  # a1 and a4 run; b2 and b3 are passed over; a5 finds no seat
    snapshot = core.snapshot()
    assert (snapshot.num_running, snapshot.num_waiting, snapshot.num_deferred) == (2, 3, 2)
