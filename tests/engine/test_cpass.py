"""The compiled pass parts (mocker/engine/_cpass.c) against their Python references: the
applier against `EngineCore._advance_one` for every request, the scheduler head against
`schedule_running`'s loop (mocker/scheduler/running.py), and the draws against numpy's.
(Its hand-out loop: tests/engine/test_stream.py.)"""

from __future__ import annotations

import dataclasses
import random
from array import array
from collections.abc import Callable
from typing import Any

import pytest

from mocker.engine.core import EngineCore
from mocker.engine.core_state import decode_applier
from mocker.engine.outputs import RequestOutput, StepResult
from mocker.kv.block import block_ids
from mocker.kv.manager import KVCacheManager
from mocker.output_tokens import OutputTokenSampler
from mocker.request import EngineRequest, Request, SamplingParams
from tests.support.engines import req, small_config

_cpass = pytest.importorskip("mocker.engine._cpass")


def _cores(changes: dict[str, Any]) -> tuple[EngineCore, EngineCore]:
    """The same engine twice: compiled applier, scheduler head and draws, and the Python
    references."""
    fast, slow = EngineCore(small_config(**changes)), EngineCore(small_config(**changes))
    fast._applier = _compiled_applier(fast)
    fast.sampler._cdraws = _cpass.draws
    kv = fast.kv
    quiet = isinstance(kv, KVCacheManager) and kv.quiet_failures
    fast.scheduler.decode_head = fast._applier.decodes if quiet else None
    slow._applier = None
    slow.sampler._cdraws = None
    slow.scheduler.decode_head = None
    return fast, slow


def _compiled_applier(core: EngineCore) -> Any:
    return decode_applier(core.config.block_size, core.sampler.eos_token_id, compiled=True)


def _state(request: Request) -> dict[str, Any]:
    """Everything a request holds, blocks as ids and its hash chain left out (its hashes are
    in `block_hashes`)."""
    state = {f.name: getattr(request, f.name) for f in dataclasses.fields(request)}
    state["blocks"] = block_ids(request.blocks)
    state["all_token_ids"] = list(request.all_token_ids)
    state["block_hashes"] = list(request.block_hashes)
    del state["hash_chain"], state["group_blocks"]
    return state


def _same_pass(a: StepResult, b: StepResult) -> None:
    assert (a.start, a.end) == (b.start, b.end)
    assert a.outputs == b.outputs
    assert [type(o) for o in a.outputs] == [RequestOutput] * len(a.outputs)
    assert a.finished == b.finished and a.stats == b.stats and a.kv_events == b.kv_events


def _workload(rng: random.Random, n: int) -> list[tuple[float, EngineRequest]]:
    arrivals, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(300.0)
        prompt = [rng.randrange(1, 4) for _ in range(rng.randrange(1, 40))]
        sampling: dict[str, Any] = {"ignore_eos": rng.random() < 0.6}
        if rng.random() < 0.15:
            sampling["stop_token_ids"] = [rng.randrange(0, 8)]
        max_tokens = rng.randrange(1, 200)
        if rng.random() < 0.2:
            sampling["min_tokens"] = rng.randrange(0, min(6, max_tokens + 1))
        spec = req(f"r{i}", prompt, max_tokens=max_tokens, **sampling)
        arrivals.append((t, dataclasses.replace(spec, arrival_time=t)))
    return arrivals


def _step_both(fast: EngineCore, slow: EngineCore, arrivals: list[tuple[float, EngineRequest]],
               max_passes: int = 4000) -> int:  # fmt: skip
    """Drive both engines pass by pass with the same arrivals; compare every pass's result
    and every request's state after it. Returns the passes run."""
    pending = list(arrivals)
    now, passes = 0.0, 0
    while (pending or slow.has_unfinished_requests()) and passes < max_passes:
        while pending and pending[0][0] <= now:
            spec = pending.pop(0)[1]
            fast.add_request(spec)
            slow.add_request(spec)
        if not slow.has_unfinished_requests():
            now = pending[0][0]
            continue
        a, b = fast.step(now), slow.step(now)
        _same_pass(a, b)
        assert fast.requests.keys() == slow.requests.keys()
        for rid, request in slow.requests.items():
            assert _state(fast.requests[rid]) == _state(request), rid
        assert fast.pool.cached_hashes() == slow.pool.cached_hashes()
        now = b.end if not b.idle else now + 0.001
        passes += 1
    return passes


