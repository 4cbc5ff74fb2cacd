"""Deterministic generated tokens: a seeded, stateless function of (request, position)."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Collection, Sequence
from functools import cache

import numpy as np
import numpy.typing as npt

from mocker.compiled import cpass as _cpass
from mocker.compiled import use_compiled
from mocker.mixing import MASK64, splitmix64, splitmix64_array
from mocker.request import TokenIds

_COMPILED = "mocker.engine._cpass"

__all__ = ["OutputTokenSampler", "palette_rank", "palette_ranks"]


# Which palette entry a mixed 64-bit draw picks: a Zipf-like law, as words in text. The
# palette is in token-id order, and a BPE vocabulary numbers its tokens in merge order, so
# its first entries are its most frequent words (" the", " and"...). Rank r is drawn with
# probability ~ 1/r: one of the palette's B = (n + 1).bit_length() - 1 octaves
# [2^e - 1, 2^(e+1) - 1) (the last one running on to n, so that no entry outweighs the
# octaves before it) from the draw's low 32 bits, then uniformly inside it from the high 32,
# each by a multiply-shift (x * k >> 32 maps 32 bits onto [0, k) without a division).
# Integer arithmetic only, so the numpy reference, the big-int path and the compiled draws
# agree bit for bit (a palette has fewer than 2**32 entries: the products fit 64 bits).
# Besides reading like text, it keeps a streamed token's int, text-table slot and text in the
# caches for most tokens (two thirds of draws fall on the first ~1,000 words), where a
# uniform draw over 26k words missed them three times a token.
def palette_rank(m: int, n: int) -> int:
    """The palette index (< n) the mixed draw `m` (64 bits) picks."""
    octaves = (n + 1).bit_length() - 1
    e = ((m & 0xFFFFFFFF) * octaves) >> 32
    first = (1 << e) - 1
    end = n if e + 1 == octaves else 2 * first + 1
    return first + (((m >> 32) * (end - first)) >> 32)


@cache
def _octaves(n: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Each octave's first rank and its size, for a palette of n."""
    octaves = np.arange((n + 1).bit_length() - 1, dtype=np.uint64)
    first = np.left_shift(np.uint64(1), octaves) - np.uint64(1)
    size = first + np.uint64(1)
    size[-1] = np.uint64(n) - first[-1]
    return first, size


def palette_ranks(m: npt.NDArray[np.uint64], n: int) -> npt.NDArray[np.uint64]:
    """`palette_rank` over a uint64 array."""
    first, size = _octaves(n)
    e = ((m & np.uint64(0xFFFFFFFF)) * np.uint64(len(first))) >> np.uint64(32)
    ranks: npt.NDArray[np.uint64] = first[e] + (((m >> np.uint64(32)) * size[e]) >> np.uint64(32))
    return ranks


