"""Trace prompts: engine block hashes keyed by the hash-id prefix, filler ids, a real tail."""

from __future__ import annotations

import random
from array import array

import pytest

from mocker.compiled import ENV
from mocker.compiled import cprompts as _cprompts
from mocker.replay.prompts import FILLER_TOKEN, PromptBuilder
from mocker.replay.trace import TraceRequest

BS, TBS = 16, 64


def req(n: int, *ids: int) -> TraceRequest:
    return TraceRequest(0.0, n, 1, ids, 1)


def test_equal_id_prefixes_share_exactly_their_blocks() -> None:
    b = PromptBuilder(BS, TBS, 1000, seed=1)
    _, x = b.prompt(req(256, 1, 2, 3, 4))
    _, y = b.prompt(req(256, 1, 2, 9, 4))
    assert len(x) == len(y) == 256 // BS
    assert x[:8] == y[:8]  # ids 1, 2: four engine blocks each
    assert not set(x[8:]) & set(y[8:])  # from the first differing id on, nothing is shared
    assert len(set(x)) == len(x)


def test_a_partial_trace_block_shares_its_full_engine_blocks() -> None:
    b = PromptBuilder(BS, TBS, 1000, seed=1)
    short_tokens, short = b.prompt(req(100, 5, 6))  # id 6 holds 36 tokens: 2 full blocks
    _, long = b.prompt(req(192, 5, 6, 7))
    assert len(short) == 6 and short == long[:6]
    assert list(short_tokens[:96]) == [FILLER_TOKEN] * 96
    tail = short_tokens[96:]
    assert len(tail) == 4 and all(2 <= t < 1000 for t in tail)


def test_the_same_id_after_another_prefix_is_other_content() -> None:
    b = PromptBuilder(BS, TBS, 1000, seed=1)
    _, x = b.prompt(req(128, 1, 2))
    _, y = b.prompt(req(128, 3, 2))
    assert not set(x) & set(y)


def test_deterministic_per_seed() -> None:
    r = req(150, 1, 2, 3)
    assert PromptBuilder(BS, TBS, 1000, 7).prompt(r) == PromptBuilder(BS, TBS, 1000, 7).prompt(r)
    a_tokens, a = PromptBuilder(BS, TBS, 1000, 7).prompt(r)
    b_tokens, b = PromptBuilder(BS, TBS, 1000, 8).prompt(r)
    assert not set(a) & set(b) and a_tokens[144:] != b_tokens[144:]


def test_engine_blocks_straddling_trace_blocks_share_by_the_ids_they_cover() -> None:
    # A Mamba hybrid's engine block (here 24 tokens) does not divide a 64-token trace block:
    # block j is shared exactly when the ids of every trace block it touches are.
    b = PromptBuilder(24, TBS, 1000, seed=1)
    tokens, x = b.prompt(req(200, 1, 2, 3, 4))
    _, y = b.prompt(req(200, 1, 2, 9, 4))
    assert len(x) == len(y) == 200 // 24 and len(set(x)) == len(x)
    # Blocks 0..4 end at positions 23, 47, 71, 95, 119 (ids 1, 1, 2, 2, 2): shared; block 5
    # ends at 143, in the third trace block, where the ids differ: nothing after is shared.
    assert x[:5] == y[:5]
    assert not set(x[5:]) & set(y[5:])
    assert len(tokens) == 200 and list(tokens[: 8 * 24]) == [FILLER_TOKEN] * (8 * 24)
    # The tail (positions 192..199, in the fourth trace block) is the same for equal ids.
    assert tokens[192:] == b.prompt(req(200, 7, 8, 9, 4))[0][192:]


@pytest.mark.parametrize("block_size", [BS, 24])
def test_a_prompt_is_two_vectors(block_size: int) -> None:
    """Ids as an array('I') and hashes as an array('Q'): one buffer each, no int object per
    entry (the engine takes both as they are, handed over)."""
    tokens, hashes = PromptBuilder(block_size, TBS, 1000, seed=1).prompt(req(200, 1, 2, 3, 4))
    assert isinstance(tokens, array) and tokens.typecode == "I" and len(tokens) == 200
    if block_size == BS:
        assert isinstance(hashes, array) and hashes.typecode == "Q" and len(hashes) == 200 // BS


def test_every_id_is_an_int_below_the_vocabulary() -> None:
    # The engine takes these ids unchecked (`ids_in_range`): they must be ints in [0, 2^32),
    # which ids below the vocabulary (vocab_size <= 2^31 by the config) and the filler are.
    b = PromptBuilder(BS, TBS, 1000, seed=3)
    for n in (1, 15, 16, 100, 257):
        tokens, _ = b.prompt(req(n, *range(1, 7)))
        assert len(tokens) == n and all(type(t) is int and 0 <= t < 1000 for t in tokens)
    tokens, _ = PromptBuilder(BS, TBS, 2, seed=3).prompt(req(40, 1, 2))  # the smallest vocabulary
    assert all(type(t) is int and 0 <= t < 2**32 for t in tokens)


def test_a_two_token_vocabulary_still_gives_tokens() -> None:
    tokens, _ = PromptBuilder(BS, TBS, 2, 0).prompt(req(20, 1))
    assert len(tokens) == 20 and set(tokens[16:]) <= {0, 1}


@pytest.mark.parametrize("vocab", [2, 3, 129_280])
def test_a_tail_of_tokens_is_each_token_of_its_positions(vocab: int) -> None:
    builder = PromptBuilder(16, 512, vocab, seed=7)
    for hash_id in (0, 5, 2**63 + 11):
        expected = [builder._token(hash_id, p) for p in range(100, 131)]
        assert builder._tokens(hash_id, 100, 31) == expected


@pytest.mark.skipif(_cprompts is None, reason="mocker.replay._cprompts was not built")
@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_mixing_gives_the_python_prompts(seed: int) -> None:
    """mocker/replay/_cprompts.c against the Python code (the reference): the same ids and
    hashes for random prompts, ids of 64 bits and more included, tiny vocabularies too."""
    rng = random.Random(seed)
    for _ in range(60):
        bs = rng.choice([1, 4, 16, 64])
        tbs = bs * rng.choice([1, 2, 32])
        vocab = rng.choice([2, 3, 1000, 2**31])
        n = rng.randint(1, 5 * tbs)
        ids = [rng.choice([rng.randrange(50), rng.getrandbits(64), rng.getrandbits(80)])
               for _ in range(-(-n // tbs))]  # fmt: skip
        request = TraceRequest(0.0, n, 1, tuple(ids), 1)
        c = PromptBuilder(bs, tbs, vocab, seed, compiled=True).prompt(request)
        py = PromptBuilder(bs, tbs, vocab, seed, compiled=False).prompt(request)
        assert list(c[0]) == list(py[0]) and list(c[1]) == list(py[1])
        assert isinstance(c[0], array) and isinstance(c[1], array)


def test_the_env_turns_the_compiled_mixing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "0")
    assert PromptBuilder(BS, TBS, 1000, 1)._c is None
    monkeypatch.setenv(ENV, "auto")
    assert (PromptBuilder(BS, TBS, 1000, 1)._c is None) is (_cprompts is None)
