"""What a pass's timing model is told: its prefill chunks and their prefixes, its decodes and
the context they read, by hand."""

from __future__ import annotations

from mocker.engine.core import EngineCore
from mocker.timing import PassShape
from tests.support.engines import CompositionTiming, req, small_config


def _core(**changes: object) -> tuple[EngineCore, CompositionTiming]:
    timing = CompositionTiming()
    return EngineCore(small_config(**changes), timing=timing), timing


def _shapes(timing: CompositionTiming) -> list[tuple[int, int, int, int, int]]:
    return [s[:5] for s in timing.shapes]


def test_prefills_then_decodes_reading_their_whole_sequence() -> None:
    core, timing = _core()
    core.add_request(req("a", list(range(1, 11)), max_tokens=3, ignore_eos=True))
    core.add_request(req("b", list(range(20, 26)), max_tokens=3, ignore_eos=True))
    now = 0.0
    for _ in range(3):
        now = core.step(now).end
    # (prefill tokens, chunks, their prefixes, decodes, the decodes' context): one pass of
    # both prompts; then each decode reads its prompt and its tokens so far (11 + 7, 12 + 8).
    assert _shapes(timing) == [(16, 2, 0, 0, 0), (0, 0, 0, 2, 18), (0, 0, 0, 2, 20)]
    assert core.scheduler.count_context


def test_a_chunked_prompt_reads_its_earlier_chunks_and_a_hit_its_prefix() -> None:
    core, timing = _core(max_num_batched_tokens=16)
    core.add_request(req("a", list(range(1, 41)), max_tokens=1, ignore_eos=True))
    now = 0.0
    while core.has_unfinished_requests():
        now = core.step(now).end
    assert _shapes(timing) == [(16, 1, 0, 0, 0), (16, 1, 16, 0, 0), (8, 1, 32, 0, 0)]
    timing.shapes.clear()
    # The same 36-token prefix again: 9 cached blocks of 4 hit, the rest is computed after them.
    core.add_request(req("b", [*range(1, 37), 99, 98], max_tokens=1, ignore_eos=True))
    core.step(now)
    assert _shapes(timing) == [(2, 1, 36, 0, 0)]


def test_decodes_beside_a_chunk_and_a_preempted_decode_taken_off_the_pass() -> None:
    core, timing = _core(num_gpu_blocks=9, max_num_batched_tokens=64)
    core.add_request(req("a", list(range(1, 9)), max_tokens=20, ignore_eos=True))
    now = core.step(0.0).end  # a: 8 prompt tokens, 2 blocks
    core.add_request(req("b", list(range(50, 62)), max_tokens=20, ignore_eos=True))
    now = core.step(now).end  # a decodes (reads 9), b prefills 12 tokens
    assert _shapes(timing)[-1] == (12, 1, 0, 1, 9)
    # Blocks run out as both grow: the newest (b) is preempted, and its decode is not timed.
    while not core.scheduler.num_preemptions:
        now = core.step(now).end
    last = timing.shapes[-1]
    a = core.requests["a"]
    assert core.requests["b"].num_preemptions == 1
    # a's decode read its sequence before this pass's token (one fewer than it has now).
    assert (last.prefill_tokens, last.num_decodes, last.decode_context) == (
        0, 1, len(a.all_token_ids) - 1)  # fmt: skip
    assert isinstance(last, PassShape)
