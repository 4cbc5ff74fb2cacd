"""Chained block hashes: mocker's fast seeded xxh3-64 chain, or vLLM's own algorithms bit for bit.

A request's blocks are hashed by a `HashChain` the engine's hasher makes for it (the chain
holds the request's extra keys: LoRA, cache salt). What the engine keys blocks by, and what
KV events publish, is a `BlockHash`: a uint64. With vLLM's algorithms that is the low 64 bits
of the full digest, as vLLM publishes it (`maybe_convert_block_hash`); the chain itself runs
on the full digests, so a router that rehashes token ids gets the published values exactly.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
from array import array
from collections.abc import Callable, MutableSequence, Sequence
from enum import StrEnum
from typing import Any, NewType, Protocol, TypeAlias, cast

import cbor2
import xxhash

from mocker.compiled import chash, use_compiled

__all__ = [
    "BlockHash",
    "BlockHasher",
    "BlockHashes",
    "FullHash",
    "HashAlgo",
    "HashChain",
    "Hasher",
    "VllmBlockHasher",
    "extra_keys_bytes",
    "hash_array",
    "make_hasher",
]

logger = logging.getLogger("mocker.engine")

# A block's key in the engine and on the wire (uint64).
BlockHash = NewType("BlockHash", int)

# A request's block hashes, in block order: a list, or an array('Q') (`hash_array`: what
# replay builds, a vector the compiled pool reads in place and frees without an int per hash).
BlockHashes: TypeAlias = MutableSequence[BlockHash]


class FullHash(int):
    """A BlockHash (its digest's low 64 bits) that carries the full digest, for KV events
    that publish digests (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)."""

    digest: bytes


def full_hash(digest: bytes) -> BlockHash:
    """The BlockHash of `digest`, carrying it."""
    h = FullHash.from_bytes(digest[-8:], "big")
    h.digest = digest
    return BlockHash(h)


_BIG_ENDIAN = sys.byteorder == "big"
_LOW_64 = (1 << 64) - 1


def hash_array(words: Any = b"") -> BlockHashes:
    """Block hashes as an array('Q') made from a buffer of native uint64 words (bytes, a
    numpy uint64 vector): a copy of the buffer, not an int object per hash."""
    out = array("Q")
    out.frombytes(memoryview(words).cast("B"))  # (numpy exports no plain-bytes view itself)
    return cast("BlockHashes", out)


_digest64 = xxhash.xxh3_64_intdigest
# A full block's body length as hashed (4 bytes per id, big-endian), by block size.
_BODY_SIZES: dict[int, bytes] = {}


def _body_size(block_size: int) -> bytes:
    size = _BODY_SIZES[block_size] = (4 * block_size).to_bytes(4, "big")
    return size


class HashAlgo(StrEnum):
    """--prefix-caching-hash-algo: mocker's fast default, or one of vLLM's four."""

    FAST = "fast"  # seeded xxh3-64 over packed token ids, seeded by --seed (mocker)
    SHA256 = "sha256"  # vLLM's default: sha256 of the pickled (parent, tokens, extra keys)
    SHA256_CBOR = "sha256_cbor"  # sha256 of canonical CBOR: reproducible outside Python
    XXHASH = "xxhash"  # xxh3-128 of the pickle (not cryptographic)
    XXHASH_CBOR = "xxhash_cbor"  # xxh3-128 of canonical CBOR


class HashChain(Protocol):
    """One request's hashing: appends the hashes of its newly full blocks."""

    def extend(self, hashes: BlockHashes, token_ids: Sequence[int], block_size: int) -> None:
        """Append hashes for the full blocks of `token_ids` not yet in `hashes`."""
        ...


class Hasher(Protocol):
    """Makes each request's chain."""

    algo: HashAlgo

    def chain(
        self, lora_name: str | None, cache_salt: str | None, lora_path: str | None = None
    ) -> HashChain: ...


def extra_keys_bytes(*keys: str | None) -> bytes:
    """Encode extra keys (LoRA name, cache salt, …) so that distinct tuples never collide."""
    if not any(k is not None for k in keys):
        return b""
    out = bytearray()
    for key in keys:
        if key is None:
            out += b"\x00"
        else:
            raw = key.encode()
            out += b"\x01" + len(raw).to_bytes(4, "big") + raw
    return bytes(out)


# -- mocker's fast chain -----------------------------------------------------------------------


class BlockHasher:
    """Hashes full blocks of token ids into a chain; the seed plays vLLM's PYTHONHASHSEED role."""

    __slots__ = ("_c", "_seed", "none_hash")

    algo = HashAlgo.FAST

    def __init__(self, seed: int, *, compiled: bool | None = None) -> None:
        """`compiled`: hash in C (mocker/kv/_chash.c) or in Python (the reference), the same
        values; None: as MOCKER_COMPILED says (mocker.compiled)."""
        self._c = chash if use_compiled("mocker.kv._chash", compiled) else None
        self._seed = seed
        # The parent of a request's first block, like vLLM's NONE_HASH.
        self.none_hash = BlockHash(self._digest(b"mocker:none-hash"))

    def _digest(self, payload: bytes) -> int:
        # Not cryptographic (nor is a router's view of it): fast, seeded, 64 bits.
        return xxhash.xxh3_64_intdigest(payload, seed=self._seed)

    def hash_block(
        self, parent: BlockHash | None, token_ids: Sequence[int], extra: bytes = b""
    ) -> BlockHash:
        """Hash of one full block given its parent's hash (None for the first block)."""
        head = (self.none_hash if parent is None else parent).to_bytes(8, "big")
        packed = array("I", token_ids)
        if _BIG_ENDIAN:
            packed.byteswap()  # the same hashes on every platform
        body = packed.tobytes()
        return BlockHash(self._digest(head + len(body).to_bytes(4, "big") + body + extra))

    def extend(
        self,
        hashes: BlockHashes,
        token_ids: Sequence[int],
        block_size: int,
        extra: bytes = b"",
        first_extra: bytes = b"",
    ) -> None:
        """Append hashes for the full blocks of `token_ids` not yet in `hashes`.

        Block 0 uses `first_extra` instead of `extra` when given (vLLM adds the cache salt
        to the first block's extra keys; encode both keys together there, so a salt can
        never be mistaken for a LoRA name).
        """
        _FastChain(self, extra, first_extra).extend(hashes, token_ids, block_size)

    def chain(
        self, lora_name: str | None, cache_salt: str | None, lora_path: str | None = None
    ) -> _FastChain:
        extra = extra_keys_bytes(lora_name) if lora_name is not None else b""
        # Block 0 carries (lora, salt) as one tuple: distinct key spaces for the two.
        first = extra_keys_bytes(lora_name, cache_salt) if cache_salt is not None else b""
        return _FastChain(self, extra, first)


class _FastChain:
    """One request's chain of `BlockHasher` hashes (its extra keys held)."""

    __slots__ = ("_c", "_extra", "_first", "_none", "_seed")

    def __init__(self, hasher: BlockHasher, extra: bytes, first: bytes) -> None:
        self._extra, self._first = extra, first
        self._seed, self._none, self._c = hasher._seed, hasher.none_hash, hasher._c

    def extend(self, hashes: BlockHashes, token_ids: Sequence[int], block_size: int) -> None:
        """`BlockHasher.extend` with this chain's extra keys."""
        start = len(hashes)
        end = len(token_ids) // block_size
        if start >= end:
            return
        parent: int = hashes[-1] if hashes else self._none
        c = self._c
        if c is not None:
            words = c.chain(parent, token_ids, start, end, block_size, self._seed,
                            self._extra, self._first)  # fmt: skip
            if words is not None:  # (else an input XXH3's medium path does not take)
                if type(hashes) is array:
                    hashes.frombytes(words)
                else:
                    hashes.extend(memoryview(words).cast("Q"))  # type: ignore[arg-type]
                return
        # `hash_block` inlined (once per full block of every prompt and output): the length
        # of a full block's body is the same for each. tests/kv/test_hashing.py checks the
        # two agree. Most calls hash one generated block, so what runs once per call is kept
        # to plain reads (a call and a cast there would outweigh the block's own hashing).
        extra, first = self._extra, self._first
        seed = self._seed
        # (The digests are BlockHash values: appended as they are, without a NewType call.)
        append: Callable[[int], None] = hashes.append  # type: ignore[assignment]
        size = _BODY_SIZES.get(block_size) or _body_size(block_size)
        # (An array('I') of ids, as replay's: a slice of it is the packed block already.)
        packed_ids = type(token_ids) is array and token_ids.typecode == "I"
        for i in range(start, end):
            lo = i * block_size
            chunk = token_ids[lo : lo + block_size]
            packed: array[int] = chunk if packed_ids else array("I", chunk)  # type: ignore[assignment]
            if _BIG_ENDIAN:
                packed.byteswap()
            tail = packed.tobytes() + (first if i == 0 and first else extra)
            parent = _digest64(parent.to_bytes(8, "big") + size + tail, seed=seed)
            append(parent)


# -- vLLM's algorithms -------------------------------------------------------------------------


def _pickled(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _cbor(value: Any) -> bytes:
    return cbor2.dumps(value, canonical=True)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# (serializer, digest) per algorithm: vllm/utils/hashing.py (vLLM 0.33.0).
_VLLM_HASHES: dict[HashAlgo, tuple[Callable[[Any], bytes], Callable[[bytes], bytes]]] = {
    HashAlgo.SHA256: (_pickled, _sha256),
    HashAlgo.SHA256_CBOR: (_cbor, _sha256),
    HashAlgo.XXHASH: (_pickled, xxhash.xxh3_128_digest),
    HashAlgo.XXHASH_CBOR: (_cbor, xxhash.xxh3_128_digest),
}
# vLLM's seed when PYTHONHASHSEED is unset (the xxhash ones then draw a random seed).
_DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


class VllmBlockHasher:
    """vLLM's block hashing (vllm/v1/core/kv_cache_utils.py): block i's hash is
    `hash_fn((parent digest, tuple(token ids), extra keys or None))`, block 0's parent is
    NONE_HASH = `hash_fn(seed)`, the seed being $PYTHONHASHSEED as written (unset:
    "vllm-none-hash" for the sha256 ones, a random one per process for the xxhash ones).
    Extra keys: `("lora", name, path)` on every block of a LoRA request, `("cache_salt",
    salt)` on block 0. `keep_digests`: each hash is a `FullHash` carrying its digest."""

    __slots__ = ("_digest", "_serialize", "algo", "keep_digests", "none_hash")

    def __init__(
        self, algo: HashAlgo, pythonhashseed: str | None, keep_digests: bool = False
    ) -> None:
        if algo not in _VLLM_HASHES:
            raise ValueError(f"{algo!r} is not one of vLLM's hash algorithms")
        self.algo = algo
        self.keep_digests = keep_digests
        self._serialize, self._digest = _VLLM_HASHES[algo]
        seed = pythonhashseed
        if seed is None:
            if algo in (HashAlgo.XXHASH, HashAlgo.XXHASH_CBOR):
                seed = os.urandom(32).hex()
                logger.warning(
                    "PYTHONHASHSEED is not set: the %s block hashes use a random seed, as "
                    "vLLM's do; set PYTHONHASHSEED for hashes a router can recompute",
                    algo.value,
                )
            else:
                seed = _DEFAULT_NONE_HASH_SEED
        self.none_hash: bytes = self.hash(seed)

    def hash(self, value: Any) -> bytes:
        return self._digest(self._serialize(value))

    def chain(
        self, lora_name: str | None, cache_salt: str | None, lora_path: str | None = None
    ) -> _VllmChain:
        extra: tuple[Any, ...] = ()
        if lora_name is not None:
            # A server parses the name and the path separately: two string objects, which
            # pickle writes out twice (one object would be written once, then referenced).
            path = lora_name.encode().decode() if lora_path is None else lora_path
            extra = (("lora", lora_name, path),)
        first = (*extra, ("cache_salt", cache_salt)) if cache_salt else extra
        return _VllmChain(self, first or None, extra or None)


class _VllmChain:
    """Keeps the full digests (the chain runs on them; `hashes` gets their low 64 bits),
    index for index with `hashes`: entries past a truncated `hashes` are overwritten."""

    __slots__ = ("_digests", "_extra", "_first", "_hasher")

    def __init__(
        self, hasher: VllmBlockHasher, first: tuple[Any, ...] | None, extra: tuple[Any, ...] | None
    ) -> None:
        self._hasher, self._first, self._extra = hasher, first, extra
        self._digests: list[bytes] = []

    def extend(self, hashes: BlockHashes, token_ids: Sequence[int], block_size: int) -> None:
        start = len(hashes)
        end = len(token_ids) // block_size
        digests = self._digests
        hasher = self._hasher
        if len(digests) < start:  # hashes given from outside (a trace's ids): their 8 bytes
            digests.extend(h.to_bytes(8, "big") for h in hashes[len(digests) : start])
        parent = digests[start - 1] if start else hasher.none_hash
        serialize, digest = hasher._serialize, hasher._digest
        keep = hasher.keep_digests
        for i in range(start, end):
            lo = i * block_size
            extra = self._first if i == 0 else self._extra
            parent = digest(serialize((parent, tuple(token_ids[lo : lo + block_size]), extra)))
            if i < len(digests):
                digests[i] = parent
            else:
                digests.append(parent)
            hashes.append(
                full_hash(parent) if keep else BlockHash(int.from_bytes(parent[-8:], "big"))
            )


def make_hasher(
    algo: HashAlgo | str, seed: int, pythonhashseed: str | None = None, keep_digests: bool = False
) -> Hasher:
    """The engine's hasher: `seed` keys the fast one; vLLM's take $PYTHONHASHSEED (pass it:
    the core reads no environment) and, with `keep_digests`, make `FullHash`es (the fast
    hash is 64 bits whole: its digest is its 8 bytes)."""
    algo = HashAlgo(algo)
    if algo is HashAlgo.FAST:
        return BlockHasher(seed)
    return VllmBlockHasher(algo, pythonhashseed, keep_digests)
