"""EngineCore: intake checks, stop conditions, aborts, determinism, pass timing."""

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from mocker.config import ConfigError
from mocker.engine.core import EngineCore, RequestRejected
from mocker.engine.outputs import RequestOutput
from mocker.engine.stats import FinishedRequestStats, SchedulerStats
from mocker.kv.events import BlockStored
from mocker.request import EngineRequest, FinishReason, RequestStatus, SamplingParams, TokenIds
from mocker.timing import PolynomialTiming
from tests.support.engines import make_core, req, small_config


def _run(core: EngineCore, now: float = 0.0) -> float:
    while core.has_unfinished_requests():
        now = core.step(now).end
    return now


def _collect(core: EngineCore) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    now = 0.0
    while core.has_unfinished_requests():
        res = core.step(now)
        now = res.end
        for out in res.outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (req("e", []), "prompt is empty"),
        (req("neg", [-1, 2]), "token ids"),
        (req("long", range(256)), "maximum context length is 256"),
        (req("mt", range(10), max_tokens=0), "max_tokens must be at least 1"),
        (req("over", range(200), max_tokens=100), "you requested 300 tokens"),
        (req("min", range(4), max_tokens=2, min_tokens=3), "min_tokens"),
    ],
)
def test_bad_requests_are_rejected_clearly(spec: EngineRequest, message: str) -> None:
    core = make_core()
    with pytest.raises(RequestRejected, match=message):
        core.add_request(spec)
    assert not core.has_unfinished_requests()


def test_request_larger_than_pool_is_rejected_not_queued() -> None:
    core = make_core(num_gpu_blocks=8)  # 32 tokens of KV
    with pytest.raises(RequestRejected, match=r"needs up to 9 KV blocks .* only 8 blocks"):
        core.add_request(req("big", range(30), max_tokens=5))
    core.add_request(req("fits", range(30), max_tokens=2))
    assert _run(core) > 0


def test_duplicate_request_id_rejected() -> None:
    core = make_core()
    core.add_request(req("x", [1, 2]))
    with pytest.raises(RequestRejected, match="already in use"):
        core.add_request(req("x", [1, 2]))


def test_default_max_tokens_fills_context() -> None:
    core = make_core(max_model_len=40)
    r = core.add_request(req("a", range(30), max_tokens=None))
    assert r.max_tokens == 10


def test_finish_on_max_tokens_is_length() -> None:
    core = make_core()
    core.add_request(req("a", [5] * 6, max_tokens=3))
    res = None
    now = 0.0
    outs = []
    while core.has_unfinished_requests():
        res = core.step(now)
        now = res.end
        outs += res.outputs
    assert len(outs) == 3 and outs[-1].finished and outs[-1].finish_reason is FinishReason.LENGTH
    assert res is not None and res.finished[0].finish_reason is FinishReason.LENGTH


def test_eos_model_min_tokens_and_ignore_eos() -> None:
    core = make_core(eos_probability=1.0, eos_token_id=1)
    core.add_request(req("eos", [5] * 6, max_tokens=10, min_tokens=2))
    core.add_request(req("ign", [6] * 6, max_tokens=5, ignore_eos=True))
    toks = _collect(core)
    assert len(toks["eos"]) == 3 and toks["eos"][-1] == 1 and 1 not in toks["eos"][:2]
    assert len(toks["ign"]) == 5 and 1 not in toks["ign"]


def test_default_runs_to_max_tokens() -> None:
    core = make_core()
    core.add_request(req("a", [5] * 6, max_tokens=50))
    assert len(_collect(core)["a"]) == 50


def test_stop_token_ids() -> None:
    core = EngineCore(small_config(), output_palette=[5, 6])
    core.add_request(req("s", [1] * 4, max_tokens=100, stop_token_ids=(6,)))
    toks = _collect(core)["s"]
    assert toks[-1] == 6 and 6 not in toks[:-1] and len(toks) < 100


