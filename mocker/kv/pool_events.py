"""The device pool's KV event log: the events its changes make, drained once per engine step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import compress

from mocker.kv.block import KVBlock
from mocker.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, stored_event
from mocker.kv.hashing import BlockHash

__all__ = ["PoolEventLog"]


class PoolEventLog:
    """Events recorded since the last drain, naming each group as its spec says."""

    __slots__ = ("block_size", "events", "group_meta")

    def __init__(self, block_size: int, group_meta: list[tuple[str, int | None]] | None) -> None:
        """`group_meta`: per group, its spec's kind and window (None: a dense model's events
        name no group)."""
        self.block_size = block_size
        self.group_meta = group_meta
        self.events: list[KVEvent] = []

    def take(self) -> list[KVEvent]:
        """Drain the events recorded since the last call."""
        if not self.events:
            return []
        events, self.events = self.events, []
        return events

    def stored(
        self,
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
    ) -> None:
        """A dense model's blocks [start, end) of one request, newly cached."""
        self.events.append(
            stored_event(
                start, end, block_hashes, token_ids, self.block_size, lora_name, session_id
            )
        )

    def stored_run(
        self,
        table: Sequence[KVBlock | None],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        group: int | None,
        session_id: str | None,
    ) -> None:
        """A run of newly cached blocks of a block table (group None: a dense model's): the
        hashes of the positions holding a block (every one in a run is new), the tokens of
        every position."""
        if group is None:
            self.stored(start, end, block_hashes, token_ids, lora_name, session_id)
            return
        bs = self.block_size
        kind, window = self.group_meta[group] if self.group_meta else ("full_attention", None)
        # (A block is truthy and None is not: the hashes of the positions that hold one.)
        hashes = tuple(compress(block_hashes[start:end], table[start:end]))
        self.events.append(
            BlockStored(
                block_hashes=hashes,
                parent_block_hash=block_hashes[start - 1] if start > 0 else None,
                token_ids=tuple(token_ids[start * bs : end * bs]),
                block_size=bs,
                lora_name=lora_name,
                group_idx=group,
                kv_cache_spec_kind=kind,
                kv_cache_spec_sliding_window=window,
                session_id=session_id,
            )
        )

    def hit(
        self,
        n: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
        group: int | None,
    ) -> None:
        """A request's first `n` blocks, found cached (`BlockPool.announce_hit`)."""
        event = stored_event(0, n, block_hashes, token_ids, self.block_size, lora_name,
                             session_id)  # fmt: skip
        if group is not None and self.group_meta is not None:
            kind, window = self.group_meta[group]
            event = replace(event, group_idx=group, kv_cache_spec_kind=kind,
                            kv_cache_spec_sliding_window=window)  # fmt: skip
        self.events.append(event)

    def removed(self, block_hash: BlockHash, group: int) -> None:
        """A cached block left its group's map (evicted or displaced)."""
        if self.group_meta is None:
            self.events.append(BlockRemoved(block_hashes=(block_hash,)))
        else:
            self.events.append(BlockRemoved(block_hashes=(block_hash,), group_idx=group))

    def cleared(self, kept_by_group: Sequence[Sequence[KVBlock]]) -> None:
        """AllBlocksCleared, then a BlockStored for each block a reset kept, per group (each
        group's parents first, as given)."""
        self.events.append(AllBlocksCleared())
        bs = self.block_size
        meta = self.group_meta
        for group, kept in enumerate(kept_by_group):
            kind, window = meta[group] if meta else (None, None)
            self.events.extend(
                BlockStored(
                    block_hashes=(b.cached_hash,),
                    parent_block_hash=b.parent_hash,
                    token_ids=b.token_ids(bs),
                    block_size=bs,
                    lora_name=b.lora_name,
                    group_idx=group if meta else None,
                    kv_cache_spec_kind=kind,
                    kv_cache_spec_sliding_window=window,
                )
                for b in kept
            )
