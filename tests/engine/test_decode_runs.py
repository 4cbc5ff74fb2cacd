"""Decode runs: the passes `step()` would run, applied at once, with the same end state."""

from __future__ import annotations

from mocker.engine.core import EngineCore
from mocker.engine.decode_runs import run_decodes
from mocker.engine.stats import FinishedRequestStats
from mocker.kv.block import block_ids
from tests.support.engines import req, small_config


def _decoding_core() -> tuple[EngineCore, float]:
    """Three requests past their prompts, about to decode."""
    core = EngineCore(small_config(num_gpu_blocks=64))
    for i in range(3):
        core.add_request(req(f"r{i}", [i + 1] * (5 + 3 * i), max_tokens=10 + i, ignore_eos=True))
    now = core.step(0.0).end
    return core, now


def _stepwise(
    core: EngineCore, now: float, passes: int
) -> tuple[float, list[FinishedRequestStats]]:
    finished: list[FinishedRequestStats] = []
    for _ in range(passes):
        result = core.step(now)
        now = result.end
        finished += result.finished
    return now, finished


def test_a_run_equals_the_same_passes_stepped() -> None:
    fast, now = _decoding_core()
    slow, _ = _decoding_core()
    run = run_decodes(fast, now, stop_at=float("inf"))
    assert run is not None and run.passes == 9  # until r0 reaches its 10 tokens
    end, finished = _stepwise(slow, now, run.passes)
    assert run.end == end and run.finished == finished
    assert [f.request_id for f in finished] == ["r0"]
    for rid in ("r1", "r2"):
        a, b = fast.requests[rid], slow.requests[rid]
        assert a.all_token_ids == b.all_token_ids and a.block_hashes == b.block_hashes
        assert block_ids(a.blocks) == block_ids(b.blocks)
    assert fast.pool.cached_hashes() == slow.pool.cached_hashes()


def test_a_run_stops_at_the_first_pass_ending_at_or_after_stop_at() -> None:
    core, now = _decoding_core()
    one = core.pass_duration(0, 3, core.snapshot().num_used_blocks)
    run = run_decodes(core, now, stop_at=now + 2.5 * one)
    assert run is not None and run.passes == 3 and not run.finished


def test_no_run_while_a_request_still_prefills() -> None:
    core = EngineCore(small_config())
    core.add_request(req("a", [1] * 8, max_tokens=4, ignore_eos=True))
    assert run_decodes(core, 0.0, stop_at=1.0) is None
