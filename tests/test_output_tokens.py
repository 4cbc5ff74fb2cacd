"""Output tokens: stateless determinism, palette, EOS probability."""

from array import array

import pytest

from mocker.mixing import MASK64, splitmix64
from mocker.output_tokens import OutputTokenSampler


def test_deterministic_and_position_dependent() -> None:
    s = OutputTokenSampler(range(1000), eos_token_id=1, eos_probability=0.0, seed=0)
    seed = s.request_seed("req-1")
    assert seed == OutputTokenSampler(range(1000), 1, 0.0, 0).request_seed("req-1")
    assert seed != OutputTokenSampler(range(1000), 1, 0.0, 1).request_seed("req-1")
    seq = [s.token(seed, k, True) for k in range(50)]
    assert seq == [s.token(seed, k, True) for k in range(50)]
    assert len(set(seq)) > 40 and 1 not in seq


def test_palette_only_and_eos_never_from_palette() -> None:
    s = OutputTokenSampler([1, 5, 9], eos_token_id=1, eos_probability=0.0, seed=0)
    assert {s.token(123, k, True) for k in range(200)} == {5, 9}
    with pytest.raises(ValueError, match="other than EOS"):
        OutputTokenSampler([1], eos_token_id=1, eos_probability=0.0, seed=0)


def test_eos_probability_rate_and_gate() -> None:
    s = OutputTokenSampler(range(100), eos_token_id=1, eos_probability=0.25, seed=0)
    seed = s.request_seed("x")
    draws = [s.token(seed, k, True) for k in range(4000)]
    rate = draws.count(1) / len(draws)
    assert 0.22 < rate < 0.28  # deterministic for this seed; binomial sd ≈ 0.007
    eos = s.eos_token_id
    assert eos not in [s.token(seed, k, False) for k in range(4000)]
    always = OutputTokenSampler(range(100), 1, 1.0, 0)
    assert all(always.token(seed, k, True) == 1 for k in range(100))


def test_the_inlined_mixer_is_splitmix64() -> None:
    s = OutputTokenSampler(range(1000), eos_token_id=1, eos_probability=0.0, seed=0)
    palette = [t for t in range(1000) if t != 1]  # EOS is never drawn from the palette
    seed = s.request_seed("req-1")
    for k in range(200):
        x = splitmix64((seed + k) & MASK64)
        assert s.token(seed, k, False) == palette[(x >> 7) % len(palette)]
    assert s.tokens(seed, 0, 200) == [s.token(seed, k, False) for k in range(200)]


def test_token_rows_are_each_requests_tokens() -> None:
    s = OutputTokenSampler(range(50, 250), eos_token_id=2, eos_probability=0.0, seed=3)
    seeds = [s.request_seed(f"r{i}") for i in range(5)] + [(1 << 64) - 1]
    starts = [0, 7, 100, 3, 0, 12]
    rows = s.token_rows(seeds, starts, 9)
    assert all(isinstance(row, array) and row.typecode == "I" for row in rows)
    assert [list(row) for row in rows] == [
        s.tokens(seed, start, 9) for seed, start in zip(seeds, starts, strict=True)
    ]
    assert list(rows[1]) == [s.token(seeds[1], k, False) for k in range(7, 16)]
    assert s.token_rows(seeds, starts, 0) == [array("I")] * len(seeds)


def test_token_column_is_each_pairs_token() -> None:
    s = OutputTokenSampler(range(50, 250), eos_token_id=2, eos_probability=0.5, seed=3)
    seeds = [s.request_seed(f"r{i}") for i in range(5)] + [(1 << 64) - 1]
    indexes = [0, 7, 100, 3, 0, 12]
    column = s.token_column(seeds, indexes)
    assert column == [s.token(seed, k, False) for seed, k in zip(seeds, indexes, strict=True)]
    assert s.token_column([], []) == []


def test_the_inlined_eos_draw_is_splitmix64_of_the_token_mix() -> None:
    s = OutputTokenSampler(range(1000), eos_token_id=1, eos_probability=0.3, seed=5)
    threshold = int(0.3 * (1 << 53))
    seed = s.request_seed("req-2")
    draws = 0
    for k in range(500):
        x = splitmix64((seed + k) & MASK64)
        eos = (splitmix64(x) >> 11) < threshold
        draws += eos
        assert (s.token(seed, k, True) == 1) is eos
    assert 100 < draws < 200  # both branches taken


@pytest.mark.parametrize("eos_probability", [0.0, 0.3, 1.0])
def test_draws_are_the_tokens_drawn_one_by_one(eos_probability: float) -> None:
    s = OutputTokenSampler(range(500), eos_token_id=7, eos_probability=eos_probability, seed=3)
    for rid in ("a", "b", "c"):
        seed = s.request_seed(rid)
        seed |= 1 << 63 if rid == "c" else 0  # a seed past int64: numpy must wrap it alike
        for start, count, eos_from in ((0, 64, 0), (5, 40, 20), (100, 12, 1 << 62), (3, 9, 4)):
            one_by_one = [s.token(seed, k, k >= eos_from) for k in range(start, start + count)]
            assert s.draws(seed, start, count, eos_from) == one_by_one
            if eos_probability == 1.0:  # the gate: EOS exactly from eos_from on
                assert [t == 7 for t in one_by_one] == [
                    k >= eos_from for k in range(start, start + count)
                ]