def test_generation_is_deterministic_per_seed_and_request() -> None:
    def tokens(seed: int) -> dict[str, list[int]]:
        core = make_core(seed=seed)
        core.add_request(req("a", [1] * 4, max_tokens=8))
        core.add_request(req("b", [1] * 4, max_tokens=8))
        return _collect(core)

    assert tokens(0) == tokens(0)
    assert tokens(0)["a"] != tokens(0)["b"]
    assert tokens(0) != tokens(1)


def test_abort_frees_blocks_immediately_running_and_waiting() -> None:
    core = make_core(max_num_seqs=1)
    core.add_request(req("run", range(20), max_tokens=10))
    core.add_request(req("wait", range(50, 70), max_tokens=10))
    core.step(0.0)
    assert core.pool.num_used > 0
    out = core.abort_request("run", 1.0)
    assert out is not None and out.finished and out.finish_reason is FinishReason.ABORT
    assert core.pool.num_used == 0 and core.num_running == 0
    out = core.abort_request("wait", 1.0)
    assert out is not None and core.num_waiting == 0 and not core.has_unfinished_requests()
    assert core.abort_request("wait", 1.0) is None


def test_stop_request_finishes_with_stop() -> None:
    core = make_core()
    core.add_request(req("a", [1] * 4, max_tokens=10))
    core.step(0.0)
    out = core.stop_request("a", 0.5)
    assert out is not None and out.finish_reason is FinishReason.STOP
    assert core.pool.num_used == 0


def test_pass_duration_follows_composition() -> None:
    cfg = small_config(speedup_ratio=2.0)
    core = EngineCore(cfg)
    core.add_request(req("a", range(20), max_tokens=3))
    m = PolynomialTiming()
    res = core.step(1.0)
    assert res.start == 1.0
    assert res.duration == pytest.approx(m.prefill_ms(20) / 1000 / 2)
    res = core.step(res.end)
    used_tokens = core.pool.num_used * cfg.block_size
    expected = m.decode_ms(used_tokens, cfg.cache.num_gpu_blocks * cfg.block_size, 1) / 1000 / 2
    assert res.duration == pytest.approx(expected)
    assert res.outputs[0].time == res.end


def test_timestamps_recorded() -> None:
    core = make_core()
    core.add_request(EngineRequest("a", [1] * 4, SamplingParams(max_tokens=2), arrival_time=0.0))
    r = core.requests["a"]
    first = core.step(0.5)
    second = core.step(first.end)
    assert r.first_scheduled_time == 0.5
    assert r.first_token_time == first.end
    assert r.finished_time == second.end


def test_events_only_when_enabled() -> None:
    for enabled in (False, True):
        core = make_core(enable_kv_cache_events=enabled)
        core.add_request(req("a", range(8), max_tokens=1))
        assert bool(core.step(0.0).kv_events) is enabled


def test_non_integer_token_ids_are_rejected_not_fatal() -> None:
    core = make_core()
    for bad in ([1.5, 2], ["a"], [2**32]):
        with pytest.raises(RequestRejected, match="integers"):
            core.add_request(req("bad", bad))  # type: ignore[arg-type]  # not token ids
    assert not core.has_unfinished_requests()


def test_request_whose_peak_exactly_fills_the_pool_is_accepted() -> None:
    core = make_core(num_gpu_blocks=8)  # 32 tokens: 30 prompt + 3 output peaks at 32
    core.add_request(req("exact", range(30), max_tokens=3))
    assert _run(core) > 0


def test_no_stop_token_before_min_tokens() -> None:
    core = EngineCore(small_config(), output_palette=[5, 6])
    core.add_request(req("s", [1] * 4, max_tokens=40, min_tokens=10, stop_token_ids=(6,)))
    toks = _collect(core)["s"]
    assert 6 not in toks[:10] and len(toks) > 10


