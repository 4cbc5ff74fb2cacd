"""The intrusive free list: order, O(1) middle removal, membership by links."""

import pytest

from mocker.kv.block import BlockId, KVBlock
from mocker.kv.free_queue import FreeBlockQueue


def _blocks(n: int) -> list[KVBlock]:
    return [KVBlock(BlockId(i)) for i in range(n)]


def test_order_append_appendleft_pop() -> None:
    b = _blocks(4)
    q = FreeBlockQueue(b[:2])
    q.append(b[2])
    q.appendleft(b[3])
    assert [x.block_id for x in q] == [3, 0, 1, 2]
    assert q.popleft() is b[3]
    assert len(q) == 3


def test_remove_from_middle_relinks_neighbours() -> None:
    b = _blocks(5)
    q = FreeBlockQueue(b)
    q.remove(b[2])
    assert [x.block_id for x in q] == [0, 1, 3, 4]
    assert b[1].next_free is b[3] and b[3].prev_free is b[1]
    assert b[2].prev_free is None and b[2].next_free is None
    assert len(q) == 4


def test_errors_on_misuse() -> None:
    b = _blocks(2)
    q = FreeBlockQueue([b[0]])
    with pytest.raises(ValueError, match="already on a free list"):
        q.append(b[0])
    with pytest.raises(ValueError, match="not on a free list"):
        q.remove(b[1])
    q.popleft()
    with pytest.raises(IndexError):
        q.popleft()
    assert q.peek() is None
