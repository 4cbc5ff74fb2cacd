"""Chained block hashes: exact chaining, seeding, extra keys, incremental extension."""

import json
import random
from array import array
from pathlib import Path
from typing import Any

import pytest
import xxhash

from mocker.compiled import ENV
from mocker.compiled import chash as _chash
from mocker.kv.hashing import (
    BlockHash,
    BlockHasher,
    BlockHashes,
    HashAlgo,
    VllmBlockHasher,
    extra_keys_bytes,
    hash_array,
    make_hasher,
)


def _ref(seed: int, parent: int, tokens: list[int], extra: bytes = b"") -> int:
    body = array("I", tokens).tobytes()
    payload = parent.to_bytes(8, "big") + len(body).to_bytes(4, "big") + body + extra
    return xxhash.xxh3_64_intdigest(payload, seed=seed)


def test_exact_values_and_chaining() -> None:
    h = BlockHasher(seed=0)
    none = xxhash.xxh3_64_intdigest(b"mocker:none-hash", seed=0)
    assert h.none_hash == none
    first = h.hash_block(None, [1, 2, 3, 4])
    assert first == _ref(0, none, [1, 2, 3, 4])
    second = h.hash_block(first, [5, 6, 7, 8])
    assert second == _ref(0, first, [5, 6, 7, 8])
    assert 0 <= second < 2**64


def test_parent_matters() -> None:
    h = BlockHasher(0)
    a = h.hash_block(None, [1, 2])
    b = h.hash_block(a, [3, 4])
    c = h.hash_block(h.hash_block(None, [9, 9]), [3, 4])
    assert b != c


def test_deterministic_per_seed() -> None:
    assert BlockHasher(7).hash_block(None, [1, 2]) == BlockHasher(7).hash_block(None, [1, 2])
    assert BlockHasher(7).hash_block(None, [1, 2]) != BlockHasher(8).hash_block(None, [1, 2])


def test_extra_keys_change_hash_and_do_not_collide() -> None:
    h = BlockHasher(0)
    plain = h.hash_block(None, [1, 2])
    lora = h.hash_block(None, [1, 2], extra_keys_bytes("my-lora"))
    assert plain != lora
    assert extra_keys_bytes(None) == b""
    assert extra_keys_bytes("ab", "c") != extra_keys_bytes("a", "bc")
    assert extra_keys_bytes("a", None) != extra_keys_bytes(None, "a")


def test_extend_is_incremental_and_matches_one_shot() -> None:
    h = BlockHasher(3)
    tokens = list(range(10))
    grown: list[BlockHash] = []
    h.extend(grown, tokens[:3], 4)
    assert grown == []  # no full block yet
    h.extend(grown, tokens[:9], 4)
    assert len(grown) == 2
    h.extend(grown, [*tokens, 10, 11], 4)
    one_shot: list[BlockHash] = []
    h.extend(one_shot, [*tokens, 10, 11], 4)
    assert grown == one_shot and len(grown) == 3
    assert grown[1] == h.hash_block(grown[0], [4, 5, 6, 7])


def test_first_extra_applies_to_block_zero_only() -> None:
    h = BlockHasher(0)
    salted: list[BlockHash] = []
    h.extend(salted, list(range(8)), 4, first_extra=extra_keys_bytes("salt"))
    plain: list[BlockHash] = []
    h.extend(plain, list(range(8)), 4)
    assert salted[0] == h.hash_block(None, [0, 1, 2, 3], extra_keys_bytes("salt"))
    assert salted[1] == h.hash_block(salted[0], [4, 5, 6, 7])
    assert salted[0] != plain[0]


# -- vLLM's algorithms, against values vLLM 0.33.0's own functions computed --------------------

_REFERENCE = Path(__file__).parent / "data" / "vllm_0.33.0_block_hashes.json"
_CASES = json.loads(_REFERENCE.read_text())["cases"]


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['algo']}-seed{case['pythonhashseed']}-{case['prompt']}"


@pytest.mark.parametrize("case", _CASES, ids=_case_id)
def test_vllm_algorithms_give_vllms_hashes_bit_for_bit(case: dict[str, Any]) -> None:
    hasher = VllmBlockHasher(HashAlgo(case["algo"]), case["pythonhashseed"])
    assert hasher.none_hash.hex() == case["none_hash_hex"]
    chain = hasher.chain(case["lora_name"], case["cache_salt"], case["lora_path"])
    hashes: list[BlockHash] = []
    chain.extend(hashes, case["token_ids"], 16)
    assert hashes == case["event_hashes_int"]
    # The published value is the low 64 bits of vLLM's full digest.
    assert [int(h, 16) & (2**64 - 1) for h in case["block_hashes_hex"]] == hashes


def test_vllm_chain_block_by_block_equals_all_at_once_and_survives_truncation() -> None:
    hasher = VllmBlockHasher(HashAlgo.SHA256_CBOR, "7")
    tokens = list(range(100, 164))
    whole: list[BlockHash] = []
    hasher.chain("a", "s").extend(whole, tokens, 16)
    grown: list[BlockHash] = []
    chain = hasher.chain("a", "s")
    for n in range(0, 65, 5):  # tokens arrive a few at a time, as a decode appends them
        chain.extend(grown, tokens[:n], 16)
    chain.extend(grown, tokens, 16)
    assert grown == whole and len(whole) == 4
    del grown[2:]  # a decode run rolled back: the chain re-hashes from block 2
    other = [*tokens[:32], *range(900, 932)]
    chain.extend(grown, other, 16)
    fresh: list[BlockHash] = []
    hasher.chain("a", "s").extend(fresh, other, 16)
    assert grown == fresh and grown[2] != whole[2]


