"""Output tokens: stateless determinism, palette, EOS probability."""

from array import array

import numpy as np
import pytest

from mocker.mixing import MASK64, splitmix64, splitmix64_array
from mocker.output_tokens import OutputTokenSampler, palette_rank, palette_ranks


def test_deterministic_and_position_dependent() -> None:
    s = OutputTokenSampler(range(1000), eos_token_id=1, eos_probability=0.0, seed=0)
    seed = s.request_seed("req-1")
    assert seed == OutputTokenSampler(range(1000), 1, 0.0, 0).request_seed("req-1")
    assert seed != OutputTokenSampler(range(1000), 1, 0.0, 1).request_seed("req-1")
    seq = [s.token(seed, k, True) for k in range(50)]
    assert seq == [s.token(seed, k, True) for k in range(50)]
    assert len(set(seq)) > 30 and 1 not in seq  # (Zipf-like: common words recur)


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


def test_a_token_is_the_palette_rank_of_its_splitmix64() -> None:
    s = OutputTokenSampler(range(1000), eos_token_id=1, eos_probability=0.0, seed=0)
    palette = [t for t in range(1000) if t != 1]  # EOS is never drawn from the palette
    seed = s.request_seed("req-1")
    for k in range(200):
        x = splitmix64((seed + k) & MASK64)
        assert s.token(seed, k, False) == palette[palette_rank(x, len(palette))]
    assert s.tokens(seed, 0, 200) == [s.token(seed, k, False) for k in range(200)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 1000, 1024, 26_380])
def test_a_rank_is_in_the_palette_and_the_array_form_agrees(n: int) -> None:
    draws = [splitmix64(i) for i in range(3000)] + [0, MASK64, 1 << 32, (1 << 32) - 1]
    ranks = [palette_rank(m, n) for m in draws]
    assert all(0 <= r < n for r in ranks)
    assert palette_ranks(np.asarray(draws, dtype=np.uint64), n).tolist() == ranks


def test_ranks_follow_a_zipf_like_law() -> None:
    """Each octave of ranks [2^e - 1, 2^(e+1) - 1) is drawn alike (the last one running on
    to the palette's end), so a word's frequency falls as 1/rank: the palette's first words
    are the text's common ones, as in natural text."""
    n, draws = 26_380, 150_000
    ranks = palette_ranks(splitmix64_array(np.arange(draws, dtype=np.uint64)), n)
    octave = np.minimum(np.log2(ranks + 1).astype(np.int64), 13)
    octaves = np.bincount(octave, minlength=14)
    assert len(octaves) == 14  # 2^14 - 1 <= 26,380 < 2^15 - 1: the last octave holds the rest
    assert np.min(octaves) > 0.9 * draws / 14 and np.max(octaves) < 1.1 * draws / 14
    assert (ranks < 1023).mean() > 0.6  # two thirds of the words from the first 1,023
    inside = ranks[(ranks >= 1023) & (ranks < 2047)] - 1023  # uniform inside an octave
    assert abs(inside.mean() - 511.5) < 15
    assert len(np.unique(ranks)) > 15_000  # yet most of the palette appears


@pytest.mark.parametrize("n", [2, 3, 1023, 1024, 1025, 32_768, 32_769, 65_536])
def test_no_entry_outweighs_the_first(n: int) -> None:
    """The last octave is not a short one with a full octave's share: the palette's last
    entries are drawn no more often than its middle ones (a power of two once made the
    last entry as likely as the first)."""
    draws = 200_000
    ranks = palette_ranks(splitmix64_array(np.arange(draws, dtype=np.uint64)), n)
    counts = np.bincount(ranks.astype(np.int64), minlength=n)
    assert np.argmax(counts) == 0 or n <= 3
    tail = counts[-max(1, n // 64) :]
    assert np.max(tail) <= np.max(counts[: max(1, n // 2)])
    if n >= 1024:
        assert tail.mean() < 2 * draws / n  # about 1/(B * octave size) each, not 1/B


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


def test_the_eos_draw_is_splitmix64_of_the_token_mix() -> None:
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
