"""Hybrid models for KV tests: small shapes, cached blocks placed by hand, and the checks of
each group's block tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.coordinator import HybridKVCacheManager
from mocker.kv.group_managers import Table
from mocker.kv.hashing import BlockHash
from mocker.model_shape import ModelShape
from mocker.request import Request


def hybrid_shape(types: Sequence[str], window: int = 8, head_dim: int = 4) -> ModelShape:
    """One layer a type, one KV head of `head_dim`, a `window`, 64-byte Mamba states."""
    return ModelShape(
        num_layers=len(types),
        num_kv_heads=1,
        head_dim=head_dim,
        layer_types=tuple(types),
        sliding_window=window if "sliding_attention" in types else None,
        mamba_state_bytes=64 if "mamba" in types else 0,
    )


# The hashes of blocks placed by hand, by position (cache_free_blocks).
HASHES = [BlockHash(100 + i) for i in range(10)]


def cache_free_blocks(pool: BlockPool, group: int, positions: Iterable[int]) -> dict[int, KVBlock]:
    """Cached-free blocks of `group` by position, each cached under HASHES[position]."""
    positions = sorted(positions)
    blocks = pool.get_new_blocks(len(positions))
    table: Table = [None] * (positions[-1] + 1)
    for p, block in zip(positions, blocks, strict=True):
        block.group = group
        table[p] = block
    pool.cache_group_blocks(table, 0, len(table), HASHES, [], None, group)
    pool.free_blocks(blocks)
    return dict(zip(positions, blocks, strict=True))


def group_tables(r: Request) -> list[Table]:
    """A hybrid model's request's block table of each group."""
    assert r.group_blocks is not None
    return r.group_blocks


def check_groups(
    pool: BlockPool, kv: HybridKVCacheManager, requests: Iterable[Request] = ()
) -> None:
    """Per group, `used` counts its referenced blocks; `requests`' tables of it hold only those."""
    counts = Counter(b.group for b in pool.blocks if b.ref_cnt > 0)
    assert kv.used == [counts[g] for g in range(len(kv.used))]
    assert pool.num_used + pool.num_free == pool.num_blocks
    assert pool.num_used == sum(kv.used)
    owner: dict[int, int] = {}
    for r in requests:
        for g, table in enumerate(r.group_blocks or []):
            for block in table:
                if block is None:
                    continue
                assert block.ref_cnt > 0 and block.group == g, (r.request_id, g, block)
                assert owner.setdefault(id(block), g) == g