def test_lowest_priority_running_request_is_preempted() -> None:
    core = make_core(num_gpu_blocks=6, scheduling_policy="priority")
    core.add_request(EngineRequest("low", [1] * 8, SamplingParams(max_tokens=16), priority=5))
    core.add_request(EngineRequest("high", [2] * 8, SamplingParams(max_tokens=16), priority=0))
    now = 0.0
    while core.scheduler.num_preemptions == 0:
        now = core.step(now).end
    # "high" is the newest, but "low" has the lower priority (higher value).
    assert core.requests["low"].status == RequestStatus.PREEMPTED
    assert core.requests["high"].status == RequestStatus.RUNNING


def test_a_priority_other_than_0_needs_the_priority_policy() -> None:
    spec = EngineRequest("p", [1] * 8, SamplingParams(max_tokens=4), priority=3)
    with pytest.raises(RequestRejected, match="Got priority 3 but Priority scheduling is not"):
        make_core().add_request(spec)
    make_core(scheduling_policy="priority").add_request(spec)


@pytest.mark.parametrize(
    ("policy", "victim", "waiting"),
    [("priority", "late", ["early", "late"]), ("fcfs", "early", ["early", "earliest"])],
)
def test_the_policy_picks_the_victim_and_where_it_waits_again(
    policy: str, victim: str, waiting: list[str]
) -> None:
    """Priority: vLLM's max(running, key=(priority, arrival_time)), and the preempted request
    waits again at its arrival's place ("late" arrived last but was admitted first). FCFS:
    the newest admitted (running.pop()), back in front of the queue."""
    core = make_core(num_gpu_blocks=6, scheduling_policy=policy)
    core.add_request(EngineRequest("late", [1] * 8, SamplingParams(max_tokens=16), 2.0))
    now = core.step(0.0).end  # "late" runs alone
    for name, arrival, token in (("early", 1.0, 2), ("earliest", 0.5, 3)):
        # (prompts of their own: one admitted after the other in a pass would hit its blocks)
        spec = EngineRequest(name, [token] * 8, SamplingParams(max_tokens=16), arrival)
        core.add_request(spec)
    now = core.step(now).end
    running = [r.request_id for r in core.scheduler.running]
    admitted = "earliest" if policy == "priority" else "early"  # (fcfs: in the order added)
    assert running == ["late", admitted]
    while core.scheduler.num_preemptions == 0:
        now = core.step(now).end
    assert core.requests[victim].status == RequestStatus.PREEMPTED
    assert [r.request_id for r in core.scheduler.waiting] == waiting


