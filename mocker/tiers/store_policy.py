"""When device blocks are copied to the CPU tier: write-through (vLLM's OffloadingConnector) or
write-back on eviction (KVBM), as strategies the connector calls at fixed points."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from mocker.kv.block import KVBlock
from mocker.request import Request

if TYPE_CHECKING:
    from mocker.tiers.connector import TierConnector

__all__ = ["StorePolicy", "WriteBack", "WriteThrough"]


class StorePolicy(Protocol):
    """The connector's store decisions; every hook is called by the engine core's pass."""

    def on_cached(self, request: Request, before: int) -> None:
        """The request's blocks [before, num_cached_blocks) became findable on the device."""
        ...

    def end_pass(self, end: float) -> None:
        """The pass that ends at `end` was applied: stores that follow it are due then."""
        ...

    def make_room(self, num_blocks: int) -> None:
        """An allocation of `num_blocks` found too few reusable device blocks."""
        ...


class WriteThrough:
    """vLLM's OffloadingConnector: a request's newly computed full prompt blocks are pinned
    (one extra reference) when they are cached and copied once their pass has ended; a
    finished request's blocks wait for those copies (vLLM's delay_free)."""

    __slots__ = ("_connector", "_prompt_only")

    def __init__(self, connector: TierConnector, *, prompt_only: bool = True) -> None:
        self._connector = connector
        self._prompt_only = prompt_only

    def on_cached(self, request: Request, before: int) -> None:
        stop = request.num_cached_blocks
        if self._prompt_only:
            stop = min(stop, request.num_prompt_tokens // self._connector.block_size)
        if stop > before:
            self._connector.stage_stores(request, request.blocks[before:stop])

    def end_pass(self, end: float) -> None:
        self._connector.start_staged(end)

    def make_room(self, num_blocks: int) -> None:
        """Nothing to do: with write-through every free device block is reusable."""


class WriteBack:
    """KVBM's offload on eviction: a cached device block the CPU tier does not hold is
    *retained* in the pool; when eviction reaches it the pool displaces it, and the
    connector copies it (in batches) and returns the slot once the copy ends. To keep
    admissions from waiting on copies, about one pass's worth of blocks is kept reusable
    (or on its way) by copying in the background after each pass."""

    __slots__ = ("_connector", "evict_ahead")

    def __init__(self, connector: TierConnector, evict_ahead: int) -> None:
        self._connector = connector
        self.evict_ahead = evict_ahead

    def on_cached(self, request: Request, before: int) -> None:
        connector = self._connector
        held = connector.cpu.holds
        blocks: list[KVBlock] = [
            b for b in request.blocks[before : request.num_cached_blocks]
            if b.block_hash is not None and not held(b.block_hash)
        ]  # fmt: skip
        if blocks:
            connector.pool.retain(blocks)

    def end_pass(self, end: float) -> None:
        """Start copying the least recently used retained blocks while reusable ones
        (counting displaced ones on their way back) are fewer than the evict-ahead mark."""
        pool = self._connector.pool
        short = self.evict_ahead - pool.num_reusable - pool.num_displaced
        if short > 0 and pool.num_retained_free:
            pool.displace_retained(short)
            self._connector.store_displaced(end)

    def make_room(self, num_blocks: int) -> None:
        """Displace enough retained blocks (counting those already on their way) that the
        allocation will fit once their copies end."""
        pool = self._connector.pool
        if pool.num_retained_free:
            pool.displace_retained(num_blocks - pool.num_reusable - pool.num_displaced)
