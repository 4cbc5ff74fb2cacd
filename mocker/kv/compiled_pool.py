"""The compiled device pool (mocker/kv/_cpool.c), when it was built and the config lets it serve.

A replay's per-block work in the Python pool is bound by memory (block objects, int objects
and a map as large as the pool, touched in the order the LRU scatters them); the compiled
pool keeps the same state in packed arrays. It serves what most runs are: a dense model,
LRU eviction, no write-back tier (KV events or not, P/D or not, write-through tiers or none).
Everything else, and every run with `MOCKER_COMPILED=0`, uses the Python pool, which
stays the reference: the compiled one does the same operations in the same order
(tests/kv/test_compiled_pool.py).
Its blocks are their ids (ints) rather than `KVBlock` objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from mocker.compiled import cpool
from mocker.config import EngineConfig
from mocker.config_choices import EvictionPolicyName, OffloadPolicy
from mocker.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    parents_first,
    stored_event,
)
from mocker.kv.hashing import BlockHash

__all__ = ["CompiledBlockPool", "CompiledEventPool", "serves"]

if TYPE_CHECKING:
    from mocker.kv._cpool import Pool as _Pool
else:
    # (Not built: the class is defined and never made, as the engine asks `use_compiled`.)
    _Pool = cpool.Pool if cpool is not None else object


def serves(config: EngineConfig, *, given_cpu: bool = False) -> bool:
    """Whether the compiled pool can serve this engine: what it does not model (write-back
    to a CPU tier, which retains and displaces device blocks; hybrid groups; lineage
    eviction) sends a run to Python. `given_cpu`: the engine gets a CPU tier from outside
    (its policy is still the config's)."""
    lru = config.cache.eviction_policy is EvictionPolicyName.LRU
    has_cpu = config.has_cpu_tier or given_cpu
    write_back = has_cpu and config.offload.offload_policy is OffloadPolicy.EVICT
    return lru and not config.is_hybrid and not write_back


class CompiledBlockPool(_Pool):
    """The device pool over packed arrays; blocks are ints (their ids)."""

    __slots__ = ()

    # What the engine asks of every pool and this one never has (no tier retains a block).
    keep_tokens = False
    num_displaced = 0
    num_retained_free = 0

    def take_events(self) -> list[KVEvent]:
        return []

    # (`block_hashes` and `parent_hashes`, each block's hash and its parent's for a store's
    # batch, are the compiled pool's own.)

    def token_meta(
        self, blocks: Iterable[int], block_size: int
    ) -> list[tuple[tuple[int, ...], str | None]]:
        """As the Python pool's when it keeps no tokens: none."""
        return [((), None) for _ in blocks]

    def announce_hit(
        self,
        n: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
        group: int | None = None,
    ) -> None:
        """(Records no events: see CompiledEventPool.)"""


_NO_TOKENS: tuple[Sequence[int], int, str | None] = ((), 0, None)


class CompiledEventPool(CompiledBlockPool):
    """The compiled pool recording vLLM's KV events, the same events in the same order as
    the Python pool's (a BlockStored per run of newly cached blocks, a BlockRemoved per
    evicted block, AllBlocksCleared then the survivors parents first on a reset). The C side
    reports what changed; the events, and each cached block's tokens for a re-announcement,
    are kept here."""

    __slots__ = ("_events", "_tokens")

    keep_tokens = True

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size, enable_caching=enable_caching,
                         record_events=True)  # fmt: skip
        self._events: list[KVEvent] = []
        # A cached block's hash -> (its request's tokens, where it starts in them, LoRA).
        self._tokens: dict[BlockHash, tuple[Sequence[int], int, str | None]] = {}

    def get_new_blocks(self, n: int) -> list[int]:
        out = super().get_new_blocks(n)
        evicted = self.take_evicted()
        if evicted:
            self._forget(evicted)
            self._events.extend(BlockRemoved(block_hashes=(h,)) for h in evicted)
        return out

    def cache_full_blocks(
        self,
        blocks: list[int],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None = None,
        session_id: str | None = None,
    ) -> None:
        try:
            super().cache_full_blocks(blocks, start, end, block_hashes, token_ids, lora_name)
        finally:  # (runs stored before an error still get their events)
            runs = self.take_stored()
        if not runs:
            return
        bs = self.block_size
        for lo, hi in runs:
            self._tokens.update(
                (block_hashes[i], (token_ids, i * bs, lora_name)) for i in range(lo, hi)
            )
            self._events.append(
                stored_event(lo, hi, block_hashes, token_ids, bs, lora_name, session_id)
            )

    def announce_hit(
        self,
        n: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
        group: int | None = None,
    ) -> None:
        """BlockPool.announce_hit's."""
        if n > 0:
            self._events.append(
                stored_event(0, n, block_hashes, token_ids, self.block_size, lora_name, session_id)
            )

    def reset_prefix_cache(self) -> int:
        cleared = super().reset_prefix_cache()
        self._forget(self.take_evicted())
        self._events.append(AllBlocksCleared())
        bs = self.block_size
        for block in parents_first(self.cached_in_order(), self._cached_hash, self.parent_hash):
            block_hash = self._cached_hash(block)
            src, at, lora = self._tokens.get(block_hash, _NO_TOKENS)
            self._events.append(
                BlockStored(
                    block_hashes=(block_hash,),
                    parent_block_hash=self.parent_hash(block),
                    token_ids=tuple(src[at : at + bs]),
                    block_size=bs,
                    lora_name=lora,
                )
            )
        return cleared

    def token_meta(
        self, blocks: Iterable[int], block_size: int
    ) -> list[tuple[tuple[int, ...], str | None]]:
        """Each cached block's first `block_size` tokens and LoRA, for a lower tier's events."""
        bs = block_size
        out: list[tuple[tuple[int, ...], str | None]] = []
        for block_hash in self.block_hashes(blocks):
            if block_hash is None:
                out.append(((), None))
                continue
            src, at, lora = self._tokens.get(block_hash, _NO_TOKENS)
            out.append((tuple(src[at : at + bs]), lora))
        return out

    def _forget(self, hashes: list[BlockHash]) -> None:
        """These blocks are no longer cached: their tokens go (the request's token list with
        them, once nothing else holds it)."""
        pop = self._tokens.pop
        for block_hash in hashes:
            pop(block_hash, None)  # (a block registered by a call that then failed has none)

    def _cached_hash(self, block: int) -> BlockHash:
        block_hash = self.block_hash(block)
        assert block_hash is not None
        return block_hash

    def take_events(self) -> list[KVEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events
