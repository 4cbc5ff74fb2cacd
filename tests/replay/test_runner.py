"""Replay on the virtual clock: hand-computed timings, prefix and host hits, preemption,
rejections, routing policies, determinism, and agreement with the single-engine driver."""

from __future__ import annotations

import itertools
import tracemalloc
from typing import Any

import pytest

from mocker.config import ConfigError, EngineConfig
from mocker.engine import decode_runs
from mocker.engine.core import EngineCore
from mocker.engine.decode_batch import DecodeRun
from mocker.engine.decode_runs import DecodeRuns, run_decodes
from mocker.engine.virtual import VirtualDriver
from mocker.replay.records import ReplayResult
from mocker.replay.runner import replay
from mocker.replay.trace import SyntheticSpec, TraceRequest, synthetic_trace
from mocker.request import EngineRequest, SamplingParams
from mocker.storage_spec import StorageKind, StorageTierSpec
from mocker.timing import PolynomialTiming
from tests.support.checks import not_none
from tests.support.pools import free_order

BS = 16
TBS = 64  # tokens per trace hash id in these tests
MODEL = PolynomialTiming()
FS_TIER = StorageTierSpec(StorageKind.FS, 400, 1.0, 0.5, 0.2)
SHARED_OBJ = StorageTierSpec(StorageKind.OBJ, 600, 2.0, 1.0, 0.5)


def config(**changes: Any) -> EngineConfig:
    base: dict[str, Any] = {"block_size": BS, "num_gpu_blocks": 256, "max_model_len": 2048}
    base.update(changes)
    return EngineConfig.of(**base)


def run(trace: list[TraceRequest], cfg: EngineConfig, **kw: Any) -> ReplayResult:
    return replay(trace, cfg, trace_block_size=TBS, **kw)


def prefill_s(tokens: int) -> float:
    return MODEL.prefill_ms(tokens) / 1000


def decode_s(used_blocks: int, total_blocks: int, num_decodes: int = 1) -> float:
    return MODEL.decode_ms(used_blocks * BS, total_blocks * BS, num_decodes) / 1000


def test_one_request_by_hand() -> None:
    trace = [TraceRequest(0.5, 100, 3, (7, 8), 1)]
    (r,) = run(trace, config()).records
    # One prefill pass of 100 tokens gives the first token; two decode passes follow with
    # the request's 7 blocks (101 and 102 tokens) in use out of 256.
    assert r.status == "finished" and r.output_tokens == 3 and r.line == 1
    assert r.admit == 0.5
    assert r.ttft == pytest.approx(prefill_s(100), abs=1e-12)
    assert r.mean_itl == pytest.approx(decode_s(7, 256), abs=1e-12)
    assert r.e2e == pytest.approx(prefill_s(100) + 2 * decode_s(7, 256), abs=1e-12)
    assert (r.cached_tokens_device, r.cached_tokens_by_tier, r.preemptions) == (0, {}, 0)


def test_two_requests_sharing_a_prefix() -> None:
    # Both start with hash ids 1, 2 (128 tokens = 8 blocks); the second arrives after the
    # first has finished and finds those blocks cached.
    trace = [TraceRequest(0.0, 150, 2, (1, 2, 3), 1), TraceRequest(5.0, 140, 2, (1, 2, 9), 2)]
    first, second = run(trace, config()).records
    assert first.cached_tokens_device == 0
    assert second.cached_tokens_device == 128
    assert second.ttft == pytest.approx(prefill_s(140 - 128), abs=1e-12)


def test_preemption_by_hand() -> None:
    # Six blocks, no prefix cache. A (40 out) and B (20 out) prefill 32 tokens each in pass
    # 1 (2 blocks each); pass 2 gives each a third block (pool full). At pass 18 A's token
    # 48 needs a 4th block: B, the newest, is preempted with 17 tokens out (3 blocks back).
    # A decodes alone (4 blocks; pass p computes position 30 + p, so a 5th block from pass
    # 34, position 64) to its 40th token at pass 40. B's 49
    # tokens need 4 blocks, so it waits for A's; then one prefill pass of 49 and two decodes.
    cfg = config(num_gpu_blocks=6, max_model_len=256, enable_prefix_caching=False)
    trace = [TraceRequest(0.0, 32, 40, (1,), 1), TraceRequest(0.0, 32, 20, (2,), 2)]
    a, b = run(trace, cfg).records
    t1 = prefill_s(64)
    a_end = t1 + 16 * decode_s(6, 6, 2) + 16 * decode_s(4, 6) + 7 * decode_s(5, 6)
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert a.ttft == b.ttft == pytest.approx(t1, abs=1e-12)
    assert a.finish == pytest.approx(a_end, abs=1e-12)
    assert b.finish == pytest.approx(a_end + prefill_s(49) + 2 * decode_s(4, 6), abs=1e-12)
    assert b.admit == 0.0  # the first admission; its output restarts where it stopped


