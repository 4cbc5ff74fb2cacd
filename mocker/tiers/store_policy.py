"""When device blocks are copied to the CPU tier: write-through (vLLM's OffloadingConnector) or
write-back on eviction (KVBM), as strategies the connector and the engine core call at fixed
points."""

from __future__ import annotations

from collections.abc import Sequence

from mocker.kv.block import KVBlock
from mocker.kv.block_pool import BlockPool
from mocker.kv.hashing import BlockHash
from mocker.request import Request
from mocker.tiers.context import TierContext
from mocker.tiers.policy import RequestRuns
from mocker.tiers.stores import Stores

__all__ = ["WriteBack", "WriteThrough"]


class WriteThrough:
    """vLLM's OffloadingConnector: a request's newly computed full prompt blocks are pinned
    (one extra reference) when they are cached and copied once their pass has ended; a
    finished request's whole block table waits for those copies (vLLM's delay_free), then
    is freed tail first. Eviction from the device is then free."""

    __slots__ = ("_connector", "_held", "_owners", "_prompt_only", "_staged", "_staged_keys",
                 "_staged_parents", "_stores", "_storing")  # fmt: skip

    def __init__(self, connector: TierContext, stores: Stores, *, prompt_only: bool = True) -> None:
        self._connector = connector
        self._stores = stores
        self._prompt_only = prompt_only
        # Pinned, copied at the pass's end; each block's key and parent key beside it (lists
        # built at C level: every stored block passes here), and whose blocks they are, as
        # runs. (The parents name the copies' chains in the tiers they cascade to.)
        self._staged: list[KVBlock] = []
        self._staged_keys: list[BlockHash] = []
        self._staged_parents: list[BlockHash | None] = []
        self._owners: RequestRuns = []
        # A request's copies in flight, and the block tables of finished requests held until
        # their last copy ends.
        self._storing: dict[Request, int] = {}
        self._held: dict[Request, list[KVBlock]] = {}

    @property
    def has_staged(self) -> bool:
        return bool(self._staged)

    @property
    def prompt_only(self) -> bool:
        """Only prompt blocks are stored: a decoding request's blocks never are."""
        return self._prompt_only

    @property
    def num_held_blocks(self) -> int:
        return sum(len(blocks) for blocks in self._held.values())

    def on_cached(self, request: Request, before: int) -> None:
        """Pin the newly cached (prompt) blocks now, before their request may free them."""
        connector = self._connector
        stop = request.num_cached_blocks
        if self._prompt_only:
            stop = min(stop, request.num_prompt_tokens // connector.block_size)
        chunk = connector.chunk
        if chunk > 1:  # whole chunks only: a partial one is stored once it fills
            stop -= stop % chunk
            before -= before % chunk
        if stop <= before:
            return
        if not connector.pool.enable_caching:
            return  # nothing is cached, so nothing can be stored
        # Blocks counted as cached hold their hashes (a duplicate was swapped for the block
        # already cached under its hash).
        pinned, keys, parents = self._stores.plan(request.blocks[before:stop])
        if pinned:
            connector.pool.touch(pinned)
            self._stage(request, pinned, keys, parents)
            if connector.lmcache is not None:  # (one store request a request a pass)
                connector.lmcache.store(len(pinned) * connector.block_size)

    def _stage(
        self,
        request: Request,
        pinned: list[KVBlock],
        keys: list[BlockHash],
        parents: list[BlockHash | None],
    ) -> None:
        """Copy these pinned blocks (their keys and parents' keys beside them, as
        `plan_store_keyed` gives them) at the pass's end."""
        self._staged += pinned
        self._staged_keys += keys
        self._staged_parents += parents
        self._owners.append((request, len(pinned)))
        self._storing[request] = self._storing.get(request, 0) + len(pinned)

    # Nothing to do after scheduling: allocation displaces nothing under write-through.
    after_schedule = None

    def end_pass(self, end: float) -> None:
        if self._staged:
            blocks, keys, owners = self._staged, self._staged_keys, self._owners
            parents = self._staged_parents
            self._staged, self._staged_keys, self._staged_parents = [], [], []
            self._owners = []
            self._stores.start(end, blocks, keys, owners, parents)

    # Nothing to do when an allocation finds no room: every free device block is reusable.
    make_room = None

    def cpu_evicted(self, keys: Sequence[BlockHash]) -> None:
        """Nothing: device blocks are not retained under write-through."""

    def cpu_gained(self, keys: Sequence[BlockHash]) -> None:
        """Nothing: device blocks are not retained under write-through."""

    def stored(self, blocks: list[KVBlock], owners: RequestRuns | None) -> None:
        # Unpin tail first, as a request frees its blocks, so a chain is evicted leaf first.
        self._connector.pool.free_blocks_reversed(blocks)
        self._copies_ended(owners)

    def _copies_ended(self, owners: RequestRuns | None) -> None:
        """Count the ended copies against their requests; a finished request whose last
        copy ended is freed (in the order the batch reaches each one's last block)."""
        if not owners:
            return
        storing = self._storing
        for owner, n in owners:
            left = storing[owner] - n
            if left:
                storing[owner] = left
                continue
            del storing[owner]
            self._release_held(owner)

    def _release_held(self, owner: Request) -> None:
        held = self._held.pop(owner, None)
        if held:
            self._connector.pool.free_blocks_reversed(held)

    def request_finished(self, request: Request) -> bool:
        if request not in self._storing:
            return False
        self._held[request] = request.blocks
        request.blocks = []
        return True


class WriteBack:
    """KVBM's offload on eviction: a cached device block the CPU tier does not hold is
    *retained* in the pool; when eviction reaches it the pool displaces it, and it is
    copied (in batches) and its slot returned once the copy ends. To keep admissions from
    waiting on copies, about one pass's worth of blocks is kept reusable (or on its way)
    by copying in the background after each pass."""

    __slots__ = ("_connector", "_pool", "_stores", "evict_ahead")

    def __init__(self, connector: TierContext, stores: Stores, evict_ahead: int) -> None:
        self._connector = connector
        self._stores = stores
        # Retaining and displacing blocks is the Python pool's (the compiled one serves no
        # write-back engine: mocker.kv.compiled_pool.serves).
        pool = connector.pool
        if not isinstance(pool, BlockPool):
            raise TypeError(f"write-back needs the Python device pool, not {type(pool).__name__}")
        self._pool = pool
        self.evict_ahead = evict_ahead

    has_staged = False
    num_held_blocks = 0

    def on_cached(self, request: Request, before: int) -> None:
        connector = self._connector
        held = connector.cpu.holds
        blocks: list[KVBlock] = [
            b for b in request.blocks[before : request.num_cached_blocks]
            if b.block_hash is not None and not held(b.block_hash)
        ]  # fmt: skip
        if blocks:
            self._pool.retain(blocks)

    def after_schedule(self, now: float) -> None:
        self._store_displaced(now)

    def end_pass(self, end: float) -> None:
        """Displace the least recently used retained blocks while reusable ones (counting
        displaced ones on their way back) are fewer than the evict-ahead mark; their copies
        start at the pass's end."""
        pool = self._pool
        short = self.evict_ahead - pool.num_reusable - pool.num_displaced
        if short > 0 and pool.num_retained_free:
            pool.displace_retained(short)
            self._store_displaced(end)

    def make_room(self, num_blocks: int) -> None:
        """Displace enough retained blocks (counting those already on their way) that the
        allocation will fit once their copies end."""
        pool = self._pool
        if pool.num_retained_free:
            pool.displace_retained(num_blocks - pool.num_reusable - pool.num_displaced)

    def cpu_evicted(self, keys: Sequence[BlockHash]) -> None:
        """The keys exist nowhere else now: a device block with one must be copied again."""
        set_retained = self._pool.set_retained
        for key in keys:
            set_retained(key, True)

    def cpu_gained(self, keys: Sequence[BlockHash]) -> None:
        """A promotion can bring a key whose device block is still cached (the request's
        device hit stopped at an evicted ancestor): that block need not be copied now."""
        set_retained = self._pool.set_retained
        for key in keys:
            set_retained(key, False)

    def stored(self, blocks: list[KVBlock], owners: RequestRuns | None) -> None:
        self._pool.return_displaced(blocks)

    def request_finished(self, request: Request) -> bool:
        return False

    def _store_displaced(self, at: float) -> None:
        """Copy the blocks the pool displaced since the last call, from `at`; those with
        nothing to copy (held already, or no room) go straight back."""
        displaced = self._pool.take_displaced()
        if not displaced:
            return
        batch = self._stores.plan(displaced)[0]
        if len(batch) < len(displaced):
            kept = set(map(id, batch))
            self._pool.return_displaced(b for b in displaced if id(b) not in kept)
        self._stores.start(at, batch)
