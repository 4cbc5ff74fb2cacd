"""The reads in flight on a tier's blocks (loads, cascades, holds): pins that keep blocks from
eviction, registered per run and counted per key only once an eviction needs it."""

from __future__ import annotations

from collections.abc import Sequence

from mocker.tiers.tier import BlockKey

__all__ = ["Pins"]


class Pins:
    """A multiset of pinned runs of keys.

    Pinning and unpinning a run is O(1) while nothing asks which keys are pinned: most reads
    end before any eviction looks at their blocks (a read makes its blocks the most recently
    used, and a tier that holds its working set never evicts). The first time an eviction
    asks while pins exist, the per-key counts are built from the runs; from then on every
    pin and unpin keeps them exact (a Python loop per key, as a tier that evicts while
    reading needs anyway), until the last pin goes.

    A run is the sequence object that was pinned, released whole: unpin the same object
    (a content-equal sequence is found too, more slowly), and do not change it meanwhile.
    """

    __slots__ = ("_counts", "_more", "_runs", "owner")

    def __init__(self, owner: str = "tier") -> None:
        self.owner = owner  # (whose blocks: named by an unpin that no pin took)
        self._runs: dict[int, Sequence[BlockKey]] = {}  # id(run) -> that run, pinned
        self._more: dict[int, int] = {}  # id(run) -> its pins beyond the first (rare)
        self._counts: dict[BlockKey, int] | None = None  # pinned keys only, when built

    def __bool__(self) -> bool:
        return bool(self._runs)

    def add(self, keys: Sequence[BlockKey]) -> None:
        runs = self._runs
        rid = id(keys)
        if rid in runs:
            self._more[rid] = self._more.get(rid, 0) + 1
        else:
            runs[rid] = keys
        counts = self._counts
        if counts is not None:
            for key in keys:
                counts[key] = counts.get(key, 0) + 1

    def remove(self, keys: Sequence[BlockKey]) -> None:
        runs = self._runs
        rid = id(keys)
        if rid not in runs:
            found = self._find(keys)
            if found is None:
                first = keys[0] if keys else None
                raise ValueError(
                    f"{self.owner} block {first} unpinned more often than pinned (a run of "
                    f"{len(keys)} keys that no pin took: a pin is released whole)"
                )
            rid = found
        more = self._more
        if more and rid in more:
            n = more[rid]
            if n == 1:
                del more[rid]
            else:
                more[rid] = n - 1
        else:
            del runs[rid]
            if not runs:
                self._counts = None
                return
        counts = self._counts
        if counts is not None:
            for key in keys:
                n = counts[key]
                if n == 1:
                    del counts[key]
                else:
                    counts[key] = n - 1

    def _find(self, keys: Sequence[BlockKey]) -> int | None:
        """A pinned run with these keys, pinned as another sequence object."""
        wanted = list(keys)
        for rid, run in self._runs.items():
            if list(run) == wanted:
                return rid
        return None

    def counts(self) -> dict[BlockKey, int]:
        """Pin count of each pinned key (kept up to date from now on while pins exist)."""
        if not self._runs:
            return {}
        if self._counts is None:
            counts: dict[BlockKey, int] = {}
            more = self._more
            for rid, run in self._runs.items():
                times = 1 + more.get(rid, 0)
                for key in run:
                    counts[key] = counts.get(key, 0) + times
            self._counts = counts
        return self._counts

    def per_key(self) -> dict[BlockKey, int]:
        """A copy of the per-key counts (for checks)."""
        return dict(self.counts())