def test_preemption_under_a_tiny_pool() -> None:
    trace = [TraceRequest(0.0, 60, 200, (i * 10, i * 10 + 1), i + 1) for i in range(4)]
    result = run(trace, config(num_gpu_blocks=24, max_model_len=384))
    assert all(r.status == "finished" and r.output_tokens == 200 for r in result.records)
    assert sum(r.preemptions for r in result.records) > 0


@pytest.mark.parametrize("h2d_gbps", [0.0, 4.0])  # 0: instant copies
def test_host_tier_hit_by_hand(h2d_gbps: float) -> None:
    # A's 16 prompt blocks are evicted from a 40-block device pool by B and C (offloaded to
    # host as they go), then D, A's prompt plus one token, arrives to an idle engine. Its
    # pass at 3.0 starts loading the 16 blocks (16 x block_bytes at the h2d bandwidth) and
    # computes nothing; the next pass, when the load ends, prefills D's one new token.
    cfg = config(num_gpu_blocks=40, max_model_len=512, num_cpu_blocks=200,
                 cpu_write_gbps=0.0, cpu_read_gbps=h2d_gbps)  # fmt: skip
    trace = [
        TraceRequest(0.0, 256, 1, (1, 2, 3, 4), 1),
        TraceRequest(1.0, 320, 1, (11, 12, 13, 14, 15), 2),
        TraceRequest(2.0, 320, 1, (21, 22, 23, 24, 25), 3),
        TraceRequest(3.0, 257, 1, (1, 2, 3, 4, 5), 4),
    ]
    records = run(trace, cfg).records
    again = records[3]
    assert (again.cached_tokens_by_tier, again.cached_tokens_device) == ({"cpu": 256}, 0)
    load_s = 0.0 if not h2d_gbps else 16 * cfg.block_bytes / (h2d_gbps * 1e9)
    assert again.admit == pytest.approx(3.0 + load_s, abs=1e-12)  # it computes from then
    assert again.ttft == pytest.approx(load_s + prefill_s(1), abs=1e-12)
    if not h2d_gbps:
        assert not_none(again.ttft) < prefill_s(257)  # recomputing would take longer


def test_rejected_requests_keep_their_row() -> None:
    trace = [TraceRequest(0.0, 5000, 1, tuple(range(80)), 1), TraceRequest(0.1, 10, 1, (99,), 2)]
    records = run(trace, config()).records
    assert records[0].status.startswith("rejected: ") and "maximum context length" in (
        records[0].status
    )
    assert records[1].status == "finished"