@pytest.mark.parametrize("seed", range(10))
def test_passes_equal_the_python_body_pass_by_pass(seed: int) -> None:
    """Random arrivals (prefills beside decodes, EOS, stop ids, min_tokens, preemption in a
    small pool, prefix hits of repeating prompts, a CPU tier in some): every pass's outputs,
    finished records, stats and events, and every request's state, as the Python body gives."""
    rng = random.Random(seed)
    changes: dict[str, Any] = {
        "num_gpu_blocks": rng.choice([64, 96, 256]),  # a request needs up to 60
        "max_num_batched_tokens": rng.choice([16, 64]),
        "max_num_seqs": rng.choice([4, 16]),
        "vocab_size": rng.choice([8, 1000]),  # 8: EOS and stop ids are drawn often
        "eos_probability": rng.choice([0.0, 0.02]),
        "enable_prefix_caching": rng.random() < 0.8,
        "enable_kv_cache_events": rng.random() < 0.3,
    }
    if changes["enable_prefix_caching"] and rng.random() < 0.4:
        policy = rng.choice(["write-through", "evict"])  # (evict: no compiled head)
        changes.update(num_cpu_blocks=64, offload_policy=policy)
    fast, slow = _cores(changes)
    assert _step_both(fast, slow, _workload(rng, 30)) > 50
    assert not slow.requests and not fast.requests


