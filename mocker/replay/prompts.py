"""Prompts for trace requests: engine block hashes derived from hash ids, no token lists."""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import xxhash

from mocker.compiled import cprompts as _cprompts
from mocker.compiled import use_compiled
from mocker.kv.hashing import BlockHash, BlockHashes, hash_array
from mocker.mixing import GOLDEN, MASK64, splitmix64, splitmix64_array
from mocker.replay.trace import TraceRequest
from mocker.request import TokenIds

__all__ = ["FILLER_TOKEN", "PromptBuilder"]

# Prompt token ids inside blocks whose hashes are given (see PromptBuilder).
FILLER_TOKEN = 2


class PromptBuilder:
    """Token ids and engine block hashes for trace requests (Mooncake's trace format: hash id
    h stands for `trace_block_size` tokens of content h; equal ids at equal prefixes are
    equal KV).

    A block's identity is what precedes it and what it holds. Here that is fully given by the
    request's hash ids up to and including the one the block falls in, plus its position
    inside that trace block. So each engine block's hash is a 64-bit mix of (key of the id
    prefix, position), where the prefix key chains the ids: two requests share an engine
    block exactly when a content hash of synthesized tokens would say they do, without
    making or hashing the tokens. Every full engine block of the prompt gets its hash here
    (trace blocks are multiples of engine blocks, so the last, partial trace block's full
    engine blocks too); the engine hashes only blocks that output tokens fill.

    The engine reads prompt token ids only to hash blocks it has no hash for and to publish
    KV events, which replay does not. So the ids inside hashed blocks are a filler token,
    and only the trailing partial engine block carries ids synthesized from (seed, hash
    id, position): the engine hashes it, with the output, once it fills.
    """

    __slots__ = (
        "_c",
        "_low",
        "_offsets",
        "_per",
        "_seed",
        "block_size",
        "trace_block_size",
        "vocab",
    )

    def __init__(
        self,
        block_size: int,
        trace_block_size: int,
        vocab: int,
        seed: int,
        *,
        compiled: bool | None = None,
    ) -> None:
        """`compiled`: mix in C (mocker/replay/_cprompts.c) or in Python (the reference), the
        same values; None: C when it was built, unless MOCKER_COMPILED=0."""
        self._c = _cprompts if use_compiled("mocker.replay._cprompts", compiled) else None
        self.block_size = block_size
        self.trace_block_size = trace_block_size
        self.vocab = vocab
        # Token ids low..vocab-1 (0 and 1 are often special), unless the vocabulary is tiny.
        self._low = 2 if vocab > 2 else 0
        self._seed = splitmix64(seed & MASK64)
        # Engine blocks per trace block; 0 when they do not divide it (a Mamba hybrid's
        # block: see `_straddling`).
        self._per = 0 if trace_block_size % block_size else trace_block_size // block_size
        # Each engine block's offset inside its trace block, mixed in: the same every prompt.
        self._offsets = np.arange(self._per, dtype=np.uint64) * np.uint64(GOLDEN)

    def prompt(self, request: TraceRequest) -> tuple[TokenIds, BlockHashes]:
        """(prompt token ids, hashes of its full engine blocks)."""
        n, bs, tbs = request.input_length, self.block_size, self.trace_block_size
        num_full = n // bs
        ids = request.hash_ids[: -(-n // tbs)]
        if not self._per:
            return self._straddling(ids, n)
        c = self._c
        # An array('Q'), not a list: no int object per block hash (9M in a Mooncake replay),
        # and the compiled pool reads it in place.
        if c is not None:
            hashes = hash_array(c.block_hashes(ids, self._seed, self._per, num_full))
        else:
            hashes = self._block_hashes(ids, num_full)
        tokens = _fillers(num_full * bs)
        tail = n - num_full * bs
        if tail:
            # The last partial engine block: its ids are hashed by the engine once it fills.
            last = ids[-1] & MASK64
            lo = num_full * bs - (len(ids) - 1) * tbs  # its first position in that trace block
            if c is not None:
                base = self._seed ^ splitmix64(last)
                low = self._low
                tokens.frombytes(c.tail_tokens(base, lo, tail, low, self.vocab - low))
            else:
                tokens.extend(self._tokens(last, lo, tail))
        return tokens, hashes

    def _block_hashes(self, ids: Sequence[int], num_full: int) -> BlockHashes:
        """The first `num_full` engine blocks' hashes (the reference of `_cprompts`'s)."""
        keys = []
        key = self._seed
        for h in ids[: -(-num_full // self._per)]:
            # key = splitmix64(key ^ h), inlined: a call per trace block costs more than it.
            x = ((key ^ (h & MASK64)) + GOLDEN) & MASK64
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
            key = x ^ (x >> 31)
            keys.append(key)
        if not num_full:
            return hash_array()
        grid = np.asarray(keys, dtype=np.uint64)[:, None] ^ self._offsets[None, :]
        return hash_array(splitmix64_array(grid.ravel()[:num_full]))

    def _straddling(self, ids: Sequence[int], n: int) -> tuple[TokenIds, BlockHashes]:
        """Engine blocks that do not divide trace blocks: block j holds tokens up to position
        (j + 1)·bs − 1, in trace block t = ((j + 1)·bs − 1) // tbs, so its content is given by
        the ids up to t and its end: its hash mixes the key of that id prefix with j."""
        bs, tbs = self.block_size, self.trace_block_size
        num_full = n // bs
        keys: list[int] = []
        key = self._seed
        for h in ids:
            key = splitmix64(key ^ (h & MASK64))
            keys.append(key)
        hashes: BlockHashes = [
            BlockHash(splitmix64(keys[((j + 1) * bs - 1) // tbs] ^ (j * GOLDEN & MASK64)))
            for j in range(num_full)
        ]
        tokens = _fillers(num_full * bs)
        tokens.extend(self._token(ids[p // tbs] & MASK64, p % tbs) for p in range(num_full * bs, n))
        return tokens, hashes

    def _tokens(self, hash_id: int, start: int, count: int) -> list[int]:
        """`_token(hash_id, p)` for p in start .. start+count-1: the id's own mix made once,
        the per-position one inlined (a prompt's tail was 28% of building its prompt)."""
        low = self._low
        span = self.vocab - low
        base = self._seed ^ splitmix64(hash_id)
        out = []
        for position in range(start, start + count):
            x = ((base ^ (position * GOLDEN & MASK64)) + GOLDEN) & MASK64
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
            out.append(low + (x ^ (x >> 31)) % span)
        return out

    def _token(self, hash_id: int, position: int) -> int:
        draw = splitmix64(self._seed ^ splitmix64(hash_id) ^ (position * GOLDEN & MASK64))
        return self._low + draw % (self.vocab - self._low)


def _fillers(count: int) -> array[int]:
    """`count` filler ids as an array('I'): a prompt of 12k ids is one 48 kB buffer, made and
    freed at once, not a list whose every slot is referenced and released (4% of a replay)."""
    return array("I", (FILLER_TOKEN,)) * count


def adapter_hashes(hashes: Sequence[BlockHash], adapter: str) -> BlockHashes:
    """A LoRA request's block hashes: each mixed with the adapter's name, so equal trace ids
    under different adapters (or none) are different blocks, as the engine's hashes are."""
    key = xxhash.xxh3_64_intdigest(adapter.encode())
    return [BlockHash(splitmix64(h ^ key)) for h in hashes]
