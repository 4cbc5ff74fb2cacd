"""A tier with a fixed number of block slots and LRU eviction: the CPU tier (and the model of
every tier below it that evicts by recency)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice, repeat

from mocker.kv.events import BlockRemoved, BlockStored, KVEvent, parents_first
from mocker.tiers.lru_order import LruOrder, chains_children_first, lru_order
from mocker.tiers.pins import Pins
from mocker.tiers.tier import BlockBatch, BlockKey, BlockMeta, Medium, StorePlan

__all__ = ["LruTier"]

# Every block any tier stores, loads or pins passes through this class: its per-block work on
# the common paths (reserve, make resident, copy out, look up, load) is C-level (the recency order's
# batch verbs, dict and set operations, `map` consumed by `_drain`); Python loops per block
# are left to events (bench/tiers.py).


def _drain(calls: Iterable[object]) -> None:
    """Run a lazy `map` of calls to the end at C speed, keeping nothing."""
    deque(calls, maxlen=0)


class LruTier:
    """A `Tier` (mocker.tiers.tier) of `capacity` slots, evicting least recently used first.

    Incoming and resident blocks together never exceed the capacity. A block is its key and
    its parent's (the events' chains, the order of a batch in the LRU); its tokens and LoRA
    are kept only when the tier publishes events.

    Pins are runs of keys beside the LRU order (mocker.tiers.pins), counted per key only
    when an eviction scan meets them.
    """

    __slots__ = ("_events", "_meta", "_order", "_pins", "block_size", "capacity",
                 "complete_load", "lookup", "medium", "name", "pin_landed", "record_events",
                 "unpin")  # fmt: skip

    def __init__(
        self,
        capacity: int,
        block_size: int,
        *,
        name: str = "cpu",
        medium: Medium = Medium.CPU,
        record_events: bool = False,
        compiled: bool | None = None,
    ) -> None:
        self.name = name
        self.medium = medium
        self.capacity = capacity
        self.block_size = block_size
        self.record_events = record_events
        # key -> parent key: resident blocks in LRU order (least recently used first), and
        # incoming ones, whose copy has not landed yet (compiled unless `compiled` is False or
        # MOCKER_COMPILED=0: mocker.tiers.lru_order).
        self._order: LruOrder = lru_order(compiled)
        self._meta: dict[BlockKey, BlockMeta] = {}  # resident or incoming; events only
        self._pins = Pins(name)  # reads in flight: never evicted
        self._events: list[KVEvent] = []
        # The verbs every load, lookup and cascade calls are the order's and the pins' own
        # (bound methods: one call each, no wrapper frame).
        # lookup(keys, start, stop): how many of keys[start:stop] are resident, contiguously.
        self.lookup: Callable[[Sequence[BlockKey], int, int], int] = self._order.count_run
        # pin_landed(keys): `pin` of keys the caller has just landed (`complete_store`), so
        # resident: not checked again (a cascade pins every block the CPU tier stores).
        self.pin_landed: Callable[[Sequence[BlockKey]], None] = self._pins.add
        # unpin(keys), complete_load(keys): a pin released (a read's end), by its sequence.
        self.unpin: Callable[[Sequence[BlockKey]], None] = self._pins.remove
        self.complete_load = self.unpin

    # -- state --------------------------------------------------------------------------------

    @property
    def num_resident(self) -> int:
        return len(self._order)

    @property
    def num_incoming(self) -> int:
        return self._order.num_incoming

    @property
    def num_used(self) -> int:
        return len(self._order) + self._order.num_incoming

    @property
    def usage(self) -> float:
        return self.num_used / self.capacity if self.capacity else 0.0

    def __contains__(self, key: BlockKey) -> bool:
        """Resident: visible to lookups."""
        return key in self._order

    def holds(self, key: BlockKey) -> bool:
        return self._order.holds(key)

    def holds_all(self, keys: Sequence[BlockKey]) -> bool:
        """Every key resident or incoming: a store of them copies nothing."""
        return self._order.holds_all(keys)

    def resident_keys(self) -> set[BlockKey]:
        return set(self._order)

    def pins(self) -> dict[BlockKey, int]:
        """Pin count of each pinned resident block (for checks)."""
        return self._pins.per_key()

    def num_pinned(self) -> int:
        return len(self._pins.counts())

    # -- stores -------------------------------------------------------------------------------

    def prepare_store(self, blocks: BlockBatch) -> StorePlan:
        """The blocks not held yet are reserved in order, the least recently used unpinned
        blocks evicted to make room (never a block of this batch); when every resident
        block is pinned, the blocks past the room are skipped (no room will appear before a
        load ends)."""
        order = self._order
        keys = blocks.keys
        if blocks.unique and self.reserve_all_new(keys, blocks.parents, blocks.meta):
            return StorePlan(keys=list(keys))
        if order.holds_all(keys):
            return StorePlan()  # all held already (a batch that was loaded): nothing to do
        fresh = dict(zip(keys, blocks.parents, strict=True))  # a key once, batch order
        # (Bound `pop`, not `__delitem__`: a slot wrapper builds an argument tuple per call;
        # and `isdisjoint` first: most batches are all new, or all held.)
        held: set[BlockKey] | tuple[()] = ()
        fresh_keys = list(fresh)
        if not order.isdisjoint(fresh_keys):
            held = set(order.present(fresh_keys))
            _drain(map(fresh.pop, held))
        if order.num_incoming and fresh:
            _drain(map(fresh.pop, order.incoming_present(list(fresh))))
        plan = StorePlan()
        if not fresh:
            return plan
        need = len(fresh) - (self.capacity - len(order) - order.num_incoming)
        if need > 0:
            victims = self._take_victims(need, held)
            plan.evicted = victims
            if len(victims) < need:
                plan.skipped = need - len(victims)
                keep = len(fresh) - plan.skipped
                fresh = dict(islice(fresh.items(), keep))
        plan.keys = list(fresh)
        order.reserve(plan.keys, list(fresh.values()))
        self._keep_meta(plan.keys, blocks)
        return plan

    def reserve_all_new(
        self, keys: list[BlockKey], parents: list[BlockKey | None], meta: list[BlockMeta] | None
    ) -> bool:
        """`prepare_store` of a batch of distinct keys (their parents and event records
        beside them) in its common case, without building a plan: if none is held and there
        is room for all, all are reserved (True); else nothing changes (False)."""
        order = self._order
        if len(keys) > self.capacity - len(order) - order.num_incoming:
            return False
        if not order.reserve_new(keys, parents):  # (one call, no dict built)
            return False
        if self.record_events:
            self._meta.update(zip(keys, meta, strict=True) if meta is not None
                              else dict.fromkeys(keys, ((), None)))  # fmt: skip
        return True

    def _keep_meta(self, keys: list[BlockKey], blocks: BlockBatch) -> None:
        """What the events of these reserved keys will name (events only)."""
        if not self.record_events:
            return
        if blocks.meta is None:  # a caller that keeps no tokens: events name none
            self._meta.update(dict.fromkeys(keys, ((), None)))
        elif len(keys) == len(blocks.keys):  # (then the same keys, in the same order)
            self._meta.update(zip(keys, blocks.meta, strict=True))
        else:
            meta = dict(zip(blocks.keys, blocks.meta, strict=True))
            self._meta.update(zip(keys, map(meta.__getitem__, keys), strict=True))

    def _take_victims(self, n: int, spared: set[BlockKey] | tuple[()]) -> list[BlockKey]:
        """Evict up to n least recently used keys that are neither pinned nor spared, found
        in one scan from the LRU end; returns them. A pinned block the scan passes is in use
        (a read in flight): it moves to the most recently used end, so no later scan passes
        it again (a copy to a slow shared tier can keep thousands pinned)."""
        order, pins = self._order, self._pins
        if not pins and not spared:
            taken = order.pop_lru(n)  # (from the LRU end directly, no scan)
            self._evicted(taken)
            return taken
        pinned = pins.counts()
        # No more than the unpinned blocks can go: once they are found, stop (a tier whose
        # every block is pinned answers at once).
        n = min(n, len(order) - len(pinned))
        if n <= 0:
            return []
        victims, in_use = order.scan(n, pinned, spared)
        order.move_to_end(in_use)
        order.pop_many(victims)
        self._evicted(victims)
        return victims

    def _evicted(self, keys: list[BlockKey]) -> None:
        """These keys left the residency (eviction): their records and events."""
        if self.record_events:
            _drain(map(self._meta.pop, keys, repeat(None)))
            medium = self.medium
            self._events.extend(BlockRemoved(block_hashes=(key,), medium=medium) for key in keys)

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """Within a batch a parent becomes more recent than its children, as vLLM's LRU
        touches a chain in reverse, so a chain is evicted leaf first (the order lands a
        batch that is one chain by itself; `_children_first` orders any other)."""
        if not keys:
            return
        order = self._order
        if not success:
            order.drop(keys)
            if self.record_events:
                _drain(map(self._meta.pop, keys, repeat(None)))
            return
        parents = order.make_resident(keys)
        if parents is not None:
            order.make_resident_in_order(_children_first(list(keys), parents)[0])
        if self.record_events:
            self._record_stored(keys, order.parents(keys) if parents is None else parents)

    def _record_stored(self, keys: Sequence[BlockKey], parents: list[BlockKey | None]) -> None:
        """One BlockStored per run of blocks that chain parent to child."""
        start = 0
        for i in range(1, len(keys)):
            if parents[i] != keys[i - 1]:
                self._emit_run(keys[start:i], parents[start])
                start = i
        self._emit_run(keys[start:], parents[start])

    def _emit_run(self, keys: Sequence[BlockKey], parent: BlockKey | None) -> None:
        meta = self._meta
        tokens: list[int] = []
        for key in keys:
            tokens.extend(meta[key][0])
        self._events.append(
            BlockStored(
                block_hashes=tuple(keys),
                parent_block_hash=parent,
                token_ids=tuple(tokens),
                block_size=self.block_size,
                lora_name=meta[keys[0]][1],
                medium=self.medium,
            )
        )

    # -- loads --------------------------------------------------------------------------------

    def touch(self, keys: Sequence[BlockKey]) -> None:
        # The chain's root ends most recently used.
        order = self._order
        order.move_to_end(order.present(keys[::-1]))

    def prepare_load(self, keys: Sequence[BlockKey]) -> None:
        """A read starts (keys in chain order): pinned, and most recently used (the chain's
        root most of all). `complete_load` takes the same sequence."""
        self._order.move_to_end(keys[::-1])  # a KeyError: not resident
        self._pins.add(keys)

    def pin(self, keys: Sequence[BlockKey]) -> None:
        """Keep resident keys from eviction while they are read (a cascade), without
        touching their recency (unless an eviction scan passes one: see `_victims`).
        `unpin` takes the same sequence."""
        order = self._order
        if not order.contains_all(keys):
            raise KeyError(next(k for k in keys if k not in order))
        self._pins.add(keys)

    def parents(self, keys: Sequence[BlockKey]) -> list[BlockKey | None]:
        """Each resident key's parent (a KeyError: one is not resident)."""
        return self._order.parents(keys)

    def copies(self, keys: Sequence[BlockKey]) -> BlockBatch:
        """These resident blocks, to store in another tier (pins and recency are each
        tier's own; the event records are shared)."""
        parents = self._order.parents(keys)
        meta = list(map(self._meta.__getitem__, keys)) if self.record_events else None
        return BlockBatch(list(keys), parents, meta, unique=True)  # (a tier's keys are)

    # -- events -------------------------------------------------------------------------------

    def announce(self) -> None:
        """Record a BlockStored for every resident block, parents first (after a consumer
        was told AllBlocksCleared while this tier kept its blocks)."""
        if self.record_events and len(self._order):
            parent_of = dict(self._order.items())
            for key in parents_first(parent_of, lambda k: k, parent_of.__getitem__):
                self._emit_run((key,), parent_of[key])

    def take_events(self) -> list[KVEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events


def _children_first(
    keys: list[BlockKey], parents: list[BlockKey | None]
) -> tuple[list[BlockKey], list[BlockKey | None]]:
    """The keys and their parents reordered so that every block comes after its descendants:
    a batch of chains as `chains_children_first` orders it (C-level comparisons and slices),
    anything else (a chain that branches within the batch) by a post-order walk. Every path
    gives the walk's order: the chains in the order of their roots, each leaf first."""
    ordered = chains_children_first(keys, parents)
    if ordered is not None:
        return ordered
    walked = _post_order(list(zip(keys, parents, strict=True)), set(keys))
    return [k for k, _ in walked], [p for _, p in walked]


def _post_order(
    pairs: list[tuple[BlockKey, BlockKey | None]], in_batch: set[BlockKey]
) -> list[tuple[BlockKey, BlockKey | None]]:
    children: dict[BlockKey, list[tuple[BlockKey, BlockKey | None]]] = {}
    roots: list[tuple[BlockKey, BlockKey | None]] = []
    for pair in pairs:
        key, parent = pair
        if parent is not None and parent in in_batch and parent != key:
            children.setdefault(parent, []).append(pair)
        else:
            roots.append(pair)
    out: list[tuple[BlockKey, BlockKey | None]] = []
    stack: list[tuple[tuple[BlockKey, BlockKey | None], bool]] = [
        (r, False) for r in reversed(roots)
    ]
    while stack:  # iterative post-order: chains can be thousands of blocks long
        pair, expanded = stack.pop()
        if expanded:
            out.append(pair)
            continue
        stack.append((pair, True))
        stack.extend((c, False) for c in children.get(pair[0], ()))
    return out
