"""Block ids and free order of either device pool: the Python one's blocks are `KVBlock`
objects, the compiled one's their ids."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mocker.kv.block_pool import BlockPool
from mocker.kv.compiled_pool import CompiledBlockPool


def block_ids(blocks: Iterable[Any]) -> list[int]:
    return [b if isinstance(b, int) else b.block_id for b in blocks]


def free_order(pool: BlockPool | CompiledBlockPool) -> list[int]:
    """The free blocks' ids in reuse order."""
    if isinstance(pool, BlockPool):
        return [b.block_id for b in pool.policy]
    return pool.free_order()
