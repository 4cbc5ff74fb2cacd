"""Eviction policies: which free block the device pool reuses next (LRU or lineage-aware)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator

from mocker.config_choices import EvictionPolicyName
from mocker.kv.block import KVBlock
from mocker.kv.free_queue import FreeBlockQueue

__all__ = ["EvictionPolicy", "LRUPolicy", "LineagePolicy", "make_policy"]


class EvictionPolicy(ABC):
    """Owns the free blocks (reference count 0) and their reuse order.

    The pool pushes a block when its last reference goes, removes it when a
    prefix hit revives it, and pops the next block to reuse. A popped block may
    still carry a hash: the pool then evicts it from the prefix cache. The
    `on_*` hooks tell the policy about cache lineage; policies that ignore
    lineage ignore them.
    """

    __slots__ = ()

    @abstractmethod
    def __len__(self) -> int:
        """Free blocks, all of which can be handed out by repeated `pop()`."""

    @abstractmethod
    def push(self, block: KVBlock) -> None:
        """A block's reference count fell to 0. Blocks of one request come tail first."""

    @abstractmethod
    def remove(self, block: KVBlock) -> None:
        """A free cached block is in use again (prefix hit)."""

    @abstractmethod
    def pop(self) -> KVBlock:
        """The next free block to reuse."""

    @abstractmethod
    def candidates(self) -> Iterator[KVBlock]:
        """Free blocks in the order `pop()` would take them (do not mutate while iterating)."""

    @abstractmethod
    def __iter__(self) -> Iterator[KVBlock]:
        """Every free block, least recently used first (`candidates` may skip some)."""

    # Whether the on_* hooks do anything: the pool skips finding parents when they do not.
    tracks_lineage = True

    def pop_many(self, n: int) -> list[KVBlock]:
        """The next n blocks to reuse, as n calls of `pop()` would give them."""
        return [self.pop() for _ in range(n)]

    def push_many(self, blocks: list[KVBlock]) -> None:
        """`push` each, in order."""
        for block in blocks:
            self.push(block)

    def on_cached(self, block: KVBlock, parent: KVBlock | None) -> None:  # noqa: B027
        """`block` became findable; `parent` is the cached block holding its parent hash."""

    def on_uncached(self, block: KVBlock, parent: KVBlock | None) -> None:  # noqa: B027
        """`block` stopped being findable (it is being reused or was cleared)."""


class LRUPolicy(EvictionPolicy):
    """vLLM's order: one queue; unhashed blocks go to the head, cached ones to the tail."""

    __slots__ = ("_queue",)
    tracks_lineage = False

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        """`blocks`: free blocks that hold nothing, in the order they are to be reused."""
        self._queue = FreeBlockQueue(blocks)

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, block: KVBlock) -> None:
        # An unhashed block holds nothing anyone can find: reuse it before any cached one.
        if block.block_hash is None:
            self._queue.appendleft(block)
        else:
            self._queue.append(block)

    def remove(self, block: KVBlock) -> None:
        self._queue.remove(block)

    def pop(self) -> KVBlock:
        return self._queue.popleft()

    def pop_many(self, n: int) -> list[KVBlock]:
        return self._queue.popleft_many(n)

    def push_many(self, blocks: list[KVBlock]) -> None:
        self._queue.push_many(blocks)

    def order(self) -> list[KVBlock]:
        """Free blocks in reuse order (for tests and debugging)."""
        return list(self._queue)

    def candidates(self) -> Iterator[KVBlock]:
        return iter(self._queue)

    def __iter__(self) -> Iterator[KVBlock]:
        return iter(self._queue)


class LineagePolicy(LRUPolicy):
    """LRU among leaves: a cached block is never evicted while a cached child of it remains.

    With vLLM's release order (a request's blocks tail first) a child is always
    released before its parent, so the LRU head is already a leaf and this
    policy evicts exactly as `lru` does. It differs, and guards the chain, when
    blocks are released out of chain order (e.g. as asynchronous stores finish):
    then `lru` can evict a parent and strand its cached children, which no
    prefix lookup can reach any more; `lineage` skips such parents until their
    last cached child is gone. Skipping is a scan from the head, bounded by the
    number of free parents released before their children (zero in the common
    case).
    """

    __slots__ = ()
    tracks_lineage = True

    def pop(self) -> KVBlock:
        queue = self._queue
        block = next((b for b in queue if not b.num_cached_children), None)
        if block is None:
            # Usually a free block with cached children has a free cached descendant (a
            # request holding a child holds its parent). Not when a child is held alone,
            # as a write-through copy pins it: then fall back to plain LRU.
            return queue.popleft()
        queue.remove(block)
        return block

    def pop_many(self, n: int) -> list[KVBlock]:
        return [self.pop() for _ in range(n)]

    def candidates(self) -> Iterator[KVBlock]:
        return (b for b in self._queue if not b.num_cached_children)

    def on_cached(self, block: KVBlock, parent: KVBlock | None) -> None:
        if parent is not None:
            parent.num_cached_children += 1

    def on_uncached(self, block: KVBlock, parent: KVBlock | None) -> None:
        block.num_cached_children = 0
        if parent is not None:
            parent.num_cached_children -= 1


def make_policy(name: EvictionPolicyName, blocks: Iterable[KVBlock] = ()) -> EvictionPolicy:
    """The policy, holding `blocks` (free, holding nothing) in the order they are reused."""
    if name is EvictionPolicyName.LRU:
        return LRUPolicy(blocks)
    if name is EvictionPolicyName.LINEAGE:
        return LineagePolicy(blocks)
    raise ValueError(f"unknown eviction policy {name!r}")
