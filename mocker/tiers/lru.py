"""A tier with a fixed number of block slots and LRU eviction: the CPU tier (and the model of
every tier below it that evicts by recency)."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from itertools import compress, islice, repeat, takewhile
from operator import ne

from mocker.kv.events import BlockRemoved, BlockStored, KVEvent, parents_first
from mocker.tiers.pins import Pins
from mocker.tiers.tier import BlockBatch, BlockKey, BlockMeta, Medium, StorePlan

__all__ = ["LruTier"]

# Every block any tier stores, loads or pins passes through this class: its per-block work on
# the common paths (reserve, land, copy out, look up, load) is C-level (dict and set
# operations, `map` consumed by `_drain`); Python loops per block are left to events and to
# eviction scans that meet pinned blocks (bench/tiers.py).


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

    __slots__ = ("_events", "_incoming", "_meta", "_pins", "_resident", "block_size",
                 "capacity", "medium", "name", "record_events")  # fmt: skip

    def __init__(
        self,
        capacity: int,
        block_size: int,
        *,
        name: str = "cpu",
        medium: Medium = Medium.CPU,
        record_events: bool = False,
    ) -> None:
        self.name = name
        self.medium = medium
        self.capacity = capacity
        self.block_size = block_size
        self.record_events = record_events
        # key -> parent key: resident blocks in LRU order (least recently used first), and
        # blocks whose copy has not landed yet. An OrderedDict, not a plain dict: a dict
        # leaves a hole where a key was taken out, and an eviction scan from the LRU end
        # would walk over all of them (hundreds of thousands in a large shared tier).
        self._resident: OrderedDict[BlockKey, BlockKey | None] = OrderedDict()
        self._incoming: dict[BlockKey, BlockKey | None] = {}
        self._meta: dict[BlockKey, BlockMeta] = {}  # resident or incoming; events only
        self._pins = Pins()  # reads in flight: never evicted
        self._events: list[KVEvent] = []

    # -- state --------------------------------------------------------------------------------

    @property
    def num_resident(self) -> int:
        return len(self._resident)

    @property
    def num_incoming(self) -> int:
        return len(self._incoming)

    @property
    def num_used(self) -> int:
        return len(self._resident) + len(self._incoming)

    @property
    def usage(self) -> float:
        return self.num_used / self.capacity if self.capacity else 0.0

    def __contains__(self, key: BlockKey) -> bool:
        """Resident: visible to lookups."""
        return key in self._resident

    def holds(self, key: BlockKey) -> bool:
        return key in self._resident or key in self._incoming

    def resident_keys(self) -> set[BlockKey]:
        return set(self._resident)

    def pins(self) -> dict[BlockKey, int]:
        """Pin count of each pinned resident block (for checks)."""
        return self._pins.per_key()

    def num_pinned(self) -> int:
        return len(self._pins.counts())

    def lookup(self, keys: Sequence[BlockKey], start: int, stop: int) -> int:
        if stop > len(keys):
            raise IndexError(f"lookup up to {stop} of {len(keys)} keys")
        contains = self._resident.__contains__
        if all(map(contains, islice(keys, start, stop))):
            return max(0, stop - start)  # (the common answer, without building the run)
        return len(list(takewhile(contains, islice(keys, start, stop))))

    # -- stores -------------------------------------------------------------------------------

    def prepare_store(self, blocks: BlockBatch) -> StorePlan:
        """The blocks not held yet are reserved in order, the least recently used unpinned
        blocks evicted to make room (never a block of this batch); when every resident
        block is pinned, the blocks past the room are skipped (no room will appear before a
        load ends)."""
        resident, incoming = self._resident, self._incoming
        keys = blocks.keys
        if (
            blocks.unique
            and len(keys) <= self.capacity - len(resident) - len(incoming)
            and resident.keys().isdisjoint(keys)
            and incoming.keys().isdisjoint(keys)
        ):
            # All new and room for all (most batches): no dict of them is built.
            incoming.update(zip(keys, blocks.parents, strict=True))
            plan = StorePlan(keys=list(keys))
            self._keep_meta(plan.keys, blocks)
            return plan
        fresh = dict(zip(keys, blocks.parents, strict=True))  # a key once, batch order
        # (Bound `pop`, not `__delitem__`: a slot wrapper builds an argument tuple per call;
        # and `isdisjoint` first: most batches are all new, or all held.)
        held: set[BlockKey] | tuple[()] = ()
        if not resident.keys().isdisjoint(fresh):
            held = resident.keys() & fresh.keys()
            _drain(map(fresh.pop, held))
        if incoming and not incoming.keys().isdisjoint(fresh):
            _drain(map(fresh.pop, incoming.keys() & fresh.keys()))
        plan = StorePlan()
        if not fresh:
            return plan
        need = len(fresh) - (self.capacity - len(resident) - len(incoming))
        if need > 0:
            victims = self._take_victims(need, held)
            plan.evicted = victims
            if len(victims) < need:
                plan.skipped = need - len(victims)
                keep = len(fresh) - plan.skipped
                fresh = dict(islice(fresh.items(), keep))
        incoming.update(fresh)
        plan.keys = list(fresh)
        self._keep_meta(plan.keys, blocks)
        return plan

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
        resident, pins = self._resident, self._pins
        if not pins and not spared:
            # Taken from the LRU end directly: an OrderedDict's iterator finds each node by
            # its key again, and a pop would once more, each a few cache misses in a large
            # tier (the Mooncake trace on 8 engines, 16k-block CPU tiers: a scan and pops
            # cost 410 ns a key, this 270).
            pop = resident.popitem
            taken = [pop(False)[0] for _ in repeat(None, min(n, len(resident)))]
            self._evicted(taken)
            return taken
        victims: list[BlockKey] = []
        in_use: list[BlockKey] = []
        pinned = pins.counts()
        # No more than the unpinned blocks can go: once they are found, stop (a tier whose
        # every block is pinned answers at once).
        n = min(n, len(resident) - len(pinned))
        if n <= 0:
            return victims
        for key in resident:
            if key in pinned:
                in_use.append(key)
                continue
            if key in spared:
                continue
            victims.append(key)
            if len(victims) == n:
                break
        self._to_end(in_use)
        self._evict(victims)
        return victims

    def _evict(self, keys: list[BlockKey]) -> None:
        _drain(map(self._resident.pop, keys))
        self._evicted(keys)

    def _evicted(self, keys: list[BlockKey]) -> None:
        """These keys left the residency (eviction): their records and events."""
        if self.record_events:
            _drain(map(self._meta.pop, keys, repeat(None)))
            medium = self.medium
            self._events.extend(BlockRemoved(block_hashes=(key,), medium=medium) for key in keys)

    def complete_store(self, keys: Sequence[BlockKey], success: bool = True) -> None:
        """Within a batch a parent becomes more recent than its children, as vLLM's LRU
        touches a chain in reverse, so a chain is evicted leaf first."""
        parents = list(map(self._incoming.pop, keys))
        if not parents:
            return
        if not success:
            if self.record_events:
                _drain(map(self._meta.pop, keys, repeat(None)))
            return
        ordered_keys, ordered_parents = _children_first(
            keys if isinstance(keys, list) else list(keys), parents
        )
        self._resident.update(zip(ordered_keys, ordered_parents, strict=True))
        if self.record_events:
            self._record_stored(keys, parents)

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
        self._to_end(list(filter(self._resident.__contains__, reversed(keys))))

    def prepare_load(self, keys: Sequence[BlockKey]) -> None:
        """A read starts (keys in chain order): pinned, and most recently used (the chain's
        root most of all). `complete_load` takes the same sequence."""
        self._to_end(keys[::-1])  # a KeyError: not resident
        self._pins.add(keys)

    def _to_end(self, keys: Sequence[BlockKey]) -> None:
        """Make these resident keys the most recently used, the last one most of all."""
        resident = self._resident
        _drain(map(resident.move_to_end, keys))

    def complete_load(self, keys: Sequence[BlockKey]) -> None:
        self.unpin(keys)

    def pin(self, keys: Sequence[BlockKey]) -> None:
        """Keep resident keys from eviction while they are read (a cascade), without
        touching their recency (unless an eviction scan passes one: see `_victims`).
        `unpin` takes the same sequence."""
        resident = self._resident
        if not all(map(resident.__contains__, keys)):
            raise KeyError(next(k for k in keys if k not in resident))
        self._pins.add(keys)

    def unpin(self, keys: Sequence[BlockKey]) -> None:
        self._pins.remove(keys, self.name)

    def copies(self, keys: Sequence[BlockKey]) -> BlockBatch:
        """These resident blocks, to store in another tier (pins and recency are each
        tier's own; the event records are shared)."""
        parents = list(map(self._resident.__getitem__, keys))
        meta = list(map(self._meta.__getitem__, keys)) if self.record_events else None
        return BlockBatch(list(keys), parents, meta, unique=True)  # (a tier's keys are)

    # -- events -------------------------------------------------------------------------------

    def announce(self) -> None:
        """Record a BlockStored for every resident block, parents first (after a consumer
        was told AllBlocksCleared while this tier kept its blocks)."""
        if self.record_events and self._resident:
            resident = self._resident
            for key in parents_first(resident, lambda k: k, resident.__getitem__):
                self._emit_run((key,), resident[key])

    def take_events(self) -> list[KVEvent]:
        if not self._events:
            return []
        events, self._events = self._events, []
        return events


def _children_first(
    keys: list[BlockKey], parents: list[BlockKey | None]
) -> tuple[list[BlockKey], list[BlockKey | None]]:
    """The keys and their parents reordered so that every block comes after its descendants.

    A batch is one chain or several, root first (a write-through batch, a promotion) or leaf
    first (an evict batch): those orders are found and applied with C-level comparisons and
    slices; anything else (a chain that branches within the batch) takes a post-order walk.
    Every path gives the walk's order: the chains in the order of their roots, each leaf
    first."""
    if parents[:-1] == keys[1:]:
        return keys, parents  # one chain, leaf first (an evict batch)
    if parents[1:] == keys[:-1]:
        return keys[::-1], parents[::-1]  # one chain, root first (a write-through batch)
    n = len(keys)
    # Root-first chains: a run continues while each block's parent is the key before it.
    starts = [0, *compress(range(1, n), map(ne, parents[1:], keys[:-1]))]
    in_batch = set(keys)
    if not any(map(in_batch.__contains__, map(parents.__getitem__, starts))):
        out_keys: list[BlockKey] = []
        out_parents: list[BlockKey | None] = []
        for lo, hi in zip(starts, [*starts[1:], n], strict=True):
            out_keys += keys[hi - 1 : lo - 1 if lo else None : -1]
            out_parents += parents[hi - 1 : lo - 1 if lo else None : -1]
        return out_keys, out_parents
    # Leaf-first chains: a run continues while each block's parent is the key after it.
    ends = [*compress(range(1, n), map(ne, parents[:-1], keys[1:])), n]
    if not any(map(in_batch.__contains__, map(parents.__getitem__, [e - 1 for e in ends]))):
        return keys, parents
    walked = _post_order(list(zip(keys, parents, strict=True)), in_batch)
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
