"""lru_order: the compiled order (mocker/tiers/_clru.c) answers every verb as the OrderedDict
reference does, state after state, and both keep the semantics LruTier relies on."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable
from typing import Any, cast

import pytest

from mocker.compiled import clru as _clru
from mocker.kv.hashing import BlockHash, hash_array
from mocker.tiers.lru import _children_first
from mocker.tiers.lru_order import LruOrder, PyLruOrder, chains_children_first, lru_order

needs_c = pytest.mark.skipif(_clru is None, reason="mocker.tiers._clru was not built")

# Keys from a small pool (so verbs meet present, incoming and absent keys alike), with the
# edges of the range: 0, 2**64 - 1 and negative ones (which must not meet 2**64 - 1).
POOL = [BlockHash(k) for k in (0, 1, 2, 3, 5, 8, 13, 21, 2**63, 2**64 - 1, -1, -2, 2**64 - 2)]


def _orders() -> list[LruOrder]:
    orders: list[LruOrder] = [PyLruOrder()]
    if _clru is not None:
        orders.append(cast("LruOrder", _clru.LruMap()))  # (its keys are plain ints)
    return orders


@pytest.mark.parametrize("order", _orders(), ids=lambda o: type(o).__name__)
def test_a_chain_lands_leaf_first_and_evicts_from_its_leaf(order: LruOrder) -> None:
    keys = [BlockHash(k) for k in (10, 11, 12)]  # root first: 11's parent is 10, ...
    assert order.reserve_new(keys, [None, keys[0], keys[1]])
    assert order.num_incoming == 3 and len(order) == 0 and keys[0] not in order
    assert order.holds(keys[0]) and order.make_resident(keys) is None
    assert order.keys() == [12, 11, 10] and order.num_incoming == 0  # the root most recent
    assert order.count_run(keys, 0, 3) == 3 and order.parents([keys[2]]) == [keys[1]]
    order.move_to_end([keys[2]])
    assert order.pop_lru(2) == [11, 10] and order.keys() == [12]


@pytest.mark.parametrize("order", _orders(), ids=lambda o: type(o).__name__)
def test_a_batch_that_is_no_chain_is_handed_back_unchanged(order: LruOrder) -> None:
    keys = [BlockHash(k) for k in (1, 2, 3)]
    order.reserve(keys, [None, None, BlockHash(1)])
    assert order.make_resident(keys) == [None, None, 1]  # nothing landed: the caller orders them
    assert order.num_incoming == 3 and len(order) == 0
    order.make_resident_in_order([BlockHash(3), BlockHash(1), BlockHash(2)])
    assert order.items() == [(3, 1), (1, None), (2, None)]


@pytest.mark.parametrize("order", _orders(), ids=lambda o: type(o).__name__)
def test_a_batch_of_chains_lands_each_leaf_first_in_the_order_of_their_roots(
    order: LruOrder,
) -> None:
    h = [BlockHash(k) for k in range(10)]
    # Two chains root first (a pass's write-through of two requests): each reversed.
    order.reserve([h[1], h[2], h[3], h[7], h[8]], [None, h[1], h[2], None, h[7]])
    assert order.make_resident([h[1], h[2], h[3], h[7], h[8]]) is None
    assert order.keys() == [3, 2, 1, 8, 7]
    # Two chains leaf first (an evict batch): as they are.
    order.reserve([h[5], h[4], h[9], h[6]], [h[4], None, h[6], None])
    assert order.make_resident([h[5], h[4], h[9], h[6]]) is None
    assert order.keys()[-4:] == [5, 4, 9, 6]


@pytest.mark.parametrize("seed", range(4))
def test_landing_orders_every_batch_as_children_first_does(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        # A few chains of fresh keys, each root first or leaf first, sometimes one branching
        # off another chain of the batch (then the caller orders it).
        keys: list[BlockHash] = []
        parents: list[BlockHash | None] = []
        for _ in range(rng.randrange(1, 4)):
            base = BlockHash(rng.getrandbits(63))
            chain = [BlockHash(base + i) for i in range(rng.randrange(1, 5))]
            up: list[BlockHash | None] = [None, *chain[:-1]]
            if keys and rng.random() < 0.2:
                up[0] = rng.choice(keys)  # branches off a block of the batch
            if rng.random() < 0.5:
                chain, up = chain[::-1], up[::-1]
            keys += chain
            parents += up
        landed = []
        for order in _orders():
            order.reserve(keys, parents)
            handed_back = order.make_resident(keys)
            if handed_back is not None:
                assert handed_back == parents and len(order) == 0
                order.make_resident_in_order(_children_first(keys, handed_back)[0])
            else:
                assert chains_children_first(keys, parents) is not None
            landed.append(order.items())
        want_keys, want_parents = _children_first(keys, parents)
        assert all(items == list(zip(want_keys, want_parents, strict=True)) for items in landed)


@pytest.mark.parametrize("order", _orders(), ids=lambda o: type(o).__name__)
def test_incoming_batches_are_checked_whole_before_anything_changes(order: LruOrder) -> None:
    order.reserve([BlockHash(1), BlockHash(2)], [None, None])
    for bad in ([BlockHash(1), BlockHash(9)], [BlockHash(2), BlockHash(2)]):
        for verb in (order.make_resident, order.make_resident_in_order, order.drop):
            with pytest.raises(KeyError):
                verb(bad)
            assert order.num_incoming == 2 and len(order) == 0
    with pytest.raises(ValueError, match="held already"):
        order.reserve([BlockHash(3), BlockHash(1)], [None, None])
    assert not order.reserve_new([BlockHash(4), BlockHash(4)], [None, None])  # twice
    assert order.num_incoming == 2 and not order.holds(BlockHash(3))
    with pytest.raises(ValueError, match="incoming"):
        order.add([BlockHash(1)], [None])
    order.drop([BlockHash(2)])
    assert order.num_incoming == 1 and not order.holds(BlockHash(2))


@pytest.mark.parametrize("order", _orders(), ids=lambda o: type(o).__name__)
def test_resident_verbs_raise_at_the_first_missing_key(order: LruOrder) -> None:
    order.add([BlockHash(1), BlockHash(2)], [None, BlockHash(1)])
    with pytest.raises(KeyError):
        order.move_to_end([BlockHash(1), BlockHash(7)])
    assert order.keys() == [2, 1]  # the key before the missing one moved
    with pytest.raises(KeyError):
        order.pop_many([BlockHash(7)])
    with pytest.raises(KeyError):
        order[BlockHash(7)]
    with pytest.raises(IndexError):
        order.count_run([BlockHash(1)], 0, 2)
    assert BlockHash(7) not in order and "a key" not in order and 2**70 not in order


@needs_c
def test_the_compiled_order_reads_8_byte_buffers_and_refuses_other_ones() -> None:
    order = lru_order(compiled=True)
    order.add([BlockHash(5), BlockHash(2**64 - 1)], [None, BlockHash(5)])
    words = hash_array(array("Q", [5, 2**64 - 1, 7]))
    assert order.count_run(words, 0, 3) == 2 and order.present(words) == [5, 2**64 - 1]
    with pytest.raises(TypeError, match="8-byte unsigned"):
        order.count_run(array("I", [5]), 0, 1)  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        order.add([BlockHash(2**64)], [None])
    with pytest.raises(TypeError):
        order.add(["five"], [None])  # type: ignore[list-item]


@needs_c
def test_a_key_whose_index_changes_things_meets_a_consistent_order() -> None:
    """A key given as another integer type is converted before the order is touched: what
    its __index__ does to the key list or the order cannot be met half way (a conversion
    in the middle of a verb could free the items the verb walks, or change the node array
    under it)."""
    order = lru_order(compiled=True)
    order.add([BlockHash(1)], [None])
    keys: list[Any] = []

    class ClearsTheList:
        def __index__(self) -> int:
            keys.clear()  # frees the list's items while a verb would walk them
            return 1

    keys += [ClearsTheList(), *range(2, 50_000)]
    assert order.present(keys) == [1]  # the keys as they were when the verb was called

    class FillsTheOrder:
        def __index__(self) -> int:
            order.add([BlockHash(k) for k in range(1000, 1063)], [None] * 63)
            return 5

    assert not order.reserve_new([BlockHash(1), FillsTheOrder()], [None, None])  # type: ignore[list-item]
    assert order.num_incoming == 0 and len(order) == 64 and 5 not in order

    class DropsAKey:
        def __index__(self) -> int:
            order.drop([BlockHash(100)])
            return 101

    order.reserve([BlockHash(100)], [None])
    with pytest.raises(KeyError):
        order.make_resident([BlockHash(100), DropsAKey()])  # type: ignore[list-item]
    assert order.num_incoming == 0 and not order.holds(BlockHash(100))

    class PopsWhileAsked:
        def __contains__(self, key: object) -> bool:
            if key == 1:
                order.pop_many([BlockHash(1)])
            return False

    with pytest.raises(RuntimeError, match="changed during scan"):
        order.scan(5, PopsWhileAsked(), ())
    # The walk stopped before following the freed node: the order's list is whole, in order.
    assert order.keys() == list(range(1000, 1063))
    assert order.scan(2, {BlockHash(1000)}, ()) == ([1001, 1002], [1000])


def test_lru_order_serves_the_compiled_one_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert type(lru_order(compiled=False)) is PyLruOrder
    if _clru is None:
        with pytest.raises(RuntimeError, match="not built"):
            lru_order(compiled=True)
        return
    monkeypatch.setenv("MOCKER_COMPILED", "auto")
    assert type(lru_order()).__module__ == "mocker.tiers._clru"
    monkeypatch.setenv("MOCKER_COMPILED", "0")
    assert type(lru_order()) is PyLruOrder


# -- the compiled order against the reference, over random verbs --------------------------------


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return ("ok", call())
    except (KeyError, ValueError, IndexError) as exc:
        return ("raised", type(exc))


def _run(rng: random.Random, n: int) -> list[BlockHash]:
    """n neighbouring keys of the pool, either way: a batch of them is given neighbouring
    nodes, so walking such runs again meets the compiled order's look beside the last node
    found (a hit, a freed node that held the key, a node reused for another)."""
    i = rng.randrange(0, len(POOL) - n + 1)
    run = POOL[i : i + n]
    return run[::-1] if rng.random() < 0.5 else run


def _keys(rng: random.Random, n: int, shape: str) -> Any:
    if rng.random() < 0.4:
        keys = [BlockHash(k) for k in _run(rng, n)]
    else:
        keys = [BlockHash(rng.choice(POOL)) for _ in range(n)]
    if shape == "buffer" and all(k >= 0 for k in keys):
        return array("Q", keys)
    return tuple(keys) if shape == "tuple" else keys


def _parents(rng: random.Random, n: int) -> list[BlockHash | None]:
    return [None if rng.random() < 0.3 else BlockHash(rng.choice(POOL)) for _ in range(n)]


def _chain(rng: random.Random, n: int) -> tuple[list[BlockHash], list[BlockHash | None]]:
    """n distinct keys of the pool as one chain, root first or leaf first."""
    picked = _run(rng, n) if rng.random() < 0.5 else rng.sample(POOL, n)
    keys = [BlockHash(k) for k in picked]
    parents: list[BlockHash | None] = [None, *keys[:-1]]
    if rng.random() < 0.5:
        return keys[::-1], parents[::-1]
    return keys, parents


def _step(order: LruOrder, rng: random.Random, shape: str) -> Callable[[], Any]:
    """One random verb on `order` (the same rng state draws the same verb for both)."""
    verb = rng.randrange(16)
    n = rng.randrange(0, 5)
    keys = _keys(rng, n, shape)
    if verb == 0:
        return lambda: order.add(keys, _parents(rng, n))
    if verb == 1:
        return lambda: order.move_to_end(keys)
    if verb == 2:
        return lambda: order.pop_many(keys)
    if verb == 3:
        return lambda: order.pop_lru(rng.randrange(-1, 4))
    if verb == 4:
        return lambda: order.count_run(keys, rng.randrange(0, 3), rng.randrange(0, n + 2))
    if verb == 5:
        return lambda: (
            order.contains_all(keys),
            order.isdisjoint(keys),
            order.present(keys),
            order.holds_all(keys),
        )
    if verb == 6:
        return lambda: order.parents(keys)
    if verb == 7:
        pinned = {rng.choice(POOL) for _ in range(3)}
        spared = {rng.choice(POOL)} if rng.random() < 0.5 else ()
        return lambda: order.scan(rng.randrange(0, 5), pinned, spared)
    if verb == 8:
        chain, parents = _chain(rng, max(1, n))
        return lambda: order.reserve_new(chain, parents)
    if verb == 9:
        return lambda: order.reserve(keys, _parents(rng, n))
    if verb == 10:
        return lambda: order.incoming_present(keys)
    if verb in (11, 12):  # make what is incoming resident, as one call (a chain or not)
        return lambda: order.make_resident(order.incoming_present(list(POOL))[: n + 1])
    if verb == 13:
        return lambda: order.make_resident_in_order(order.incoming_present(list(POOL))[::-1][:n])
    if verb == 14:
        return lambda: order.drop(keys)
    key = BlockHash(rng.choice(POOL))
    return lambda: (key in order, order.holds(key), _outcome(lambda: order[key]))


@needs_c
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shape", ["list", "tuple", "buffer"])
def test_compiled_and_reference_orders_agree_over_random_verbs(seed: int, shape: str) -> None:
    ref, fast = PyLruOrder(), lru_order(compiled=True)
    for i in range(600):
        draw = random.Random(seed * 10_000 + i).random()  # the same verb for both
        got = [_outcome(_step(o, random.Random(draw), shape)) for o in (ref, fast)]
        assert got[0] == got[1], f"step {i}"
        assert (ref.items(), ref.num_incoming, len(ref)) == (
            fast.items(),
            fast.num_incoming,
            len(fast),
        ), f"step {i}"
        assert list(ref) == list(fast) == ref.keys()


@needs_c
def test_the_compiled_order_grows_and_shrinks_through_many_keys() -> None:
    ref, fast = PyLruOrder(), lru_order(compiled=True)
    rng = random.Random(7)
    for round_ in range(30):
        keys = [BlockHash(rng.getrandbits(64)) for _ in range(rng.randrange(1, 2_000))]
        parents = [None, *keys[:-1]]
        for o in (ref, fast):
            if o.reserve_new(keys, parents):
                assert o.make_resident(keys) is None
        if round_ % 3 == 2:
            n = rng.randrange(len(ref) + 1)
            assert ref.pop_lru(n) == fast.pop_lru(n)
        sample = rng.sample(ref.keys(), min(50, len(ref)))
        for o in (ref, fast):
            o.move_to_end(sample)
        assert ref.items() == fast.items()


@needs_c
def test_keys_that_share_a_tag_and_a_home_are_told_apart() -> None:
    """The compiled table keeps each key's tag (the high half of its hash) beside its node:
    keys whose hashes differ by one share their tag and home slot, so every probe among them
    must compare the keys themselves (and deletions shift long clusters)."""
    golden = 0x9E3779B97F4A7C15  # the table's multiplier (mocker/tiers/_clru.c)
    step = pow(golden, -1, 2**64)  # key + step: the hash + 1
    keys = [BlockHash((2**63 + i * step) % 2**64) for i in range(3_000)]
    ref, fast = PyLruOrder(), lru_order(compiled=True)
    rng = random.Random(3)
    for o in (ref, fast):
        assert o.reserve_new(keys[:2_000], [None] * 2_000)
        assert o.make_resident(keys[:2_000]) is None  # (roots: chains of one)
    gone = rng.sample(keys[:2_000], 700)
    back = rng.sample(keys[:2_000], 300)
    for o in (ref, fast):
        o.pop_many([k for k in gone if k not in back])
        o.move_to_end([k for k in back if k not in gone])
        o.add(keys[2_000:], [None] * 1_000)
    assert ref.items() == fast.items()
    assert [k in fast for k in keys] == [k in ref for k in keys]
    assert fast.count_run(keys, 2_000, 3_000) == 1_000
    assert ref.pop_lru(1_500) == fast.pop_lru(1_500)
    assert ref.items() == fast.items()
