"""The pass's token draw: drawn ahead per request, the same tokens as drawn one by one."""

from __future__ import annotations

import pytest

from mocker.engine.stopping import DRAW_AHEAD, DRAW_MIN, draw
from mocker.output_tokens import OutputTokenSampler
from mocker.request import Request, SamplingParams


def _request(max_tokens: int, sampling: SamplingParams) -> Request:
    return Request("r", [1, 2, 3], 3, max_tokens, sampling, 0.0, token_seed=987654321)


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(), SamplingParams(min_tokens=30), SamplingParams(ignore_eos=True)],
)
def test_draw_gives_each_token_as_the_sampler_does_and_draws_ahead(
    sampling: SamplingParams,
) -> None:
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.2, seed=1)
    max_tokens = 2 * DRAW_AHEAD + 22
    request = _request(max_tokens, sampling)
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
    # Drawn ahead DRAW_AHEAD at a time, then the last 22 (>= DRAW_MIN) at once.
    assert calls == 3


def test_a_short_remainder_is_drawn_one_by_one_all_at_once() -> None:
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.2, seed=1)
    request = _request(DRAW_MIN - 1, SamplingParams(min_tokens=3))
    assert draw(sampler, request, 0) == sampler.token(request.token_seed, 0, False)
    assert request.drawn == [
        sampler.token(request.token_seed, k, k >= 3) for k in range(DRAW_MIN - 1)
    ]