def test_vllm_hash_algo_publishes_vllms_block_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine keys and publishes the hashes vLLM 0.33.0 computed for the same tokens
    and seed (tests/kv/data), so a router rehashing token ids finds its blocks."""
    ref = json.loads(
        (Path(__file__).parent.parent / "kv" / "data" / "vllm_0.33.0_block_hashes.json").read_text()
    )
    case = next(
        c for c in ref["cases"]
        if (c["algo"], c["pythonhashseed"], c["prompt"]) == ("sha256_cbor", "0", "A")
    )  # fmt: skip
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    core = make_core(
        block_size=16, prefix_caching_hash_algo="sha256_cbor", enable_kv_cache_events=True
    )
    core.add_request(req("a", case["token_ids"], max_tokens=1))
    events, now = [], 0.0
    while core.has_unfinished_requests():
        result = core.step(now)
        events += result.kv_events
        now = result.end
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [h for e in stored for h in e.block_hashes] == case["event_hashes_int"]
    assert stored[0].parent_block_hash is None


def test_unknown_hash_algo_is_refused() -> None:
    with pytest.raises(ConfigError, match="prefix_caching_hash_algo"):
        make_core(prefix_caching_hash_algo="md5")


def test_snapshot_names_the_adapters_of_unfinished_requests_oldest_first() -> None:
    core = make_core(enable_lora=True, max_loras=1)
    for rid, lora in (("b1", "B"), ("n1", None), ("a1", "A"), ("b2", "B")):
        spec = req(rid, [7] * 8, max_tokens=3)
        core.add_request(EngineRequest(spec.request_id, spec.prompt_token_ids, spec.sampling,
                                       lora_name=lora))  # fmt: skip
    assert core.snapshot().lora_adapters == ("B", "A")  # running and waiting alike
    _run(core)
    assert core.snapshot().lora_adapters == ()
    assert make_core().snapshot().lora_adapters == ()  # LoRA off: never listed


def test_a_core_without_output_objects_runs_the_same_passes() -> None:
    # Replay reads no RequestOutput: with emit_outputs off a pass builds none, and every
    # finished record, pass end and per-pass stat is what the emitting core gives.
    from mocker.engine.virtual import VirtualDriver

    def steps(
        emit: bool,
    ) -> tuple[list[tuple[float, float, SchedulerStats]], list[FinishedRequestStats], int]:
        core = make_core(num_gpu_blocks=24)  # small: preemptions happen too
        core.emit_outputs = emit
        specs = [req(f"r{i}", range(i, i + 9 + 3 * i), max_tokens=5 + i, arrival=0.001 * i,
                     min_tokens=1) for i in range(8)]  # fmt: skip
        passes: list[tuple[float, float, SchedulerStats]] = []
        finished: list[FinishedRequestStats] = []
        outputs = 0
        for result in VirtualDriver(core).steps(specs):
            passes.append((result.start, result.end, result.stats))
            finished += result.finished
            outputs += len(result.outputs)
        return passes, finished, outputs

    on, off = steps(True), steps(False)
    assert on[0] == off[0] and on[1] == off[1]
    assert on[2] > 0 and off[2] == 0
    assert sum(stats.num_generated_tokens for _, _, stats in off[0]) == on[2]
    assert any(stats.num_preemptions for _, _, stats in off[0])


def test_a_handed_over_prompt_is_grown_in_place_and_otherwise_copied() -> None:
    """`handed_over` (replay's fresh lists): the request takes the spec's prompt and hash
    lists as its own and grows them; without it (or for lists it cannot grow, a tuple)
    they are copied and the spec's stay as they were. Either way the same passes."""
    from dataclasses import replace

    from mocker.kv.hashing import BlockHash

    def played(handed_over: bool, tuples: bool = False) -> tuple[EngineRequest, list[int]]:
        core = make_core()
        prompt, hashes = list(range(10, 22)), [BlockHash(7), BlockHash(8)]  # 2 full blocks
        spec = replace(req("a", prompt, max_tokens=6), block_hashes=hashes)
        if tuples:
            spec = replace(spec, prompt_token_ids=tuple(prompt), block_hashes=tuple(hashes))
        request = core.add_request(spec, handed_over=handed_over)
        assert (request.all_token_ids is spec.prompt_token_ids) == (handed_over and not tuples)
        assert (request.block_hashes is spec.block_hashes) == (handed_over and not tuples)
        tokens = _collect(core)["a"]
        return spec, tokens

    grown, tokens = played(True)
    assert list(grown.prompt_token_ids) == list(range(10, 22)) + tokens  # the output appended
    assert len(grown.block_hashes or ()) == 4  # and the blocks it filled hashed there
    copied, same = played(False)
    assert list(copied.prompt_token_ids) == list(range(10, 22)) and same == tokens
    assert list(copied.block_hashes or ()) == [7, 8]
    as_tuples, same = played(True, tuples=True)
    assert list(as_tuples.prompt_token_ids) == list(range(10, 22)) and same == tokens


@pytest.mark.parametrize("eos_probability", [0.0, 0.05])
def test_tokens_are_drawn_ahead_only_where_the_core_emits_outputs(eos_probability: float) -> None:
    """Live (outputs emitted) a request's next tokens are drawn ahead as an array; a replay
    (no outputs; its decode runs draw their own tokens) draws one at a time. Same tokens."""
    specs = [req(f"r{i}", range(1 + i, 30 + i), max_tokens=40 + 7 * i) for i in range(5)]
    tokens: list[dict[str, TokenIds]] = []
    for emit in (True, False):
        core = make_core(eos_probability=eos_probability)
        core.emit_outputs = emit
        requests = [core.add_request(spec) for spec in specs]
        drawn_ahead = False
        now = 0.0
        while core.has_unfinished_requests():
            now = core.step(now).end
            drawn_ahead |= any(r.drawn is not None for r in requests if not r.is_finished)
        assert drawn_ahead == emit
        tokens.append({r.request_id: r.all_token_ids[r.num_prompt_tokens :] for r in requests})
    assert tokens[0] == tokens[1]
    if eos_probability:
        lengths = [len(t) for t in tokens[0].values()]
        assert any(n < 40 for n in lengths)  # EOS drawn, before max_tokens


def _silent_tokens(
    monkeypatch: pytest.MonkeyPatch, column_min: int, **sampling: Any
) -> tuple[dict[str, TokenIds], int, float]:
    """Run 40 requests with outputs off (as replay runs a core): every request's tokens,
    how many passes drew theirs as one array, and when the last pass ended."""
    from mocker.engine import core_pass
    from mocker.output_tokens import OutputTokenSampler

    monkeypatch.setattr(core_pass, "COLUMN_MIN_REQUESTS", column_min)
    columns: list[int] = []
    token_column = OutputTokenSampler.token_column

    def counted(self: OutputTokenSampler, seeds: list[int], indexes: list[int]) -> list[int]:
        columns.append(len(seeds))
        return token_column(self, seeds, indexes)

    monkeypatch.setattr(OutputTokenSampler, "token_column", counted)
    core = make_core(max_num_seqs=64, max_num_batched_tokens=256, num_gpu_blocks=512,
                     eos_probability=0.05)  # fmt: skip
    core.emit_outputs = False
    for i in range(40):
        core.add_request(req(f"r{i}", range(i, i + 9 + i % 5), max_tokens=12 + i % 7, **sampling))
    requests = dict(core.requests)
    end = _run(core)
    assert all(r.status.is_finished for r in requests.values())
    return {rid: r.all_token_ids for rid, r in requests.items()}, len(columns), end


def test_a_silent_pass_draws_its_tokens_as_one_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay's pass with many requests sampling draws their tokens in one array: the very
    tokens drawn one at a time (the same outputs, so the same ends and passes)."""
    one_by_one, none, end = _silent_tokens(monkeypatch, 10**9, ignore_eos=True)
    as_arrays, passes, end_arrays = _silent_tokens(monkeypatch, 24, ignore_eos=True)
    assert none == 0 and passes > 5
    assert as_arrays == one_by_one and end_arrays == end


def test_a_pass_that_may_draw_eos_draws_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """EOS possible (not ignored, past min_tokens): tokens are drawn one by one, so EOS ends
    requests early just as it does with outputs on."""
    one_by_one, _, end = _silent_tokens(monkeypatch, 10**9)
    tokens, passes, end_after = _silent_tokens(monkeypatch, 1)
    assert passes == 0
    assert tokens == one_by_one and end_after == end
    full = {f"r{i}": (9 + i % 5) + (12 + i % 7) for i in range(40)}
    assert any(len(t) < full[rid] for rid, t in tokens.items())  # some ended early on EOS


def test_a_pass_sets_every_field_of_its_outputs() -> None:
    # The pass builds its outputs without their __init__: a field it forgot would be unset.
    core = make_core()
    core.add_request(req("a", list(range(12)), max_tokens=3))
    outputs = [out for _ in range(4) for out in core.step(core.time).outputs]
    assert [len(out.new_token_ids) for out in outputs] == [1, 1, 1]
    for out in outputs:
        assert all(hasattr(out, f.name) for f in dataclasses.fields(RequestOutput))
        assert out == RequestOutput(
            **{f.name: getattr(out, f.name) for f in dataclasses.fields(out)}
        )
    assert [out.finished for out in outputs] == [False, False, True]
