"""A tier's keys and their parents: resident ones in recency order, and incoming ones (copies
on their way). The verbs `LruTier` asks of them, on an OrderedDict and a dict (the reference)
or over flat arrays in C (mocker/tiers/_clru.c)."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Iterator, Sequence
from itertools import compress, islice, repeat, takewhile
from operator import ne
from typing import Protocol, cast

from mocker.compiled import clru as _clru
from mocker.compiled import use_compiled
from mocker.tiers.tier import BlockKey

__all__ = ["LruOrder", "PyLruOrder", "chains_children_first", "lru_order"]


class LruOrder(Protocol):
    """Keys (ints in -2**63..2**64-1: block hashes, and tests' negative ones) -> parent key
    or None. A key is *resident* (in recency order, least recently used first) or *incoming*
    (reserved, not in the order); `len`, `in`, `[]`, iteration and the verbs down to `items`
    see resident keys only.

    Batch verbs take a list, a tuple or (the compiled one) a buffer of 8-byte unsigned ints.
    A verb on resident keys that meets one not there raises KeyError there, the keys before
    it applied; the verbs on incoming batches check the whole batch first. (The compiled one
    raises OverflowError for an int outside the range, where the reference may answer.)"""

    def __len__(self) -> int: ...

    @property
    def num_incoming(self) -> int: ...

    def __contains__(self, key: object, /) -> bool: ...

    def __getitem__(self, key: BlockKey, /) -> BlockKey | None: ...

    def __iter__(self) -> Iterator[BlockKey]: ...

    def add(self, keys: Sequence[BlockKey], parents: Sequence[BlockKey | None], /) -> None:
        """At the most recently used end, in order; a key here keeps its place and takes the
        new parent (as OrderedDict.update)."""
        ...

    def move_to_end(self, keys: Sequence[BlockKey], /) -> None:
        """Each becomes the most recently used in turn (the last one most of all)."""
        ...

    def pop_many(self, keys: Sequence[BlockKey], /) -> None: ...

    def pop_lru(self, n: int, /) -> list[BlockKey]:
        """Up to n keys taken from the least recently used end, in that order."""
        ...

    def count_run(self, keys: Sequence[BlockKey], start: int, stop: int, /) -> int:
        """How many of keys[start:stop] are here, contiguously from start (IndexError: stop
        past the keys)."""
        ...

    def contains_all(self, keys: Sequence[BlockKey], /) -> bool: ...

    def isdisjoint(self, keys: Sequence[BlockKey], /) -> bool: ...

    def present(self, keys: Sequence[BlockKey], /) -> list[BlockKey]:
        """The keys that are here, in the order given."""
        ...

    def parents(self, keys: Sequence[BlockKey], /) -> list[BlockKey | None]: ...

    def scan(
        self, n: int, pinned: Container[BlockKey], spared: Container[BlockKey], /
    ) -> tuple[list[BlockKey], list[BlockKey]]:
        """From the least recently used end: up to n keys neither pinned nor spared, and the
        pinned keys passed on the way. Nothing moves or leaves."""
        ...

    def keys(self) -> list[BlockKey]: ...

    def items(self) -> list[tuple[BlockKey, BlockKey | None]]: ...

    def holds(self, key: BlockKey, /) -> bool:
        """Resident or incoming."""
        ...

    def holds_all(self, keys: Sequence[BlockKey], /) -> bool:
        """Every key resident or incoming."""
        ...

    def reserve_new(self, keys: Sequence[BlockKey], parents: Sequence[BlockKey | None], /) -> bool:
        """If no key is held (resident or incoming) and none comes twice, all become incoming:
        True; else nothing changes: False."""
        ...

    def reserve(self, keys: Sequence[BlockKey], parents: Sequence[BlockKey | None], /) -> None:
        """Every key becomes incoming (ValueError, nothing changed: one is held already, or
        comes twice)."""
        ...

    def incoming_present(self, keys: Sequence[BlockKey], /) -> list[BlockKey]:
        """The keys that are incoming, in the order given."""
        ...

    def make_resident(self, keys: Sequence[BlockKey], /) -> list[BlockKey | None] | None:
        """These incoming keys become resident in the order `chains_children_first` gives
        (children before parents) when the batch is chains: None. Otherwise (a chain
        branches within it) nothing changes and their parents are returned, for
        `make_resident_in_order` after the caller's ordering. KeyError (nothing changed): a key not
        incoming, or twice."""
        ...

    def make_resident_in_order(self, keys: Sequence[BlockKey], /) -> None:
        """These incoming keys become resident, in this order (KeyError as `make_resident`)."""
        ...

    def drop(self, keys: Sequence[BlockKey], /) -> None:
        """These incoming keys are given up (KeyError as `make_resident`)."""
        ...


def chains_children_first(
    keys: list[BlockKey], parents: list[BlockKey | None]
) -> tuple[list[BlockKey], list[BlockKey | None]] | None:
    """A batch of chains reordered so that every block comes after its descendants (the
    order a batch lands in: a parent more recently used than its children), or None if a
    chain branches within the batch. Chains root first (a write-through batch, a promotion)
    are each reversed, chains leaf first (an evict batch) kept; the chains stay in the order
    of their roots. C-level comparisons and slices; mocker/tiers/_clru.c orders alike."""
    if parents[:-1] == keys[1:]:
        return keys, parents  # one chain, leaf first
    if parents[1:] == keys[:-1]:
        return keys[::-1], parents[::-1]  # one chain, root first
    n = len(keys)
    # Root-first chains: a run continues while each block's parent is the key before it.
    starts = [0, *compress(range(1, n), map(ne, parents[1:], keys[:-1]))]
    in_batch = set(keys)
    if not any(map(in_batch.__contains__, map(parents.__getitem__, starts))):
        out_keys: list[BlockKey] = []
        out_parents: list[BlockKey | None] = []
        for lo, hi in zip(starts, [*starts[1:], n], strict=True):
            out_keys += keys[hi - 1 : lo - 1 if lo else None : -1]
            out_parents += parents[hi - 1 : lo - 1 if lo else None : -1]
        return out_keys, out_parents
    # Leaf-first chains: a run continues while each block's parent is the key after it.
    ends = [*compress(range(1, n), map(ne, parents[:-1], keys[1:])), n]
    if not any(map(in_batch.__contains__, map(parents.__getitem__, [e - 1 for e in ends]))):
        return keys, parents
    return None


def _drain(calls: Iterator[object]) -> None:
    """Run a lazy `map` of calls to the end at C speed, keeping nothing."""
    deque(calls, maxlen=0)


class PyLruOrder:
    """`LruOrder` on an OrderedDict: the reference, and what serves without the compiled one.
    (An OrderedDict, not a plain dict: a dict leaves a hole where a key was taken out, and an
    eviction scan from the LRU end would walk over all of them.)"""

    __slots__ = ("_d", "_incoming")

    def __init__(self) -> None:
        self._d: OrderedDict[BlockKey, BlockKey | None] = OrderedDict()
        self._incoming: dict[BlockKey, BlockKey | None] = {}

    def __len__(self) -> int:
        return len(self._d)

    @property
    def num_incoming(self) -> int:
        return len(self._incoming)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __getitem__(self, key: BlockKey) -> BlockKey | None:
        return self._d[key]

    def __iter__(self) -> Iterator[BlockKey]:
        return iter(list(self._d))

    def add(self, keys: Sequence[BlockKey], parents: Sequence[BlockKey | None]) -> None:
        if len(keys) != len(parents):
            raise ValueError(f"{len(keys)} keys but {len(parents)} parents")
        if self._incoming and not self._incoming.keys().isdisjoint(keys):
            key = next(k for k in keys if k in self._incoming)
            raise ValueError(f"key {key!r} is incoming (reserved, not landed)")
        self._d.update(zip(keys, parents, strict=True))

    def move_to_end(self, keys: Sequence[BlockKey]) -> None:
        _drain(map(self._d.move_to_end, keys))

    def pop_many(self, keys: Sequence[BlockKey]) -> None:
        # (Bound `pop`, not `__delitem__`: a slot wrapper builds an argument tuple per call.)
        _drain(map(self._d.pop, keys))

    def pop_lru(self, n: int) -> list[BlockKey]:
        # Taken from the LRU end directly: an OrderedDict's iterator finds each node by its
        # key again, and a pop would once more.
        pop = self._d.popitem
        return [pop(False)[0] for _ in repeat(None, max(0, min(n, len(self._d))))]

    def count_run(self, keys: Sequence[BlockKey], start: int, stop: int) -> int:
        if stop > len(keys):
            raise IndexError(f"lookup up to {stop} of {len(keys)} keys")
        start = max(start, 0)
        if stop <= start:
            return 0
        contains = self._d.__contains__
        if all(map(contains, islice(keys, start, stop))):
            return max(0, stop - start)  # (the common answer, without building the run)
        return len(list(takewhile(contains, islice(keys, start, stop))))

    def contains_all(self, keys: Sequence[BlockKey]) -> bool:
        return all(map(self._d.__contains__, keys))

    def isdisjoint(self, keys: Sequence[BlockKey]) -> bool:
        return self._d.keys().isdisjoint(keys)

    def present(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        return list(filter(self._d.__contains__, keys))

    def parents(self, keys: Sequence[BlockKey]) -> list[BlockKey | None]:
        return list(map(self._d.__getitem__, keys))

    def scan(
        self, n: int, pinned: Container[BlockKey], spared: Container[BlockKey]
    ) -> tuple[list[BlockKey], list[BlockKey]]:
        victims: list[BlockKey] = []
        passed: list[BlockKey] = []
        if n <= 0:
            return victims, passed
        for key in self._d:
            if key in pinned:
                passed.append(key)
            elif key not in spared:
                victims.append(key)
                if len(victims) == n:
                    break
        return victims, passed

    def keys(self) -> list[BlockKey]:
        return list(self._d)

    def items(self) -> list[tuple[BlockKey, BlockKey | None]]:
        return list(self._d.items())

    # -- incoming -----------------------------------------------------------------------------

    def holds(self, key: BlockKey) -> bool:
        return key in self._d or key in self._incoming

    def holds_all(self, keys: Sequence[BlockKey]) -> bool:
        if all(map(self._d.__contains__, keys)):
            return True
        incoming = self._incoming
        return all(key in incoming or key in self._d for key in keys)

    def reserve_new(self, keys: Sequence[BlockKey], parents: Sequence[BlockKey | None]) -> bool:
        if len(keys) != len(parents):
            raise ValueError(f"{len(keys)} keys but {len(parents)} parents")
        incoming = self._incoming
        if not (self._d.keys().isdisjoint(keys) and incoming.keys().isdisjoint(keys)):
            return False
        before = len(incoming)
        incoming.update(zip(keys, parents, strict=True))
        if len(incoming) - before == len(keys):
            return True
        _drain(map(incoming.pop, set(keys)))  # a key came twice: undone
        return False

    def reserve(self, keys: Sequence[BlockKey], parents: Sequence[BlockKey | None]) -> None:
        if not self.reserve_new(keys, parents):
            raise ValueError("reserve: a key is held already (or comes twice)")

    def incoming_present(self, keys: Sequence[BlockKey]) -> list[BlockKey]:
        return list(filter(self._incoming.__contains__, keys))

    def _take(self, keys: Sequence[BlockKey]) -> list[BlockKey | None]:
        """Take these keys out of the incoming ones, their parents in order; KeyError with
        nothing changed if one is not incoming (or comes twice: its second pop fails)."""
        incoming = self._incoming
        parents: list[BlockKey | None] = []
        try:
            parents.extend(map(incoming.pop, keys))  # (what was popped is in `parents`)
        except KeyError:
            incoming.update(zip(keys, parents, strict=False))  # (up to the popped ones)
            raise
        return parents

    def make_resident(self, keys: Sequence[BlockKey]) -> list[BlockKey | None] | None:
        parents = self._take(keys)
        keys = keys if isinstance(keys, list) else list(keys)
        ordered = chains_children_first(keys, parents)
        if ordered is None:
            self._incoming.update(zip(keys, parents, strict=True))  # back: nothing changes
            return parents
        self._d.update(zip(*ordered, strict=True))
        return None

    def make_resident_in_order(self, keys: Sequence[BlockKey]) -> None:
        self._d.update(zip(keys, self._take(keys), strict=True))

    def drop(self, keys: Sequence[BlockKey]) -> None:
        self._take(keys)


def lru_order(compiled: bool | None = None) -> LruOrder:
    """A new, empty order: the compiled one when it was built (unless MOCKER_COMPILED=0),
    else the reference; `compiled` True or False asks for one."""
    if use_compiled("mocker.tiers._clru", compiled):
        return cast("LruOrder", _clru.LruMap())  # (its keys are plain ints)
    return PyLruOrder()