@pytest.mark.parametrize("seed", range(4))
def test_replay_passes_equal_the_python_body(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without outputs (replay): the pass's token column, or `token()` per request, and
    token ids kept in an array('I') as replay hands them over."""
    rng = random.Random(seed)
    changes = {"max_num_seqs": 32, "max_num_batched_tokens": 128, "num_gpu_blocks": 512,
               "eos_probability": 0.0 if seed % 2 else 0.01}  # fmt: skip
    # (Without EOS, passes of 24 or more sampling requests draw a column.)
    fast, slow = _cores(changes)
    fast.emit_outputs = slow.emit_outputs = False
    for core in (fast, slow):  # handed over as arrays, as replay does (each its own)
        monkeypatch.setattr(core, "add_request", _handing_over(core))
    assert _step_both(fast, slow, _workload(rng, 40)) > 20


def _handing_over(core: EngineCore) -> Callable[[EngineRequest], Request]:
    add = core.add_request

    def add_request(spec: EngineRequest) -> Request:
        mine = dataclasses.replace(spec, prompt_token_ids=array("I", spec.prompt_token_ids))
        return add(mine, handed_over=True)

    return add_request


def test_steady_decode_takes_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass of requests decoding inside their drawn windows asks the Python body for none
    of them (and for each of them without the compiled applier)."""
    fast, slow = _cores({"max_num_seqs": 16, "max_num_batched_tokens": 256})
    for core in (fast, slow):
        for i in range(16):
            core.add_request(req(f"r{i}", [i + 1] * 6, max_tokens=200, ignore_eos=True))
    now = 0.0
    for _ in range(3):  # prefill, then every request has drawn its window
        _same_pass(fast.step(now), result := slow.step(now))
        now = result.end
    calls = {"fast": 0, "slow": 0}
    for name, core in (("fast", fast), ("slow", slow)):
        one = core._advance_one

        def counted(*args: Any, _one: Any = one, _name: str = name) -> int:
            calls[_name] += 1
            return int(_one(*args))

        monkeypatch.setattr(core, "_advance_one", counted)
    # (block size 4: passes in which blocks fill and are registered included)
    for _ in range(8):
        _same_pass(fast.step(now), result := slow.step(now))
        now = result.end
    assert calls == {"fast": 0, "slow": 16 * 8}


def test_the_scheduler_head_schedules_decodes_and_stops_where_the_loop_must_go_on() -> None:
    """The compiled head schedules the running requests that decode one token (allocating a
    block for those at a boundary) and stops at a prefill chunk or a refused allocation,
    leaving it and what follows to the Python loop."""
    core = EngineCore(small_config(num_gpu_blocks=16, max_num_seqs=4))
    head = _compiled_applier(core).decodes
    for i in range(3):
        core.add_request(req(f"r{i}", [i + 1] * 7, max_tokens=40, ignore_eos=True))
    now = core.step(0.0).end  # prefill: each holds 2 blocks (8 slots for 8 tokens)
    running = core.scheduler.running
    calls: list[tuple[str, int]] = []

    def allocate(request: Request, n: int) -> bool:
        calls.append((request.request_id, n))
        return bool(core.kv.allocate_slots(request, n))

    scheduled: dict[Request, int] = {}
    assert head(running, 0, 100, scheduled, allocate) == (3, 97, 3)
    assert scheduled == dict.fromkeys(running, 1) and calls == []  # room in their blocks
    now = core.step(now).end  # 8 tokens now: the next one needs a third block
    scheduled.clear()
    assert head(running, 1, 100, scheduled, allocate) == (3, 98, 2)  # from index 1
    assert calls == [("r1", 1), ("r2", 1)] and len(running[1].blocks) == 3
    scheduled.clear()
    calls.clear()

    def refuse(request: Request, n: int) -> bool:
        calls.append((request.request_id, n))
        return False

    assert head(running, 0, 100, scheduled, refuse) == (0, 100, 0)  # r0 needs a block
    assert calls == [("r0", 1)] and scheduled == {}
    assert head(running, 1, 1, scheduled, refuse) == (2, 0, 1)  # the budget ends first
    # A prompt longer than the budget (32) is still prefilling after its first pass.
    core = EngineCore(small_config(max_num_seqs=4))
    head = _compiled_applier(core).decodes
    core.add_request(req("d", [1] * 3, max_tokens=40, ignore_eos=True))
    now = core.step(0.0).end
    core.add_request(req("p", [2] * 60, max_tokens=4, ignore_eos=True))
    core.step(now)  # (the budget is spent on "d" and p's first 31 tokens)
    running = core.scheduler.running
    assert [r.request_id for r in running] == ["d", "p"]
    scheduled.clear()
    assert head(running, 0, 100, scheduled, core.kv.allocate_slots) == (1, 99, 1)
    assert list(scheduled) == [running[0]]


def test_a_token_that_ends_the_request_goes_through_the_python_body() -> None:
    fast, slow = _cores({})
    for core in (fast, slow):
        core.add_request(req("a", [1, 2, 3], max_tokens=5, ignore_eos=True))
    now, outs = 0.0, []
    while slow.has_unfinished_requests():
        a, b = fast.step(now), slow.step(now)
        _same_pass(a, b)
        outs += a.outputs
        now = b.end
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason == "length"


def test_the_decode_applier_needs_plain_slots() -> None:
    class NoSlots:
        pass

    with pytest.raises(TypeError, match="num_computed_tokens is not a plain slot"):
        _cpass.DecodeApplier(NoSlots, SamplingParams, RequestOutput, 16, 2)
    with pytest.raises(TypeError, match="time is not a plain slot"):
        _cpass.DecodeApplier(Request, SamplingParams, _read_only_time(), 16, 2)
    with pytest.raises(TypeError, match="request_id is not a plain slot"):
        _cpass.DecodeApplier(Request, SamplingParams, _guarded_writes(), 16, 2)
    with pytest.raises(ValueError, match="block_size"):
        _cpass.DecodeApplier(Request, SamplingParams, RequestOutput, 0, 2)
    with pytest.raises(TypeError, match="eos_token_id"):
        _cpass.DecodeApplier(Request, SamplingParams, RequestOutput, 16, "2")
    a = _cpass.DecodeApplier(Request, SamplingParams, RequestOutput, 16, None)
    with pytest.raises(TypeError, match="takes 9 arguments"):
        a.run({}, 1.0)
    with pytest.raises(TypeError, match="run\\(dict"):
        a.run([], 1.0, True, None, None, None, None, [], None)


def _guarded_writes() -> type:
    """RequestOutput, its writes going through its own __setattr__ (as a frozen class's)."""

    def refuse(self: object, name: str, value: object) -> None:
        raise AttributeError(name)

    return type("GuardedWrites", (RequestOutput,), {"__setattr__": refuse})


def _read_only_time() -> type:
    """RequestOutput, but its `time` another class's (read-only) member, slice.start."""
    return type("ReadOnlyTime", (RequestOutput,), {"time": slice.__dict__["start"]})


def test_an_end_that_is_not_a_float_takes_the_python_body() -> None:
    """(The compiled path computes latencies from float ends; any other end is the Python
    body's, which keeps the object as the pass's time.)"""
    core = EngineCore(small_config())
    core._applier = decode_applier(core.config.block_size, core.sampler.eos_token_id, compiled=True)
    core.add_request(req("a", [1, 2, 3], max_tokens=8, ignore_eos=True))
    now = core.step(core.step(0.0).end).end  # its first two tokens: now a plain decode
    last = core.requests["a"].last_token_time
    (out,), _finished, sampled = core._advance(core.scheduler.schedule(), 7)
    assert sampled == 1 and type(out.time) is int and out.latency == 7 - last
    assert now < 7


@pytest.mark.parametrize("threshold", [0, 1 << 48, 1 << 52, (1 << 53) - 1])
def test_draws_equal_numpy(threshold: int) -> None:
    rng = random.Random(threshold)
    palette = rng.sample(range(3, 60_000), 500)
    eos = 2
    compiled = OutputTokenSampler(palette, eos, threshold / (1 << 53), 1, compiled=True)
    reference = OutputTokenSampler(palette, eos, threshold / (1 << 53), 1, compiled=False)
    assert compiled._cdraws is not None and reference._cdraws is None
    for _ in range(500):
        seed = rng.choice([0, (1 << 64) - 1, rng.getrandbits(64)])
        start = rng.choice([0, rng.randrange(1 << 20), (1 << 62) - 300])
        count = rng.choice([0, 1, rng.randrange(300)])
        eos_from = rng.choice([0, start + rng.randrange(-5, 300), 1 << 62])
        a = compiled.draws(seed, start, count, eos_from)
        assert a == reference.draws(seed, start, count, eos_from)
        assert all(t in palette or t == eos for t in a)


@pytest.mark.parametrize("size", [1, 2, 7, 500, 1024, 26_380])
def test_rows_and_columns_equal_numpy(size: int) -> None:
    """A replay's decode rows and stepped passes' columns, drawn in C, are the numpy code's."""
    rng = random.Random(size)
    palette = rng.sample(range(3, 60_000), size)
    compiled = OutputTokenSampler(palette, 2, 0.0, 1, compiled=True)
    reference = OutputTokenSampler(palette, 2, 0.0, 1, compiled=False)
    assert compiled._crows is not None and reference._crows is None
    for _ in range(40):
        n = rng.choice([0, 1, rng.randrange(40)])
        seeds = [rng.choice([0, (1 << 64) - 1, rng.getrandbits(64)]) for _ in range(n)]
        starts = [rng.choice([0, rng.randrange(1 << 20), (1 << 62) - 300]) for _ in range(n)]
        count = rng.choice([0, 1, rng.randrange(70)])
        rows = compiled.token_rows(seeds, starts, count)
        assert rows == reference.token_rows(seeds, starts, count)
        assert compiled.token_column(seeds, starts) == reference.token_column(seeds, starts)
    seeds = [rng.getrandbits(64) for _ in range(3)]
    assert compiled.token_column(seeds, [5, 6, 7]) == [
        compiled.token(seed, k, False) for seed, k in zip(seeds, [5, 6, 7], strict=True)
    ]


def test_rows_and_column_refuse_bad_arguments() -> None:
    with pytest.raises(TypeError, match="rows"):
        _cpass.rows([1], [0, 1], 3, array("I", [5]))
    with pytest.raises(TypeError, match="uint32"):
        _cpass.rows([1], [0], 3, array("Q", [5]))
    with pytest.raises(TypeError, match="uint32"):
        _cpass.rows([1], [0], 3, array("I"))
    with pytest.raises(TypeError, match="ints"):
        _cpass.rows(["1"], [0], 3, array("I", [5]))
    assert _cpass.rows([1, 2], [0, 0], -1, array("I", [5])) == b""
    with pytest.raises(TypeError, match="column"):
        _cpass.column([1], [0], [])
    with pytest.raises(TypeError, match="ints"):
        _cpass.column([1], [0, 1], [5])


def test_draws_refuses_bad_arguments() -> None:
    draws = _cpass.draws
    assert draws(1, 0, -3, 0, [5], 2, 0) == []
    with pytest.raises(TypeError, match="palette"):
        draws(1, 0, 3, 0, [], 2, 0)
    with pytest.raises(TypeError, match="palette"):
        draws(1, 0, 3, 0, (5,), 2, 0)
    with pytest.raises(TypeError, match="seed"):
        draws("1", 0, 3, 0, [5], 2, 0)
    with pytest.raises(ValueError, match="start"):
        draws(1, -1, 3, 0, [5], 2, 0)
    with pytest.raises(TypeError, match="draws\\("):
        draws(1, 0, 3)


def test_python_pool_setting_turns_both_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOCKER_COMPILED", "0")
    core = EngineCore(small_config())
    assert core._applier is None and core.sampler._cdraws is None
    monkeypatch.setenv("MOCKER_COMPILED", "auto")
    core = EngineCore(small_config())
    assert core._applier is not None and core.sampler._cdraws is not None
