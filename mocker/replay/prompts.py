"""Prompt tokens for trace requests: one deterministic token block per hash id, hashed once."""

from __future__ import annotations

import numpy as np

from mocker.kv.hashing import BlockHash, BlockHasher
from mocker.replay.trace import TraceRequest

__all__ = ["PromptBuilder"]

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: distinct inputs give unrelated outputs."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class PromptBuilder:
    """Token ids and engine block hashes for trace requests.

    Hash id h's block is `trace_block_size` tokens drawn from (seed, h, position), so equal
    ids give equal blocks and distinct ids differ in every engine block (a collision of 16
    random tokens is out of reach). A request's prompt is its blocks in order, cut to its
    input length. The engine hashes of a full trace block depend only on its parent's hash
    and its id, so they are computed once per (parent, id) and reused by every request that
    shares the prefix: the trace's prefix reuse makes hashing nearly free.
    """

    __slots__ = (
        "_hasher", "_memo", "_offsets", "_per", "_seed", "block_size", "trace_block_size", "vocab",
    )  # fmt: skip

    def __init__(
        self, hasher: BlockHasher, block_size: int, trace_block_size: int, vocab: int, seed: int
    ) -> None:
        if trace_block_size % block_size:
            raise ValueError(
                f"--trace-block-size ({trace_block_size}) must be a multiple of the engine's "
                f"block size ({block_size})"
            )
        self._hasher = hasher
        self.block_size = block_size
        self.trace_block_size = trace_block_size
        self.vocab = vocab
        self._seed = np.uint64(seed & 0xFFFFFFFF) << np.uint64(32)
        self._offsets = np.arange(trace_block_size, dtype=np.uint64)
        self._per = trace_block_size // block_size
        self._memo: dict[tuple[BlockHash | None, int], tuple[BlockHash, ...]] = {}

    def tokens(self, request: TraceRequest) -> list[int]:
        ids = np.asarray(request.hash_ids, dtype=np.uint64)
        # Per (id, position) one 64-bit draw; ids above 2^40 stay distinct (the seed sits in
        # the top bits only after mixing).
        starts = ids[:, None] * np.uint64(self.trace_block_size)
        keys = (starts + self._offsets[None, :]) ^ self._seed
        draws = _mix(keys & _MASK).ravel()[: request.input_length]
        # Token ids 2..vocab-1 (0 and 1 are often special).
        return (draws % np.uint64(self.vocab - 2) + np.uint64(2)).astype(np.int64).tolist()

    def block_hashes(self, request: TraceRequest, tokens: list[int]) -> list[BlockHash]:
        """Engine block hashes of the request's full trace blocks (the tail is left to the
        engine, which hashes blocks as they fill)."""
        full = request.input_length // self.trace_block_size
        out: list[BlockHash] = []
        parent: BlockHash | None = None
        memo, hasher, bs, tbs = self._memo, self._hasher, self.block_size, self.trace_block_size
        for i, h in enumerate(request.hash_ids[:full]):
            key = (parent, h)
            run = memo.get(key)
            if run is None:
                run_list: list[BlockHash] = []
                prev = parent
                base = i * tbs
                for j in range(self._per):
                    lo = base + j * bs
                    prev = hasher.hash_block(prev, tokens[lo : lo + bs])
                    run_list.append(prev)
                run = memo[key] = tuple(run_list)
            out.extend(run)
            parent = run[-1]
        return out