class OutputTokenSampler:
    """Picks each generated token from a palette (Zipf-like: `palette_rank`), and decides EOS
    by a per-token probability.

    Token k of a request depends only on (engine seed, request id, k), so a
    preempted request that recomputes generates the same continuation, and a
    replay with the same seed reproduces every output.
    """

    __slots__ = (
        "_ccolumn",
        "_cdraws",
        "_crows",
        "_eos_threshold",
        "_palette",
        "_palette_array",
        "_palette_ids",
        "_seed",
        "eos_token_id",
    )

    def __init__(
        self,
        palette: Sequence[int],
        eos_token_id: int,
        eos_probability: float,
        seed: int,
        *,
        compiled: bool | None = None,
    ) -> None:
        """`compiled`: draw ahead with the compiled part (mocker/engine/_cpass.c) or not;
        None: when it was built, unless MOCKER_COMPILED=0 (mocker.compiled)."""
        self._palette = [t for t in palette if t != eos_token_id]
        if not self._palette:
            raise ValueError("the output token palette needs a token other than EOS")
        self._palette_array = np.asarray(self._palette, dtype=np.int64)
        # The same as token ids' array('I') items (ids are below the vocabulary, < 2**31).
        self._palette_ids = self._palette_array.astype(np.uint32)
        self.eos_token_id = eos_token_id
        self._seed = seed
        # Compare 53-bit uniforms as integers: u < p  ⇔  bits < p·2^53.
        self._eos_threshold = int(eos_probability * (1 << 53))
        on = use_compiled(_COMPILED, compiled)
        self._cdraws = _cpass.draws if on else None
        self._crows = _cpass.rows if on else None
        self._ccolumn = _cpass.column if on else None

    @property
    def can_end_early(self) -> bool:
        """Whether EOS can ever be drawn (a request may then stop before max_tokens)."""
        return self._eos_threshold > 0

    def request_seed(self, request_id: str) -> int:
        digest = hashlib.blake2b(
            request_id.encode(), digest_size=8, key=self._seed.to_bytes(8, "big")
        ).digest()
        return int.from_bytes(digest, "big")

    def token(self, request_seed: int, index: int, eos_allowed: bool) -> int:
        """Token at output position `index`; EOS only where `eos_allowed`."""
        x = splitmix64((request_seed + index) & MASK64)
        threshold = self._eos_threshold
        if eos_allowed and threshold and (splitmix64(x) >> 11) < threshold:
            return self.eos_token_id
        palette = self._palette
        return palette[palette_rank(x, len(palette))]

    def tokens(self, request_seed: int, start: int, count: int) -> list[int]:
        """Tokens at output positions start .. start+count-1 where EOS is not allowed: the
        same as `token(request_seed, k, False)` for each, computed as one array."""
        return self.draws(request_seed, start, count, start + count)  # EOS from past the end

    def draws(self, request_seed: int, start: int, count: int, eos_from: int) -> list[int]:
        """`token(request_seed, k, k >= eos_from)` for k in start .. start+count-1, computed
        as one array: a request's next tokens drawn ahead, instead of one big-integer
        splitmix64 (two with EOS possible) per token in the pass. The compiled part's list
        holds the palette's own ints; this numpy code is its reference."""
        if self._cdraws is not None:
            drawn_c: list[int] = self._cdraws(request_seed, start, count, eos_from,
                                              self._palette, self.eos_token_id,
                                              self._eos_threshold)  # fmt: skip
            return drawn_c
        # (Array arithmetic wraps without a warning: no errstate needed.)
        x = np.arange(start, start + count, dtype=np.uint64)
        x += np.uint64(request_seed & MASK64)
        mixed = splitmix64_array(x)
        tokens = self._palette_array[palette_ranks(mixed, len(self._palette))]
        threshold = self._eos_threshold
        if threshold and eos_from < start + count:
            eos = (splitmix64_array(mixed) >> np.uint64(11)) < np.uint64(threshold)
            eos[: max(0, eos_from - start)] = False
            tokens[eos] = self.eos_token_id
        drawn: list[int] = tokens.tolist()
        return drawn

    def token_rows(
        self, request_seeds: Sequence[int], starts: Sequence[int], count: int
    ) -> list[TokenIds]:
        """`tokens(seed, start, count)` for many requests at once: one array computation
        for a whole batch (a run of decode passes) instead of one per request. Each row is an
        array('I'), not a list: no int object per token (a replay's requests append slices
        of it to their own array of ids as copies of bytes)."""
        if count <= 0 or not request_seeds:
            return [array("I") for _ in request_seeds]
        flat = array("I")
        if self._crows is not None:  # the same in C (this numpy code is its reference)
            flat.frombytes(self._crows(list(request_seeds), list(starts), count,
                                       self._palette_ids))  # fmt: skip
            return [flat[k : k + count] for k in range(0, len(flat), count)]
        x = np.asarray([s & MASK64 for s in request_seeds], dtype=np.uint64)
        x = x + np.asarray(starts, dtype=np.uint64)
        x = x[:, None] + np.arange(count, dtype=np.uint64)[None, :]
        index = palette_ranks(splitmix64_array(x), len(self._palette))
        flat.frombytes(self._palette_ids[index].tobytes())
        return [flat[k : k + count] for k in range(0, len(flat), count)]

    def token_column(self, request_seeds: Sequence[int], indexes: Sequence[int]) -> list[int]:
        """`token(seed, index, False)` for each (seed, index) pair, as one array computation:
        a pass's tokens for many requests at once (a replay's stepped passes, where no EOS
        can be drawn)."""
        if self._ccolumn is not None:  # the same in C (this numpy code is its reference)
            column_c: list[int] = self._ccolumn(list(request_seeds), list(indexes), self._palette)
            return column_c
        x = np.asarray(request_seeds, dtype=np.uint64) + np.asarray(indexes, dtype=np.uint64)
        index = palette_ranks(splitmix64_array(x), len(self._palette))
        column: list[int] = self._palette_array[index].tolist()
        return column

    def token_avoiding(self, request_seed: int, index: int, banned: Collection[int]) -> int:
        """A non-EOS token at `index` outside `banned` (vLLM masks stop tokens while
        min_tokens is unmet); deterministic, by redrawing from shifted seeds."""
        tok = self.eos_token_id
        for attempt in range(1, 64):
            tok = self.token(request_seed + (attempt << 40), index, False)
            if tok not in banned:
                break
        return tok  # if the palette holds only banned tokens, there is nothing else to give
