"""The device pool's state, shared by its parts (BlockPool builds on it), and its capacity."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from mocker.config_choices import EvictionPolicyName
from mocker.kv.block import BlockId, KVBlock
from mocker.kv.events import KVEvent
from mocker.kv.eviction import EvictionPolicy, make_policy
from mocker.kv.hashing import BlockHash
from mocker.kv.pool_events import PoolEventLog
from mocker.kv.spec import KVCacheGroup

__all__ = ["PoolState"]


class PoolState:
    """The blocks, their free order, each group's hash → block map, the counts and the log."""

    __slots__ = (
        "_cached",
        "_displaced",
        "_log",
        "_maps",
        "_policy",
        "block_size",
        "blocks",
        "enable_caching",
        "keep_tokens",
        "num_displaced",
        "num_retained_free",
        "num_used",
        "record_events",
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_caching: bool = True,
        eviction_policy: EvictionPolicyName = EvictionPolicyName.LRU,
        record_events: bool = False,
        keep_tokens: bool = False,
        groups: Sequence[KVCacheGroup] = (),
    ) -> None:
        """`keep_tokens`: cached blocks remember their tokens (a lower tier copies them);
        `groups`: the KV cache groups of a hybrid model (none or one: a dense one)."""
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.record_events = record_events
        # A copy in a lower tier records its block's tokens; so does a BlockStored
        # re-announced after a reset.
        self.keep_tokens = keep_tokens or record_events
        # (`BlockId(i)` is a Python call per block: one cast for all of them.)
        self.blocks = list(map(KVBlock, cast("Iterable[BlockId]", range(num_blocks))))
        # Handed out 0, 1, 2, … first.
        self._policy: EvictionPolicy = make_policy(eviction_policy, self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        # One hash map per group; group 0's is `_cached` (a dense model has no other).
        self._maps: list[dict[BlockHash, KVBlock]] = [self._cached]
        self._maps.extend({} for _ in groups[1:])
        # Per group, what its events say of it (None: a dense model's events say nothing).
        group_meta: list[tuple[str, int | None]] | None = None
        if len(groups) > 1 or (groups and groups[0].kind != "full_attention"):
            group_meta = [(g.kind.value, g.sliding_window) for g in groups]
        self._log = PoolEventLog(block_size, group_meta)
        self.num_used = 0
        self.num_retained_free = 0  # free cached blocks their holder must copy before reuse
        self.num_displaced = 0  # evicted retained blocks not yet returned by their holder
        self._displaced: list[KVBlock] = []

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Free and cached-free blocks (vLLM's free count)."""
        return len(self._policy)

    @property
    def num_reusable(self) -> int:
        """Blocks `get_new_blocks` can hand out now: free ones minus retained ones."""
        return len(self._policy) - self.num_retained_free

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: cached blocks nobody references count as free; a
        displaced slot is still occupied."""
        return (self.num_used + self.num_displaced) / len(self.blocks)

    @property
    def policy(self) -> EvictionPolicy:
        return self._policy

    def take_events(self) -> list[KVEvent]:
        """Drain the events recorded since the last call."""
        return self._log.take()
