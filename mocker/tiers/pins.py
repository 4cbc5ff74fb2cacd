"""The reads in flight on a tier's blocks (loads, cascades, holds): pins that keep blocks from
eviction, registered per run and counted per key only when an eviction needs it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from mocker.tiers.tier import BlockKey

__all__ = ["Pins"]


class Pins:
    """A multiset of pinned runs of keys.

    Pinning and unpinning a run is O(1): most reads end before any eviction looks at their
    blocks (a read makes its blocks the most recently used, and a tier that holds its
    working set never evicts). The per-key counts an eviction scan needs are built from
    the runs the first time one asks while pins exist, then kept up to date with two
    C-level counters (taken and released: a key is pinned while taken more often than
    released) until the last pin goes.

    A run is the sequence object that was pinned: unpin the same object (a content-equal
    sequence is found too, more slowly).
    """

    __slots__ = ("_released", "_runs", "_taken", "total")

    def __init__(self) -> None:
        self._runs: dict[int, list[Sequence[BlockKey]]] = {}  # id(run) -> that run, per pin
        self._taken: Counter[BlockKey] | None = None
        self._released: Counter[BlockKey] | None = None
        self.total = 0  # keys pinned, repeats counted

    def __bool__(self) -> bool:
        return bool(self._runs)

    def add(self, keys: Sequence[BlockKey]) -> None:
        entry = self._runs.get(id(keys))
        if entry is None:
            self._runs[id(keys)] = [keys]
        else:
            entry.append(keys)
        self.total += len(keys)
        if self._taken is not None:
            self._taken.update(keys)

    def remove(self, keys: Sequence[BlockKey], owner: str = "tier") -> None:
        runs = self._runs
        rid = id(keys)
        if rid not in runs:
            found = self._find(keys)
            if found is None:
                first = keys[0] if keys else None
                raise ValueError(f"{owner} block {first} unpinned more often than pinned")
            rid = found
        entry = runs[rid]
        entry.pop()
        if not entry:
            del runs[rid]
        if not runs:
            self._taken = self._released = None
            self.total = 0
            return
        self.total -= len(keys)
        if self._taken is not None and self._released is not None:
            self._released.update(keys)
            if len(self._taken) > 2 * self.total + 1024:
                # Mostly keys no longer pinned: forget the counts (rebuilt when asked).
                self._taken = self._released = None

    def _find(self, keys: Sequence[BlockKey]) -> int | None:
        """A pinned run with these keys, pinned as another sequence object."""
        wanted = list(keys)
        for rid, entry in self._runs.items():
            if list(entry[0]) == wanted:
                return rid
        return None

    def counters(self) -> tuple[Counter[BlockKey], Counter[BlockKey]]:
        """(taken, released) per key: a key is pinned while taken > released."""
        if self._taken is None or self._released is None:
            taken: Counter[BlockKey] = Counter()
            for entry in self._runs.values():
                for run in entry:
                    taken.update(run)
            self._taken, self._released = taken, Counter()
        return self._taken, self._released

    def per_key(self) -> dict[BlockKey, int]:
        """Pin count of each pinned key (for checks, and a scan's bound)."""
        if not self._runs:
            return {}
        taken, released = self.counters()
        return {k: n - released.get(k, 0) for k, n in taken.items() if n > released.get(k, 0)}