def test_a_prompt_beyond_the_model_is_refused_before_it_is_built() -> None:
    # Ten million tokens: building it would take 40 MB of token ids alone.
    n = 10_000_000
    trace = [TraceRequest(0.0, n, 1, tuple(range(-(-n // TBS))), 1),
             TraceRequest(0.1, 10, 1, (99,), 2)]  # fmt: skip
    tracemalloc.start()
    try:
        records = run(trace, config()).records
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert records[0].status.startswith("rejected: ") and "maximum context length" in (
        records[0].status
    )
    assert records[1].status == "finished"
    assert peak < 8 * 2**20


def test_same_seed_same_rows() -> None:
    trace = synthetic_trace(SyntheticSpec(num_requests=60, rate=40.0, input_length=300,
                                          output_length=20, distribution="exponential",
                                          shared_prefix_fraction=0.4, seed=1), TBS)  # fmt: skip
    a = run(trace, config(), num_engines=3, router="kv-aware").records
    b = run(trace, config(), num_engines=3, router="kv-aware").records
    assert a == b


def test_one_engine_matches_the_virtual_driver() -> None:
    trace = synthetic_trace(SyntheticSpec(num_requests=40, rate=30.0, input_length=200,
                                          output_length=30, distribution="uniform",
                                          shared_prefix_fraction=0.5, seed=2), TBS)  # fmt: skip
    cfg = config(num_gpu_blocks=64)
    records = run(trace, cfg).records
    # The same requests straight through VirtualDriver: identical engine timestamps.
    core = EngineCore(cfg)
    from mocker.replay.prompts import PromptBuilder

    builder = PromptBuilder(BS, TBS, cfg.output.vocab_size, cfg.seed)
    specs = []
    for i, t in enumerate(trace):
        tokens, hashes = builder.prompt(t)
        params = SamplingParams(max_tokens=t.output_length, ignore_eos=True)
        specs.append(EngineRequest(f"r{i}", tokens, params, t.arrival, block_hashes=hashes))
    done = {r.request_id: r for r in VirtualDriver(core).run(specs).finished}
    for rec in records:
        req = done[rec.id]
        assert rec.first_token == req.first_token_time and rec.finish == req.finished_time
        assert rec.cached_tokens_device == req.num_cached_tokens


def test_replay_skips_output_objects_and_hands_its_prompts_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its fast switches: no RequestOutput per token (rows and samples read the requests),
    # prompts built in range (no per-id check) and handed over (not copied). Dropping one
    # would change no row, only the replay's speed: nothing else would notice.
    added: list[tuple[bool, dict[str, bool]]] = []
    outputs: list[int] = []
    real_add, real_step = EngineCore.add_request, EngineCore.step

    def add_request(core: EngineCore, spec: EngineRequest, **kw: bool) -> object:
        added.append((core.emit_outputs, kw))
        return real_add(core, spec, **kw)

    def step(core: EngineCore, now: float) -> object:
        result = real_step(core, now)
        outputs.append(len(result.outputs))
        return result

    monkeypatch.setattr(EngineCore, "add_request", add_request)
    monkeypatch.setattr(EngineCore, "step", step)
    trace = synthetic_trace(SyntheticSpec(num_requests=30, rate=40.0, input_length=200,
                                          output_length=12, seed=3), TBS)  # fmt: skip
    records = run(trace, config(), num_engines=2).records
    assert len(records) == 30 and all(r.output_tokens == 12 for r in records)
    assert len(added) == 30
    assert all(not emit and kw == {"ids_in_range": True, "handed_over": True}
               for emit, kw in added)  # fmt: skip
    assert outputs and not any(outputs)  # steps ran, and none made an output object


def test_kv_aware_routing_beats_round_robin_on_prefix_hits() -> None:
    trace = synthetic_trace(SyntheticSpec(num_requests=200, rate=50.0, input_length=512,
                                          output_length=8, shared_prefix_fraction=0.75,
                                          num_prefixes=4, seed=5), TBS)  # fmt: skip

    def hit_rate(router: str) -> float:
        records = run(trace, config(num_gpu_blocks=96), num_engines=4, router=router).records
        return sum(r.cached_tokens_device for r in records) / sum(r.input_tokens for r in records)

    rr, kv, ll = hit_rate("round-robin"), hit_rate("kv-aware"), hit_rate("least-loaded")
    assert kv > rr + 0.1, (kv, rr)
    assert kv > ll
    engines = {r.engine for r in run(trace, config(), num_engines=4, router="kv-aware").records}
    assert len(engines) > 1  # ties still spread load


@pytest.fixture(params=[False, True], ids=["runs", "deferred"])
def deferring(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Both fast paths: whole runs of pure decode passes (engines with few running requests,
    as every engine here) and the decoders' state deferred through any pass (MIN_DEFERRED 0).
    True for the second."""
    if request.param:
        monkeypatch.setattr(decode_runs, "MIN_DEFERRED", 0)
    return bool(request.param)


@pytest.mark.parametrize(
    ("engines", "router", "changes"),
    [
        (1, "round-robin", {"num_gpu_blocks": 40, "max_model_len": 640}),  # preemption
        (3, "kv-aware", {"num_gpu_blocks": 96}),
        (2, "least-loaded", {"enable_chunked_prefill": False, "max_num_seqs": 4}),
        (2, "kv-aware", {"eviction_policy": "lineage", "num_gpu_blocks": 64}),
        (
            2,
            "round-robin",
            {"enable_prefix_caching": False, "max_num_batched_tokens": 128, "max_num_seqs": 8},
        ),
        # Tiers: runs only while nothing is in flight (write-through of prompt blocks).
        (
            1,
            "round-robin",
            {"num_gpu_blocks": 64, "num_cpu_blocks": 300, "offload_policy": "write-through"},
        ),
        (
            2,
            "round-robin",
            {
                "num_gpu_blocks": 48,
                "num_cpu_blocks": 30,
                "offload_policy": "write-through",
                "cpu_write_gbps": 2.0,
                "storage_tiers": (FS_TIER,),
            },
        ),
        # A tier shared by the engines: runs while this engine has nothing in flight.
        (
            3,
            "round-robin",
            {
                "num_gpu_blocks": 48,
                "num_cpu_blocks": 30,
                "offload_policy": "write-through",
                "cpu_write_gbps": 2.0,
                "storage_tiers": (SHARED_OBJ,),
            },
        ),
    ],
)
def test_decode_runs_change_nothing(
    engines: int,
    router: str,
    changes: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
    deferring: bool,
) -> None:
    """Runs of decode passes taken at once give what pass-by-pass stepping gives: every row,
    every sample, the pass count, even the pool's block order at the end."""
    trace = synthetic_trace(SyntheticSpec(num_requests=80, rate=20.0, input_length=160,
                                          output_length=60, distribution="uniform",
                                          shared_prefix_fraction=0.5, seed=11), TBS)  # fmt: skip
    runs: list[int] = []

    original = DecodeRuns.run

    def counted(self: DecodeRuns, now: float, stop_at: float) -> DecodeRun | None:
        out = original(self, now, stop_at)
        if out is not None:
            runs.append(out.passes)
        return out

    monkeypatch.setattr(DecodeRuns, "run", counted)
    cfg = config(**changes)
    fast = run(trace, cfg, num_engines=engines, router=router, num_samples=50)
    slow = run(trace, cfg, num_engines=engines, router=router, num_samples=50, fast=False)
    # The fast path ran the passes (deferred runs also take the passes that admit requests,
    # so with tiers, where those are stepped, theirs are shorter).
    assert len(runs) > 10 and sum(runs) > (1 if deferring else 2) * len(runs)
    assert fast.records == slow.records
    assert fast.samples == slow.samples
    assert (fast.num_steps, fast.sim_duration) == (slow.num_steps, slow.sim_duration)
    assert fast.link_bytes == slow.link_bytes
    if "num_gpu_blocks" in changes and engines == 1:
        assert sum(r.preemptions for r in fast.records) > 0
    for a, b in zip(fast.cores, slow.cores, strict=True):
        assert free_order(a.pool) == free_order(b.pool)
        assert a.pool.cached_hashes() == b.pool.cached_hashes()
        if a.connector is not None:
            assert b.connector is not None and a.connector.quiet_for_decodes
            tiers = [(a.connector.cpu, b.connector.cpu)]
            pairs = zip(a.connector.storage, b.connector.storage, strict=True)
            tiers += [(x.tier, y.tier) for x, y in pairs]
            for x, y in tiers:
                assert x._order.items() == y._order.items()  # (LRU order)
            assert a.snapshot() == b.snapshot()
    if "num_cpu_blocks" in changes:  # loads from each tier, between the runs
        hits = [r.cached_tokens_by_tier for r in fast.records]
        connector = not_none(fast.cores[0].connector)
        assert all(any(h.get(t.name) for h in hits) for t in connector.storage)
        assert any(h.get("cpu") for h in hits)


def test_decode_runs_wait_for_tiers_with_work_in_hand() -> None:
    # Write-back stores on eviction, and a connector with copies in flight changes state
    # as they end: no run is taken then, and the replay is the one stepping gives.
    trace = synthetic_trace(SyntheticSpec(num_requests=40, rate=20.0, input_length=160,
                                          output_length=60, distribution="uniform",
                                          shared_prefix_fraction=0.5, seed=11), TBS)  # fmt: skip
    cfg = config(num_gpu_blocks=64, num_cpu_blocks=300, offload_policy="evict")
    fast, slow = run(trace, cfg), run(trace, cfg, fast=False)
    assert fast.records == slow.records and fast.num_steps == slow.num_steps
    core = EngineCore(cfg)
    assert core.connector is not None and not core.connector.quiet_for_decodes
    cfg = config(num_gpu_blocks=64, num_cpu_blocks=300, offload_policy="write-through")
    core = EngineCore(cfg)
    assert core.connector is not None and core.connector.quiet_for_decodes
    core.add_request(EngineRequest("a", list(range(40)), SamplingParams(max_tokens=8), 0.0))
    core.step(0.0)  # its two full prompt blocks are copied to the CPU tier from the pass end
    assert not core.connector.quiet_for_decodes
    assert run_decodes(core, core.time, 1e9) is None


def test_closed_loop_one_user_sends_after_each_finish() -> None:
    trace = [TraceRequest(99.0 * i, 40, 4, (i,), i + 1) for i in range(3)]
    records = run(trace, config(), concurrency=1).records
    assert records[0].arrival == 0.0  # trace times are ignored
    for before, after in itertools.pairwise(records):
        assert after.arrival == before.finish and after.admit == after.arrival
    # Alone on the engine, each request takes what the first took (no prefix shared).
    assert [r.e2e for r in records] == pytest.approx([records[0].e2e] * 3, abs=1e-12)


def test_closed_loop_keeps_at_most_c_in_flight() -> None:
    trace = synthetic_trace(SyntheticSpec(num_requests=40, rate=1000.0, input_length=100,
                                          output_length=20, distribution="uniform",
                                          seed=3), TBS)  # fmt: skip
    trace.insert(5, TraceRequest(0.0, 5000, 1, tuple(range(900, 980)), 0))  # rejected
    records = run(trace, config(), num_engines=2, router="least-loaded", concurrency=3).records
    assert sum(r.status != "finished" for r in records) == 1
    ends = [r.finish if r.finish else r.arrival for r in records]
    events = sorted([(r.arrival, 1) for r in records] + [(t, -1) for t in ends])
    in_flight = peak = 0
    for _, delta in events:  # at equal times a finish (-1) sorts before the next send
        in_flight += delta
        peak = max(peak, in_flight)
    assert peak == 3
    # Every send after the first three is the moment another request ended.
    assert all(r.arrival in set(ends) for r in records[3:])


def test_closed_loop_decode_runs_change_nothing(deferring: bool) -> None:
    trace = synthetic_trace(SyntheticSpec(num_requests=60, input_length=200, output_length=50,
                                          distribution="exponential", seed=4), TBS)  # fmt: skip
    cfg = config(num_gpu_blocks=48, max_model_len=1024)
    fast = run(trace, cfg, num_engines=2, router="kv-aware", concurrency=6, num_samples=40)
    slow = run(trace, cfg, num_engines=2, router="kv-aware", concurrency=6, num_samples=40,
               fast=False)  # fmt: skip
    assert fast.records == slow.records and fast.samples == slow.samples
    assert 0 < len(fast.samples) <= 2 * 40


def test_decode_runs_leave_a_cached_duplicate_block_to_step(deferring: bool) -> None:
    """With a 2-token vocabulary and 1-token blocks two requests generate identical blocks;
    step() then swaps in the cached one mid-run (freeing a block, changing usage), which a
    decode run cannot foresee: it hands those passes back, and the results stay equal."""
    cfg = EngineConfig.of(block_size=1, num_gpu_blocks=64, max_model_len=64, vocab_size=2,
                       eos_token_id=1)  # fmt: skip
    trace = [TraceRequest(0.0, 4, 8, (7, 8, 9, 10), 1), TraceRequest(0.0, 4, 8, (7, 8, 9, 10), 2),
             TraceRequest(100.0, 4, 1, (1, 2, 3, 4), 3)]  # fmt: skip
    fast = replay(trace, cfg, trace_block_size=1, num_samples=1)
    slow = replay(trace, cfg, trace_block_size=1, num_samples=1, fast=False)
    assert fast.records == slow.records
    assert free_order(fast.cores[0].pool) == free_order(slow.cores[0].pool)


def test_shared_obj_tier_serves_another_engine_by_hand() -> None:
    # Round robin over two engines sharing one obj tier: A's prompt is computed on engine 0
    # (stored to its CPU tier, cascaded to obj); A's prompt plus one token then lands on
    # engine 1, whose own tiers never saw it: it promotes the 16 blocks obj → CPU, loads
    # them CPU → device, and prefills one token.
    obj = StorageTierSpec(StorageKind.OBJ, 1024, read_gbps=8.0, write_gbps=4.0, latency_ms=1.0)
    cfg = config(num_gpu_blocks=64, max_model_len=512, num_cpu_blocks=64,
                 offload_policy="write-through", storage_tiers=(obj,))  # fmt: skip
    trace = [
        TraceRequest(0.0, 256, 1, (1, 2, 3, 4), 1),  # engine 0
        TraceRequest(0.1, 64, 1, (11,), 2),  # engine 1
        TraceRequest(0.2, 64, 1, (21,), 3),  # engine 0
        TraceRequest(1.0, 257, 1, (1, 2, 3, 4, 5), 4),  # engine 1
    ]
    result = run(trace, cfg, num_engines=2)
    again = result.records[3]
    assert again.engine == 1
    assert (again.cached_tokens_by_tier, again.cached_tokens_device) == ({"obj": 256}, 0)
    promote_s = 1e-3 + 16 * cfg.block_bytes / 8e9
    load_s = 16 * cfg.block_bytes / 32e9
    assert again.admit == pytest.approx(1.0 + promote_s + load_s, abs=1e-12)
    assert again.ttft == pytest.approx(promote_s + load_s + prefill_s(1), abs=1e-12)
    # Both engines' stacks hold the same obj tier; engine 1 read from it, engine 0 wrote.
    c0, c1 = (c.connector for c in result.cores)
    assert c0 is not None and c1 is not None and c0.storage[0] is c1.storage[0]
    assert result.link_bytes["obj->cpu"] == 16 * cfg.block_bytes
    assert result.link_bytes["cpu->obj"] >= 16 * cfg.block_bytes


def test_bytes_of_a_copy_another_engine_ended_are_counted() -> None:
    # Engine 1's only request is done long before its prompt's cascade to the shared obj
    # tier ends; engine 0, still decoding then, polls the shared channel first at that
    # instant (the lower index), so the copy ends in its poll and the record waits in
    # engine 1's connector, whose engine has nothing left to step. The bytes still count.
    obj = StorageTierSpec(StorageKind.OBJ, 1024, read_gbps=8.0, write_gbps=0.05, latency_ms=1.0)
    cfg = config(num_gpu_blocks=64, max_model_len=512, num_cpu_blocks=64,
                 offload_policy="write-through", storage_tiers=(obj,))  # fmt: skip
    trace = [
        TraceRequest(0.0, 64, 400, (1,), 1),  # engine 0: decodes for a while
        TraceRequest(0.01, 128, 1, (11, 12), 2),  # engine 1: 8 prompt blocks, one token
    ]
    result = run(trace, cfg, num_engines=2)
    done = result.records[1]
    cascade_s = 1e-3 + 8 * cfg.block_bytes / 0.05e9
    finish_0, finish_1 = not_none(result.records[0].finish), not_none(done.finish)
    assert done.engine == 1 and finish_1 < 0.01 + cascade_s < finish_0
    assert result.link_bytes["cpu->obj"] == (4 + 8) * cfg.block_bytes
    assert result.link_bytes["gpu->cpu"] == (4 + 8) * cfg.block_bytes


def test_trace_adapters_by_hand() -> None:
    """Rows naming LoRA adapters: a cold adapter's load (disk + CPU, default 30 + 2 ms) is
    in its pass, so in its TTFT and its row's lora_wait; a warm one pays nothing; equal
    trace ids under another adapter share no prefix."""
    trace = [
        TraceRequest(0.0, 150, 2, (1, 2, 3), 1, "sql"),
        TraceRequest(5.0, 150, 2, (1, 2, 3), 2, "sql"),
        TraceRequest(10.0, 150, 2, (1, 2, 3), 3, "chat"),
    ]
    cold, warm, other = run(trace, config(enable_lora=True)).records
    load_s = 0.032
    assert cold.lora == "sql" and cold.lora_wait == pytest.approx(load_s)
    assert cold.ttft == pytest.approx(prefill_s(150) + load_s, abs=1e-12)
    assert warm.lora_wait == 0.0 and warm.cached_tokens_device == 144  # 9 full blocks
    assert other.lora_wait == pytest.approx(load_s) and other.cached_tokens_device == 0
    with pytest.raises(ConfigError, match="names the LoRA adapter 'sql'"):
        run(trace, config())


def test_pd_pair_by_hand() -> None:
    """--prefill-engines 1 of 2: the prompt is prefilled on engine 0 (one pass, one token),
    the decode leg arrives on engine 1 when that pass ends, pulls 7 blocks over its link,
    recomputes the prompt's last token to sample the first, then decodes."""
    cfg = config(pull_gbps=2.0, pull_latency_ms=1.0)
    trace = [TraceRequest(0.5, 100, 3, (7, 8), 1)]
    result = run(trace, cfg, num_engines=2, prefill_engines=1)
    (r,) = result.records
    pull = 7 * BS * cfg.model.kv_bytes_per_token / 2e9 + 0.001
    assert (r.engine, r.prefill_engine, r.status) == (1, 0, "finished")
    assert r.pull_time == pytest.approx(pull, abs=1e-12)
    # The first decode pass computes one prompt token (a prefill pass of 1 token).
    assert r.ttft == pytest.approx(prefill_s(100) + pull + prefill_s(1), abs=1e-12)
    assert r.mean_itl == pytest.approx(decode_s(7, 256), abs=1e-12)
    assert r.cached_tokens_by_tier == {"p2p": 100}
    # Both engines end with nothing held.
    assert [c.pool.num_used for c in result.cores] == [0, 0]
    assert result.sim_duration == pytest.approx(0.5 + not_none(r.e2e), abs=1e-12)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        # A small pool: decode engines' runs meet decode legs that a prefill pass sends
        # while they run (a run once went past one: pass times differed by 2 ms).
        {"num_gpu_blocks": 96},
        # A CPU tier on every engine too: a decode engine's pulled prompt is stored.
        {"num_gpu_blocks": 96, "num_cpu_blocks": 100, "offload_policy": "write-through"},
    ],
)
def test_pd_replay_decode_runs_change_nothing(changes: dict[str, object], deferring: bool) -> None:
    trace = synthetic_trace(SyntheticSpec(num_requests=60, rate=40.0, input_length=160,
                                          output_length=40, distribution="uniform",
                                          shared_prefix_fraction=0.5, seed=5), TBS)  # fmt: skip
    cfg = config(**changes)
    fast = run(trace, cfg, num_engines=3, prefill_engines=1, router="kv-aware", num_samples=50)
    slow = run(trace, cfg, num_engines=3, prefill_engines=1, router="kv-aware", num_samples=50,
               fast=False)  # fmt: skip
    assert fast.records == slow.records and fast.samples == slow.samples
    assert all(r.status == "finished" and r.prefill_engine == 0 for r in fast.records)
    assert {r.engine for r in fast.records} == {1, 2}
    assert all(r.pull_time > 0 for r in fast.records)
    assert all(not c.holds and c.pool.num_used == 0 for c in fast.cores)


def test_prefill_engines_must_leave_a_decode_engine() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        run([TraceRequest(0.0, 10, 1, (1,), 1)], config(), num_engines=2, prefill_engines=2)


def test_pd_closed_loop_is_not_held_up_by_leases() -> None:
    """A prefill engine whose only work is a hold waits for its lease's end; a request that
    arrives meanwhile still runs at once (the pull will release the hold long before)."""
    trace = [TraceRequest(0.0, 100, 3, (7, 8), 1), TraceRequest(0.0, 100, 3, (9, 10), 2),
             TraceRequest(0.0, 100, 3, (11, 12), 3)]  # fmt: skip
    closed = run(trace, config(), num_engines=2, prefill_engines=1, concurrency=1)
    assert [r.status for r in closed.records] == ["finished"] * 3
    ttfts = [not_none(r.ttft) for r in closed.records]
    assert max(ttfts) < 0.2, ttfts  # each: a prefill, a pull and a first pass (not 30 s)
    assert closed.sim_duration == pytest.approx(max(not_none(r.finish) for r in closed.records))


def test_pd_prefill_pool_full_of_held_kv_waits_for_the_pulls() -> None:
    """A prefill engine whose pool is full of KV held for pulls parks until a pull frees
    some (it neither stalls nor waits for the next arrival)."""
    cfg = config(num_gpu_blocks=16, max_num_seqs=16, max_num_batched_tokens=2048)
    trace = [TraceRequest(0.0, 100, 3, (2 * i + 1, 2 * i + 2), i + 1) for i in range(3)]
    trace.append(TraceRequest(5.0, 100, 3, (8, 9), 4))
    for fast in (True, False):
        result = run(trace, cfg, num_engines=2, prefill_engines=1, fast=fast)
        ttfts = [r.ttft for r in result.records]
        assert all(r.status == "finished" for r in result.records)
        # The third waited for the first pulls (7 + 7 blocks of 16 held), not for 5 s.
        assert ttfts[2] is not None and ttfts[0] is not None
        assert ttfts[0] < ttfts[2] < 0.5, ttfts


def test_pd_pulls_that_overlap_share_the_decode_link() -> None:
    """A decode leg that arrives while another pull runs starts its own pull at once (the
    engine's idle wait for the first pull is rolled back): the two share the link."""
    cfg = config(pull_gbps=0.05, pull_latency_ms=1.0, max_num_batched_tokens=64, max_num_seqs=16)
    # r0: 100 tokens on prefill engine 0; r1: 256 tokens on prefill engine 1 (4 passes).
    trace = [TraceRequest(0.0, 100, 3, (7, 8), 1), TraceRequest(0.0, 256, 3, (1, 2, 3, 4), 2)]
    both = run(trace, cfg, num_engines=3, prefill_engines=2, fast=False).records
    alone = run(trace[1:], cfg, num_engines=3, prefill_engines=2, fast=False).records
    assert both[1].pull_time > alone[0].pull_time * 1.2  # it shared the link with r0's


_OBJ = StorageTierSpec(StorageKind.OBJ, 1024, read_gbps=8.0, write_gbps=4.0, latency_ms=1.0)
_TIERS = {"num_gpu_blocks": 64, "num_cpu_blocks": 64, "offload_policy": "write-through",
          "storage_tiers": (_OBJ,)}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "kw"),
    [
        ({}, {}),
        ({"num_gpu_blocks": 64}, {}),  # preemptions
        (_TIERS, {"num_engines": 2}),
        ({"num_gpu_blocks": 64, "num_cpu_blocks": 64, "offload_policy": "evict"}, {}),
        ({}, {"num_engines": 3, "prefill_engines": 1, "router": "kv-aware"}),
    ],
    ids=["plain", "preempting", "tiers", "write-back", "pd"],
)
def test_a_replay_makes_no_cyclic_garbage_as_it_goes(
    changes: dict[str, object], kw: dict[str, object]
) -> None:
    """replay() pauses the cyclic collector, which is safe only while a replay leaves no
    garbage cycles behind as it runs: what a collection finds with the result still alive
    is the run's own frame (its loop, router, prompt builder), as much for 40 requests as
    for 160."""
    import gc

    cfg = config(**changes)

    def garbage(n: int) -> int:
        trace = synthetic_trace(SyntheticSpec(num_requests=n, rate=40.0, input_length=300,
                                              output_length=40, distribution="uniform",
                                              shared_prefix_fraction=0.5, seed=5), TBS)  # fmt: skip
        enabled = gc.isenabled()
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            result = run(trace, cfg, **kw)
            assert len(result.records) == n
            gc.collect()
            return len(gc.garbage)
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
            if enabled:
                gc.enable()

    assert garbage(40) == garbage(160)


def test_the_collector_is_paused_for_a_replay_and_restored_after() -> None:
    import gc

    trace = synthetic_trace(SyntheticSpec(num_requests=5, rate=40.0, input_length=100,
                                          output_length=4, seed=1), TBS)  # fmt: skip
    seen: list[bool] = []
    assert gc.isenabled()
    run(trace, config(), progress=lambda _: seen.append(gc.isenabled()))
    assert seen and not any(seen) and gc.isenabled()

    def fail(_: int) -> None:
        raise RuntimeError("progress callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        run(trace, config(), progress=fail)
    assert gc.isenabled()  # restored when a replay raises too
    gc.disable()
    try:
        run(trace, config())
        assert not gc.isenabled()  # (and left off when it was off)
    finally:
        gc.enable()
