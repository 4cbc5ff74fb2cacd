"""Write-through for hybrid models (vLLM PR #38261): whole chunks of every KV cache group, one
tier unit each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mocker.kv.block import BlockId, KVBlock
from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.context import TierContext
from mocker.tiers.policy import RequestRuns
from mocker.tiers.store_policy import WriteThrough
from mocker.tiers.stores import Stores

if TYPE_CHECKING:
    from mocker.kv.coordinator import HybridKVCacheManager

__all__ = ["ChunkUnit", "HybridWriteThrough", "chunk_keys"]


@dataclass(slots=True, eq=False)
class ChunkUnit(KVBlock):
    """One chunk of a request as a tier stores it: its key (the hash of its last block, which
    chains the whole prefix), its tokens, and the device blocks of every group that hold it
    (each attention group's blocks of the chunk, each Mamba group's state at its end),
    pinned while the copy runs. Not a pool block."""

    members: list[KVBlock] = field(default_factory=list)


class HybridWriteThrough(WriteThrough):
    """vLLM's OffloadingConnector for a hybrid model: after the pass that completes a prompt
    chunk, it is copied to the CPU tier as one unit, but only when every group has it (a
    sliding window's blocks of it, a Mamba state saved exactly at its end); a finished
    request's tables wait for its copies, as a dense one's do."""

    __slots__ = ("_chunk_blocks", "_held_tables", "_kv", "_layout_attention")

    def __init__(
        self,
        connector: TierContext,
        stores: Stores,
        kv: HybridKVCacheManager,
        *,
        prompt_only: bool = True,
    ) -> None:
        """`kv`: the coordinator, through which blocks are released (it counts each group's
        blocks in use)."""
        super().__init__(connector, stores, prompt_only=prompt_only)
        self._kv = kv
        self._chunk_blocks = connector.unit
        # Per group: attention (a chunk's blocks) or Mamba (the state at its end).
        self._layout_attention = [g.is_attention for g in kv.layout.groups]
        self._held_tables: dict[Request, list[list[KVBlock | None]]] = {}

    @property
    def num_held_blocks(self) -> int:
        return sum(
            1 for tables in self._held_tables.values() for t in tables for b in t if b is not None
        )

    def _unit(self, request: Request, c: int) -> ChunkUnit | None:
        """Chunk c of the request, if every group holds it cached on the device."""
        tables = request.group_blocks
        if tables is None:
            return None
        m = self._chunk_blocks
        lo, hi = c * m, (c + 1) * m
        hashes = request.block_hashes
        members: list[KVBlock] = []
        for table, attention in zip(tables, self._layout_attention, strict=True):
            for i in range(lo, hi) if attention else (hi - 1,):
                block = table[i] if i < len(table) else None
                if block is None or block.block_hash != hashes[i]:
                    return None  # released, never saved (a Mamba state), or not cached
                members.append(block)
        key = hashes[hi - 1]
        return ChunkUnit(
            BlockId(-1),
            block_hash=key,
            parent_hash=hashes[lo - 1] if lo else None,
            token_src=request.all_token_ids,
            token_start=lo * self._connector.config.block_size,
            lora_name=request.lora_name,
            members=members,
        )

    def on_cached(self, request: Request, before: int) -> None:
        connector = self._connector
        m = self._chunk_blocks
        stop = request.num_cached_blocks
        if self._prompt_only:
            stop = min(stop, request.num_prompt_tokens // connector.config.block_size)
        units = [u for c in range(before // m, stop // m) if (u := self._unit(request, c))]
        if not units:
            return
        chosen, keys, parents = self._stores.plan(units)
        pool = connector.pool
        for unit in chosen:
            assert isinstance(unit, ChunkUnit)
            pool.touch(unit.members)  # referenced already: pinned, not newly used
        if chosen:
            self._stage(request, chosen, keys, parents)

    def stored(self, blocks: list[KVBlock], owners: RequestRuns | None) -> None:
        release = self._kv.release_blocks
        for unit in reversed(blocks):  # tail first, as a request frees its blocks
            assert isinstance(unit, ChunkUnit)
            release(unit.members[::-1])
        self._copies_ended(owners)

    def _release_held(self, owner: Request) -> None:
        held = self._held_tables.pop(owner, None)
        if held is not None:
            self._kv.free_tables(held)

    def request_finished(self, request: Request) -> bool:
        if request not in self._storing or request.group_blocks is None:
            return False
        self._held_tables[request] = request.group_blocks
        request.group_blocks = None
        request.blocks = []
        return True


def chunk_keys(hashes: Sequence[BlockHash], unit: int) -> Sequence[BlockHash]:
    """The keys of a request's chunks: the hash of each chunk's last block. With one block a
    chunk, the hashes themselves (a list, or a replay's array: the tiers read either, and a
    lookup does not copy a whole prompt's)."""
    if unit == 1:
        return hashes
    return list(hashes[unit - 1 :: unit])
