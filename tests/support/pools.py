"""Blocks and free order of either device pool: the Python one's blocks are `KVBlock`
objects, the compiled one's their ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mocker.kv.block_pool import BlockPool
from mocker.kv.compiled_pool import CompiledBlockPool


def free_order(pool: BlockPool | CompiledBlockPool) -> list[int]:
    """The free blocks' ids in reuse order."""
    if isinstance(pool, BlockPool):
        return [b.block_id for b in pool.policy]
    return pool.free_order()


@dataclass(frozen=True, slots=True)
class BlockView:
    """What a check reads of a block, from either pool."""

    block_id: int
    ref_cnt: int
    block_hash: int | None


def view(pool: BlockPool | CompiledBlockPool, block: Any) -> BlockView:
    if isinstance(pool, BlockPool):
        return BlockView(block.block_id, block.ref_cnt, block.block_hash)
    return BlockView(block, pool.ref_cnt(block), pool.block_hash(block))


def all_blocks(pool: BlockPool | CompiledBlockPool) -> list[BlockView]:
    if isinstance(pool, BlockPool):
        return [view(pool, b) for b in pool.blocks]
    return [view(pool, i) for i in range(pool.num_blocks)]


def python_pool(pool: object) -> BlockPool:
    """The Python device pool, where a test's stack has it (a hybrid model's, a retaining
    tier's): narrowed from the engine's union or protocol type."""
    assert isinstance(pool, BlockPool), type(pool)
    return pool