def test_unset_seed_is_fixed_for_sha256_and_random_for_xxhash() -> None:
    fixed = [VllmBlockHasher(HashAlgo.SHA256, None).none_hash for _ in range(2)]
    assert fixed[0] == fixed[1]
    assert fixed[0] == VllmBlockHasher(HashAlgo.SHA256, "vllm-none-hash").none_hash
    drawn = [VllmBlockHasher(HashAlgo.XXHASH, None).none_hash for _ in range(2)]
    assert drawn[0] != drawn[1]


def test_make_hasher_picks_the_algorithm() -> None:
    assert isinstance(make_hasher("fast", 3), BlockHasher)
    vllm = make_hasher("sha256", 3, "0")
    assert isinstance(vllm, VllmBlockHasher) and vllm.algo is HashAlgo.SHA256
    with pytest.raises(ValueError):
        make_hasher("md5", 0)


def test_extend_is_the_chain_of_hash_block() -> None:
    """`extend` (hash_block inlined) gives each block's `hash_block` of its parent, tokens and
    extra keys, the first block's own extra keys included, from any starting point."""
    rng = random.Random(5)
    for _ in range(40):
        h = BlockHasher(rng.getrandbits(32))
        bs = rng.choice([1, 2, 16])
        tokens = [rng.randrange(2**32) for _ in range(rng.randint(0, 5 * bs))]
        extra = rng.choice([b"", extra_keys_bytes("lora")])
        first = rng.choice([b"", extra_keys_bytes("lora", "salt")])
        want: list[BlockHash] = []
        parent = None
        for i in range(len(tokens) // bs):
            parent = h.hash_block(
                parent, tokens[i * bs : (i + 1) * bs], first if i == 0 and first else extra
            )
            want.append(parent)
        got: list[BlockHash] = []
        h.extend(got, tokens[: rng.randint(0, len(tokens))], bs, extra, first)
        h.extend(got, tokens, bs, extra, first)
        assert got == want
        # Replay's vectors: ids in an array('I'), hashes into an array('Q').
        ids = array("I", tokens)
        vector = hash_array()
        h.extend(vector, ids[: rng.randint(0, len(ids))], bs, extra, first)
        h.extend(vector, ids, bs, extra, first)
        assert isinstance(vector, array) and list(vector) == want


# -- the compiled chain (mocker/kv/_chash.c) ----------------------------------------------------

needs_chash = pytest.mark.skipif(_chash is None, reason="mocker.kv._chash was not built")


@needs_chash
def test_the_compiled_xxh3_is_the_xxhash_packages_on_its_lengths() -> None:
    assert _chash is not None
    rng = random.Random(7)
    for length in range(17, 241):
        for seed in (0, 1, rng.getrandbits(64)):
            data = rng.randbytes(length)
            assert _chash.xxh3_64(data, seed) == xxhash.xxh3_64_intdigest(data, seed=seed)
    with pytest.raises(ValueError):
        _chash.xxh3_64(b"x" * 16, 0)


@needs_chash
@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_chain_gives_the_python_hashes(seed: int) -> None:
    """Block sizes whose inputs take XXH3's medium path (17-240 bytes) and others (the
    Python code then hashes them), extra keys of any length, ids as lists or array('I'),
    hashes into lists or arrays: the same hashes, whichever hashes them."""
    rng = random.Random(seed)
    for _ in range(40):
        hasher_seed = rng.getrandbits(64)
        c, py = BlockHasher(hasher_seed, compiled=True), BlockHasher(hasher_seed, compiled=False)
        bs = rng.choice([1, 2, 4, 16, 32, 57, 58, 64])
        lora = rng.choice([None, "a", "x" * rng.randint(1, 200)])
        salt = rng.choice([None, "salt"])
        tokens = [rng.randrange(2**32) for _ in range(rng.randint(0, 6 * bs))]
        ids = array("I", tokens) if rng.random() < 0.5 else tokens
        got: BlockHashes = hash_array() if rng.random() < 0.5 else []
        want: list[BlockHash] = []
        chain_c, chain_py = c.chain(lora, salt), py.chain(lora, salt)
        cut = rng.randint(0, len(tokens))
        chain_c.extend(got, ids[:cut], bs)
        chain_c.extend(got, ids, bs)
        chain_py.extend(want, tokens[:cut], bs)
        chain_py.extend(want, tokens, bs)
        assert list(got) == want


@needs_chash
def test_a_token_id_of_more_than_32_bits_is_refused_in_c_as_in_python() -> None:
    for compiled in (True, False):
        with pytest.raises(OverflowError):
            BlockHasher(1, compiled=compiled).chain(None, None).extend([], [2**32] * 16, 16)


def test_the_env_turns_the_compiled_chain_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "0")
    assert BlockHasher(1)._c is None
    monkeypatch.setenv(ENV, "auto")
    assert (BlockHasher(1)._c is None) is (_chash is None)
