"""Intrusive doubly-linked list of free blocks: O(1) append, pop and removal from the middle."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mocker.kv.block import BlockId, KVBlock

__all__ = ["FreeBlockQueue"]


class FreeBlockQueue:
    """Blocks link to each other through their own prev/next fields; nothing is allocated.

    Two sentinels bracket the list, so a block is on it exactly when its
    `prev_free` is set, and no operation needs an emptiness special case.
    """

    __slots__ = ("_head", "_len", "_tail")

    def __init__(self, blocks: Iterable[KVBlock] = ()) -> None:
        self._head = KVBlock(BlockId(-1))
        self._tail = KVBlock(BlockId(-2))
        self._len = 0
        # Linked in one walk, as appending each in turn would (a pool starts with all its
        # blocks here: 200,000 calls of `append` took a third of a second).
        last = self._head
        n = 0
        for block in blocks:
            if block.prev_free is not None:
                raise ValueError(f"{block!r} is already on a free list")
            block.prev_free = last
            last.next_free = block
            last = block
            n += 1
        last.next_free = self._tail
        self._tail.prev_free = last
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVBlock]:
        node = self._head.next_free
        while node is not self._tail:
            assert node is not None
            yield node
            node = node.next_free

    def _link_after(self, prev: KVBlock, block: KVBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"{block!r} is already on a free list")
        nxt = prev.next_free
        assert nxt is not None
        block.prev_free = prev
        block.next_free = nxt
        prev.next_free = block
        nxt.prev_free = block
        self._len += 1

    def append(self, block: KVBlock) -> None:
        """Add at the tail: reused last."""
        tail_prev = self._tail.prev_free
        assert tail_prev is not None
        self._link_after(tail_prev, block)

    def appendleft(self, block: KVBlock) -> None:
        """Add at the head: reused first."""
        self._link_after(self._head, block)

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise ValueError(f"{block!r} is not on a free list")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def push_many(self, blocks: Iterable[KVBlock]) -> None:
        """Each block in turn: one holding a hash to the tail (reused last), one without to
        the head (reused first), as `append` / `appendleft` would, linked in one walk (the
        freeing hot path: every block of every finished request)."""
        head, tail = self._head, self._tail
        last = tail.prev_free  # the tail end of the list as it grows
        assert last is not None
        n = 0
        for block in blocks:
            if block.prev_free is not None:
                last.next_free = tail  # (the list stays whole for whoever catches this)
                tail.prev_free = last
                self._len += n
                raise ValueError(f"{block!r} is already on a free list")
            if block.block_hash is None:  # (rare: a request's last, partial block)
                self._link_after(head, block)  # counted there
                if last is head:
                    last = block
            else:
                block.prev_free = last
                last.next_free = block
                last = block
                n += 1
        last.next_free = tail
        tail.prev_free = last
        self._len += n

    def popleft(self) -> KVBlock:
        first = self._head.next_free
        if first is self._tail or first is None:
            raise IndexError("no free blocks")
        self.remove(first)
        return first

    def popleft_many(self, n: int) -> list[KVBlock]:
        """The first n blocks, unlinked in one walk (the allocator's hot path)."""
        if n > self._len:
            raise IndexError(f"{n} blocks wanted, {self._len} free")
        out: list[KVBlock] = []
        node = self._head.next_free
        for _ in range(n):
            assert node is not None
            out.append(node)
            nxt = node.next_free
            node.prev_free = node.next_free = None
            node = nxt
        assert node is not None
        self._head.next_free = node
        node.prev_free = self._head
        self._len -= n
        return out

    def peek(self) -> KVBlock | None:
        first = self._head.next_free
        return None if first is self._tail else first
