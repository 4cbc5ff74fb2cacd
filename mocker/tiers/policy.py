"""The store policy's interface (what is copied to the CPU tier when), and a store's owners."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias

from mocker.kv.block import KVBlock
from mocker.kv.hashing import BlockHash
from mocker.request import Request

__all__ = ["RequestRuns", "StorePolicy"]

# The requests a store's blocks are copied for, as runs: (request, its next n blocks), in the
# batch's order (a request's blocks are contiguous in a batch).
RequestRuns: TypeAlias = list[tuple[Request, int]]


class StorePolicy(Protocol):
    """What is copied when, and what a finished copy releases on the device."""

    def on_cached(self, request: Request, before: int) -> None:
        """The request's blocks [before, num_cached_blocks) became findable on the device."""
        ...

    @property
    def after_schedule(self) -> Callable[[float], None] | None:
        """Told that the scheduling pass at `now` allocated its blocks; None when the policy
        has nothing to do then (the connector then calls nothing)."""
        ...

    def end_pass(self, end: float) -> None:
        """The pass that ends at `end` was applied: stores that follow it are due then."""
        ...

    @property
    def make_room(self) -> Callable[[int], None] | None:
        """Told when an allocation of n blocks found too few reusable device blocks; None
        when the policy has nothing to do then (the manager's failed allocations then change
        nothing, so the scheduler's compiled decode head may ask again: mocker.kv.manager)."""
        ...

    def cpu_evicted(self, keys: Sequence[BlockHash]) -> None:
        """The CPU tier no longer holds these keys: evicted to make room for a store, or
        reserved by a promotion that failed or timed out."""
        ...

    def cpu_gained(self, keys: Sequence[BlockHash]) -> None:
        """The CPU tier holds these keys now (a promotion reserved them), not from a copy
        of the device's."""
        ...

    def stored(self, blocks: list[KVBlock], owners: RequestRuns | None) -> None:
        """A copy of these device blocks ended (they are in the CPU tier now)."""
        ...

    def request_finished(self, request: Request) -> bool:
        """True: the request's blocks wait for its copies (the policy frees them later)."""
        ...

    @property
    def has_staged(self) -> bool:
        """Copies are decided but not yet handed to the connector."""
        ...

    @property
    def num_held_blocks(self) -> int:
        """Blocks of finished requests held until their copies end (for checks)."""
        ...
