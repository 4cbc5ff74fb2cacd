"""Per-request KV bookkeeping: prefix lookup, slot allocation, caching and freeing of blocks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any, Protocol

from mocker.kv.block import KVBlock
from mocker.kv.hashing import BlockHash
from mocker.request import Request

__all__ = ["DevicePool", "KVCacheManager", "KVManager"]


class DevicePool(Protocol):
    """What the manager asks of the device pool: mocker.kv.block_pool's (its blocks are
    `KVBlock` objects) or the compiled one (mocker.kv.compiled_pool: its blocks are their
    ids). The manager passes blocks through without looking into them."""

    @property
    def block_size(self) -> int: ...

    @property
    def enable_caching(self) -> bool: ...

    @property
    def usage(self) -> float: ...

    @property
    def num_reusable(self) -> int: ...

    @property
    def num_used(self) -> int: ...

    @property
    def num_displaced(self) -> int: ...

    def lookup_prefix(self, block_hashes: Sequence[BlockHash]) -> list[Any]: ...

    def num_reviving(self, blocks: Sequence[Any]) -> int: ...

    def touch(self, blocks: Iterable[Any]) -> None: ...

    def get_new_blocks(self, n: int) -> list[Any]: ...

    def cache_full_blocks(
        self,
        blocks: list[Any],
        start: int,
        end: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None = None,
        session_id: str | None = None,
    ) -> None: ...

    def announce_hit(
        self,
        n: int,
        block_hashes: Sequence[BlockHash],
        token_ids: Sequence[int],
        lora_name: str | None,
        session_id: str | None,
        group: int | None = None,
    ) -> None: ...

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None: ...

    def free_blocks_reversed(self, blocks: list[Any]) -> None: ...

    # What a tier's copy of a block is named and published by.
    def block_hashes(self, blocks: Iterable[Any]) -> list[BlockHash | None]: ...

    def parent_hashes(self, blocks: Iterable[Any]) -> list[BlockHash | None]: ...

    def store_hashes(self, blocks: Iterable[Any]) -> list[BlockHash]: ...

    def token_meta(
        self, blocks: Iterable[Any], block_size: int
    ) -> list[tuple[tuple[int, ...], str | None]]: ...


class KVManager(Protocol):
    """What the scheduler and the core ask of the KV cache: this module's manager for a
    dense model, mocker.kv.coordinator's for a hybrid one. A prefix hit is opaque to the
    scheduler but for its length in blocks."""

    block_size: int
    enable_caching: bool

    @property
    def usage(self) -> float: ...

    @property
    def num_reusable(self) -> int: ...

    @property
    def num_used(self) -> int: ...

    @property
    def awaiting_displaced(self) -> bool: ...

    def get_computed_blocks(self, request: Request, max_blocks: int | None = None) -> Sized: ...

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: Any = ...,
        *,
        loaded: bool = False,
    ) -> bool: ...

    def append_blocks(self, request: Request, num_blocks: int) -> None: ...

    def cache_blocks(self, request: Request, num_tokens: int | None = None) -> None: ...

    def finish_load(self, request: Request) -> None: ...

    def finish_pull(self, request: Request) -> None: ...

    def free(self, request: Request) -> None: ...


class KVCacheManager:
    """The scheduler's only door to the block pool: it speaks in requests and tokens."""

    __slots__ = ("_make_room", "block_size", "enable_caching", "pool")

    def __init__(self, pool: DevicePool, *, make_room: Callable[[int], None] | None = None) -> None:
        """`make_room(n)`: told when an allocation of n blocks found too few reusable ones
        (a write-back store policy then displaces retained blocks)."""
        self.pool = pool
        self._make_room = make_room
        self.block_size = pool.block_size
        self.enable_caching = pool.enable_caching

    @property
    def usage(self) -> float:
        return self.pool.usage

    def get_computed_blocks(self, request: Request, max_blocks: int | None = None) -> list[KVBlock]:
        """Longest cached prefix of a request, in blocks (at most `max_blocks`).

        Capped at num_tokens - 1 tokens: the last token is always computed, so
        the pass that admits the request produces its logits.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return []
        cap = (request.num_tokens - 1) // self.block_size
        hits = self.pool.lookup_prefix(request.block_hashes[: cap if max_blocks is None
                                                            else min(max_blocks, cap)])  # fmt: skip
        if hits and request.report_hits and max_blocks is None:
            self.pool.announce_hit(len(hits), request.block_hashes, request.all_token_ids,
                                   request.lora_name, request.session_id)  # fmt: skip
        return hits

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: Sequence[KVBlock] = (),
        *,
        loaded: bool = False,
    ) -> bool:
        """Give the request room for `num_new_tokens` more tokens, after its prefix hits
        (`loaded`: loaded from a tier rather than computed; the same for a dense model).

        Returns False, changing nothing, if the pool cannot supply the blocks now.
        """
        bs = self.block_size
        held = request.blocks
        num_computed = request.num_computed_tokens + len(computed_blocks) * bs
        num_needed = -(-(num_computed + num_new_tokens) // bs) - len(held) - len(computed_blocks)
        pool = self.pool
        if computed_blocks:
            # Hits sitting on the free side stop being free when we take them (a dirty hit
            # was not reusable anyway, so it does not count against the reusable ones).
            revived = pool.num_reviving(computed_blocks)
            if num_needed + revived > pool.num_reusable:
                if self._make_room is not None:
                    self._make_room(num_needed + revived)
                return False
            pool.touch(computed_blocks)
            held.extend(computed_blocks)
            request.num_cached_blocks = len(held)
        if num_needed > 0:
            if num_needed > pool.num_reusable:
                if self._make_room is not None:
                    self._make_room(num_needed)
                return False
            held.extend(pool.get_new_blocks(num_needed))
        return True

    @property
    def num_reusable(self) -> int:
        """Blocks that can be handed out now."""
        return self.pool.num_reusable

    @property
    def quiet_failures(self) -> bool:
        """An allocation that fails changes nothing (no store policy is told to make room):
        asking again gives the same answer with the same effects."""
        return self._make_room is None

    @property
    def num_used(self) -> int:
        return self.pool.num_used

    def append_blocks(self, request: Request, num_blocks: int) -> None:
        """Give a decoding request `num_blocks` more blocks (the caller checked the room)."""
        request.blocks.extend(self.pool.get_new_blocks(num_blocks))

    def append_block_each(self, requests: Sequence[Request]) -> None:
        """One more block for each of these requests, in this order (one may come more than
        once): the same blocks as one `append_blocks(r, 1)` after another, taken from the
        pool in one call (the caller checked the room)."""
        blocks = self.pool.get_new_blocks(len(requests))
        for request, block in zip(requests, blocks, strict=True):
            request.blocks.append(block)

    @property
    def awaiting_displaced(self) -> bool:
        """Displaced blocks are on their way back (their copies end soon): a request short
        of blocks waits for them rather than preempting another."""
        return self.pool.num_displaced > 0

    def cache_blocks(self, request: Request, num_tokens: int | None = None) -> None:
        """Register the request's full blocks in the prefix cache: those of its first
        `num_tokens` tokens (the scheduler's, as vLLM's allocate_slots: what this pass will
        have computed), else of its computed ones."""
        if num_tokens is None:
            num_tokens = request.num_computed_tokens
        num_full = num_tokens // self.block_size
        if num_full <= request.num_cached_blocks:
            return
        if self.enable_caching:
            self.pool.cache_full_blocks(
                request.blocks,
                request.num_cached_blocks,
                num_full,
                request.block_hashes,
                request.all_token_ids,
                request.lora_name,
                request.session_id,
            )
        request.num_cached_blocks = num_full

    def finish_load(self, request: Request) -> None:
        """Loaded KV landed in the request's reserved blocks: they are computed, and cached."""
        request.num_computed_tokens = len(request.blocks) * self.block_size
        self.cache_blocks(request)

    def finish_pull(self, request: Request) -> None:
        """A P/D pull landed: the prompt is computed but for its last token, which the next
        pass computes again to sample the first output token (vLLM's rule), and cached."""
        request.num_computed_tokens = min(len(request.blocks) * self.block_size,
                                          request.num_tokens)  # fmt: skip
        self.cache_blocks(request)  # every pulled block, the last one too (as vLLM)
        request.num_computed_tokens -= 1

    def free(self, request: Request) -> None:
        """Release every block; the tail goes first so a shared prefix outlives it."""
        if request.blocks:
            self.pool.free_blocks_reversed(request.blocks)
            request.blocks = []
        request.num_cached_blocks = 0
