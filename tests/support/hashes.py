"""Block hashes written as plain ints in tests, typed as the engine's `BlockHash` (a NewType
of int: the same values at run time)."""

from __future__ import annotations

from collections.abc import Iterable

from mocker.kv.hashing import BlockHash


def hashes(*values: int) -> list[BlockHash]:
    """`hashes(1, 2)` == `[1, 2]`, as a list of BlockHash."""
    return [BlockHash(v) for v in values]


def hash_tuple(*values: int) -> tuple[BlockHash, ...]:
    """`hash_tuple(1, 2)` == `(1, 2)`, as a tuple of BlockHash (the events' field type)."""
    return tuple(BlockHash(v) for v in values)


def as_hashes(values: Iterable[int]) -> list[BlockHash]:
    """A computed run of ints as a list of BlockHash."""
    return [BlockHash(v) for v in values]
