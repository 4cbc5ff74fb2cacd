"""KV events naming blocks by their full digests (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from mocker.config import ConfigError
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from mocker.kv.hashing import BlockHash, full_hash
from mocker.kvevents.config import int_block_hashes
from mocker.kvevents.digests import DigestBook
from mocker.kvevents.wire import BatchEncoder
from tests.support.engines import make_core, req
from tests.support.hashes import hash_tuple
from tests.support.kv_consumer import decoder

_CASES = Path(__file__).parent.parent / "kv" / "data" / "vllm_0.33.0_block_hashes.json"
D1, D2 = bytes(range(32)), bytes(range(32, 64))


def _key(digest: bytes) -> int:
    return int.from_bytes(digest[-8:], "big")  # vLLM's maybe_convert_block_hash


def _stored(*hashes: BlockHash, medium: str = "GPU", group: int | None = None) -> BlockStored:
    return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=(),
                       block_size=16, medium=medium, group_idx=group)  # fmt: skip


def _removed(*keys: int, medium: str = "GPU", group: int | None = None) -> BlockRemoved:
    return BlockRemoved(block_hashes=hash_tuple(*keys), medium=medium, group_idx=group)


def _hashes(events: list[KVEvent]) -> list[tuple[Any, ...]]:
    return [e.block_hashes for e in events if not isinstance(e, AllBlocksCleared)]


def test_the_env_is_read_as_vllm_reads_it() -> None:
    assert int_block_hashes({}) is True
    assert int_block_hashes({"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}) is False
    assert int_block_hashes({"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}) is True
    with pytest.raises(ConfigError, match="VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES='yes'"):
        int_block_hashes({"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "yes"})


def test_a_full_hash_is_its_digests_low_64_bits() -> None:
    h = full_hash(D1)
    assert h == _key(D1) and hash(h) == hash(_key(D1))
    assert {_key(D1): "x"}[h] == "x"


def test_a_removal_names_the_digest_its_store_announced_and_then_forgets_it() -> None:
    book = DigestBook()
    stored = book.convert([_stored(full_hash(D1), full_hash(D2))])
    assert _hashes(stored) == [(D1, D2)]
    # The engine's removal names the 64-bit key only.
    assert _hashes(book.convert([_removed(_key(D1))])) == [(D1,)]
    assert len(book) == 1  # D2 is still held
    assert _hashes(book.convert([_removed(_key(D2))])) == [(D2,)]
    assert len(book) == 0


def test_a_digest_is_kept_while_any_medium_or_group_holds_it() -> None:
    book = DigestBook()
    book.convert([_stored(full_hash(D1), group=0), _stored(full_hash(D1), group=1)])
    book.convert([_stored(BlockHash(_key(D1)), medium="CPU")])  # a tier's key: a plain int
    book.convert([_removed(_key(D1), group=0), _removed(_key(D1), group=1)])
    assert _hashes(book.convert([_removed(_key(D1), medium="CPU")])) == [(D1,)]
    assert len(book) == 0
    # Re-announcing a held block (a prefix hit's report) needs one removal, as it is one block.
    book.convert([_stored(full_hash(D2)), _stored(full_hash(D2))])
    book.convert([_removed(_key(D2))])
    assert len(book) == 0


def test_a_device_reset_forgets_only_what_the_device_alone_held() -> None:
    book = DigestBook()
    book.convert([_stored(full_hash(D1)), _stored(full_hash(D2)),
                  _stored(BlockHash(_key(D2)), medium="CPU")])  # fmt: skip
    book.convert([AllBlocksCleared()])
    assert len(book) == 1
    assert _hashes(book.convert([_removed(_key(D2), medium="CPU")])) == [(D2,)]
    assert len(book) == 0


def test_an_unannounced_key_is_its_own_eight_bytes() -> None:
    # mocker's fast hash is 64 bits whole; a key another engine stored in a shared tier.
    book = DigestBook()
    assert _hashes(book.convert([_removed(5, medium="CPU")])) == [((5).to_bytes(8, "big"),)]
    assert _hashes(book.convert([_stored(BlockHash(7))])) == [((7).to_bytes(8, "big"),)]


def test_the_engine_publishes_vllms_own_digests(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's sha256_cbor digests of a prompt (computed by vLLM's own code), on the wire as
    # bytes in stored and removed events alike; the book empties when the blocks go.
    case = next(
        c for c in json.loads(_CASES.read_text())["cases"]
        if (c["algo"], c["pythonhashseed"], c["prompt"]) == ("sha256_cbor", "0", "A")
    )  # fmt: skip
    digests = [bytes.fromhex(h) for h in case["block_hashes_hex"]]
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    core = make_core(block_size=16, num_gpu_blocks=8, prefix_caching_hash_algo="sha256_cbor",
                     enable_kv_cache_events=True, int_block_hashes=False)  # fmt: skip
    encoder = BatchEncoder(full_hashes=True)
    core.add_request(req("a", case["token_ids"], max_tokens=1))
    # A second prompt of other tokens fills the small cache: the first one's blocks go.
    core.add_request(req("b", [9] * (16 * 7), max_tokens=1, arrival=1.0))
    batches, now = [], 0.0
    while core.has_unfinished_requests():
        result = core.step(now)
        batches.append(decoder().decode(encoder.encode(now, result.kv_events)))
        now = result.end
    events = [e for b in batches for e in b.events]
    stored = [h for e in events if type(e).__name__ == "BlockStored" for h in e.block_hashes]
    removed = [h for e in events if type(e).__name__ == "BlockRemoved" for h in e.block_hashes]
    assert stored[: len(digests)] == digests
    # Each removal names a digest a store announced, some of them the first prompt's.
    assert removed and set(removed) <= set(stored) and set(removed) & set(digests)
    assert all(isinstance(h, bytes) and len(h) == 32 for h in stored + removed)
    parents = [e.parent_block_hash for e in events if type(e).__name__ == "BlockStored"]
    assert all(p is None or isinstance(p, bytes) for p in parents)


def test_a_tier_store_after_the_devices_removal_in_one_batch_keeps_the_digest() -> None:
    # A step's device events come first: its eviction of a block whose CPU copy landed in
    # the same step precedes the tier's store, which names the plain 64-bit key.
    book = DigestBook()
    book.convert([_stored(full_hash(D1))])
    out = book.convert([_removed(_key(D1)), _stored(BlockHash(_key(D1)), medium="CPU")])
    assert _hashes(out) == [(D1,), (D1,)]
    assert _hashes(book.convert([_removed(_key(D1), medium="CPU")])) == [(D1,)]
    assert len(book) == 0


@pytest.mark.parametrize("policy", ["write-through", "evict"])
def test_every_hash_of_an_engine_with_a_cpu_tier_is_a_digest(
    monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    # Prompts sharing prefixes through a 16-block device and an 8-block CPU tier: stores,
    # evictions and loads in both media, every hash on the wire vLLM's full digest.
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    core = make_core(block_size=16, num_gpu_blocks=16, prefix_caching_hash_algo="sha256_cbor",
                     enable_kv_cache_events=True, int_block_hashes=False, num_cpu_blocks=8,
                     offload_policy=policy)  # fmt: skip
    encoder = BatchEncoder(full_hashes=True)
    rng = random.Random(2)
    prefixes = [[rng.randrange(1000) for _ in range(32)] for _ in range(3)]
    for i in range(60):
        tail = [rng.randrange(1000) for _ in range(rng.randrange(1, 40))]
        core.add_request(req(f"r{i}", rng.choice(prefixes) + tail,
                             max_tokens=rng.randrange(1, 20), arrival=i * 0.01))  # fmt: skip
    now, media, sizes = 0.0, set(), set()
    while core.has_unfinished_requests():
        result = core.step(now)
        for e in decoder().decode(encoder.encode(now, result.kv_events)).events:
            if type(e).__name__ != "AllBlocksCleared":
                media.add(e.medium)
                sizes |= {len(h) for h in e.block_hashes}
                parent = getattr(e, "parent_block_hash", None)
                sizes |= {len(parent)} if parent is not None else set()
        now = max(result.end, now + 0.001)
    assert media == {"GPU", "CPU"} and sizes == {32}
