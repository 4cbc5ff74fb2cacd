"""The pass's token draw: drawn ahead per request, the same tokens as drawn one by one."""

from __future__ import annotations

import pytest

from mocker.engine.stopping import DRAW_AHEAD, DRAW_FIRST, DRAW_MIN, draw
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
    max_tokens = 252 + 2 * 256 + 22
    request = _request(max_tokens, sampling)
    expected = [
        sampler.token(request.token_seed, k, not sampling.ignore_eos and k >= sampling.min_tokens)
        for k in range(max_tokens)
    ]
    got, sizes = [], []
    for k in range(max_tokens):  # as the pass reads it: the drawn list, else draw()
        got.append(_token(sampler, request, k, sizes))
    assert got == expected
    # Twice as far ahead each time a draw is read to its end, up to DRAW_AHEAD; the rest.
    assert DRAW_FIRST == 4 and DRAW_AHEAD == 256
    assert sizes == [4, 8, 16, 32, 64, 128, 256, 256, 22]


def _token(sampler: OutputTokenSampler, request: Request, k: int, sizes: list[int]) -> int:
    drawn, j = request.drawn, k - request.drawn_from
    if drawn and 0 <= j < len(drawn):
        return drawn[j]
    tok = draw(sampler, request, k)
    assert request.drawn is not None
    sizes.append(len(request.drawn))
    return tok


def test_a_request_not_stepped_token_by_token_draws_little_ahead() -> None:
    """As in a replay, whose decode runs draw their own tokens: a draw left unread to its
    end is followed by a short one, not a longer one."""
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.2, seed=1)
    request = _request(1000, SamplingParams())
    sizes: list[int] = []
    k = 0
    for step in (1, 1, 1, 1, 1, 1, 1, 1, 40, 1, 1, 300, 1, 2):
        assert _token(sampler, request, k, sizes) == sampler.token(request.token_seed, k, True)
        k += step
    # 4 read to its end, so 8 (k=4..11); left at k=8 for k=48: back to 4; left for k=350: 4.
    assert sizes == [4, 8, 4, 4]


def test_a_short_draw_is_made_one_by_one_all_at_once() -> None:
    sampler = OutputTokenSampler(range(300), eos_token_id=5, eos_probability=0.2, seed=1)
    request = _request(3, SamplingParams(min_tokens=1))
    assert draw(sampler, request, 0) == sampler.token(request.token_seed, 0, False)
    assert request.drawn == [sampler.token(request.token_seed, k, k >= 1) for k in range(3)]
    assert DRAW_FIRST < DRAW_MIN  # (the first draw of any request is one by one)
