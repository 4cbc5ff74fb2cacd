"""Chained block hashes: exact chaining, seeding, extra keys, incremental extension."""

import hashlib
from array import array

from mocker.kv.hashing import BlockHasher, extra_keys_bytes


def _ref(seed: int, parent: int, tokens: list[int], extra: bytes = b"") -> int:
    key = seed.to_bytes(8, "big")
    body = array("I", tokens).tobytes()
    payload = parent.to_bytes(8, "big") + len(body).to_bytes(4, "big") + body + extra
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8, key=key).digest(), "big")


def test_exact_values_and_chaining() -> None:
    h = BlockHasher(seed=0)
    none = int.from_bytes(
        hashlib.blake2b(b"mocker:none-hash", digest_size=8, key=bytes(8)).digest(), "big"
    )
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
    grown: list = []
    h.extend(grown, tokens[:3], 4)
    assert grown == []  # no full block yet
    h.extend(grown, tokens[:9], 4)
    assert len(grown) == 2
    h.extend(grown, [*tokens, 10, 11], 4)
    one_shot: list = []
    h.extend(one_shot, [*tokens, 10, 11], 4)
    assert grown == one_shot and len(grown) == 3
    assert grown[1] == h.hash_block(grown[0], [4, 5, 6, 7])


def test_first_extra_applies_to_block_zero_only() -> None:
    h = BlockHasher(0)
    salted: list = []
    h.extend(salted, list(range(8)), 4, first_extra=extra_keys_bytes("salt"))
    plain: list = []
    h.extend(plain, list(range(8)), 4)
    assert salted[0] == h.hash_block(None, [0, 1, 2, 3], extra_keys_bytes("salt"))
    assert salted[1] == h.hash_block(salted[0], [4, 5, 6, 7])
    assert salted[0] != plain[0]
