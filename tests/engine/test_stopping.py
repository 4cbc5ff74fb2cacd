"""The pass's token draw: drawn ahead per request, the same tokens as drawn one by one."""

from __future__ import annotations

import pytest

from mocker.config import EngineConfig
from mocker.engine import core_pass
from mocker.engine.core import EngineCore
from mocker.engine.stopping import DRAW_AHEAD, DRAW_MIN, DRAW_STAGGER, draw
from mocker.output_tokens import OutputTokenSampler
from mocker.request import EngineRequest, Request, SamplingParams
from tests.support.engines import core_request


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(min_tokens=30), SamplingParams(ignore_eos=True)],
)
def test_draw_gives_each_token_as_the_sampler_does_and_draws_ahead(
    sampling: SamplingParams,
) -> None:
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.2, seed=1)
    max_tokens = 2 * DRAW_AHEAD + 22
    request = core_request("r", [1, 2, 3], max_tokens, sampling, token_seed=987654321)
    expected = [
        sampler.token(request.token_seed, k, not sampling.ignore_eos and k >= sampling.min_tokens)
        for k in range(max_tokens)
    ]
    got, calls = [], 0
    for k in range(max_tokens):  # as the pass reads it: the drawn list, else draw()
        drawn, j = request.drawn, k - request.drawn_from
        if drawn and 0 <= j < len(drawn):
            got.append(drawn[j])
        else:
            calls += 1
            got.append(draw(sampler, request, k))
    assert got == expected
    # Drawn ahead: a first window of DRAW_AHEAD less the seed modulo DRAW_STAGGER (207 here),
    # then DRAW_AHEAD, then the last 71 (>= DRAW_MIN) at once.
    assert request.token_seed % DRAW_STAGGER == 49
    assert calls == 3


def test_a_short_remainder_is_drawn_one_by_one_all_at_once() -> None:
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.2, seed=1)
    request = core_request(
        "r", [1, 2, 3], DRAW_MIN - 1, SamplingParams(min_tokens=3), token_seed=987654321
    )
    assert draw(sampler, request, 0) == sampler.token(request.token_seed, 0, False)
    assert request.drawn == [
        sampler.token(request.token_seed, k, k >= 3) for k in range(DRAW_MIN - 1)
    ]


def test_a_first_window_is_as_long_as_the_seed_says_and_then_draw_ahead() -> None:
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.0, seed=1)
    lengths = set()
    for seed in range(0, 10_000, 37):
        request = core_request("r", [1], 1000, SamplingParams(), token_seed=seed)
        draw(sampler, request, 0)
        assert request.drawn is not None
        first = len(request.drawn)
        assert first == DRAW_AHEAD - seed % DRAW_STAGGER
        lengths.add(first)
        draw(sampler, request, first)  # the next window: a whole one
        assert len(request.drawn) == DRAW_AHEAD and request.drawn_from == first
    assert len(lengths) == DRAW_STAGGER  # every length from DRAW_AHEAD - 127 to DRAW_AHEAD


def test_requests_started_together_draw_ahead_in_different_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load generator's N streams start in one pass; their next windows must not all be
    drawn in one later pass (at 500 streams that pass took 2.5 ms instead of 0.35)."""
    calls: list[int] = []

    def counted(sampler: OutputTokenSampler, request: Request, k: int) -> int:
        calls.append(k)
        return draw(sampler, request, k)

    monkeypatch.setattr(core_pass, "draw", counted)
    core = EngineCore(EngineConfig.of(max_num_seqs=256, num_gpu_blocks=8192))
    n = 200
    shortened = []  # how much shorter each request's first window is
    for i in range(n):
        sampling = SamplingParams(max_tokens=3 * DRAW_AHEAD, ignore_eos=True)
        request = core.add_request(EngineRequest(f"r{i}", [7 + i, 8, 9, 10], sampling))
        shortened.append(request.token_seed % DRAW_STAGGER)
    now, per_pass = 0.0, []
    while core.has_unfinished_requests():
        before = len(calls)
        result = core.step(now)
        now = result.end
        per_pass.append(len(calls) - before)
    # Every request: its first window, two whole ones, and the rest if any.
    assert sum(per_pass) == sum(3 + (s > 0) for s in shortened)
    assert per_pass[0] == n  # the first token: every request's first window
    # After it: spread over DRAW_STAGGER passes, never more than a few in one pass.
    assert max(per_pass[1:]) <= n // 10
