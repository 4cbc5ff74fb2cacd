"""serving_gc: the start-up heap frozen, young collections rare while serving, restored after."""

from __future__ import annotations

import gc

from mocker.api.gc_tuning import YOUNG_THRESHOLD, serving_gc
from tests.support.servers import make_app


class _Kept:
    pass


def test_young_collections_are_rare_while_serving_and_restored_after() -> None:
    before = gc.get_threshold()
    assert 0 < before[0] < YOUNG_THRESHOLD  # (CPython's default, 700)
    kept = _Kept()  # a tracked object built before
    assert gc.is_tracked(kept)
    with serving_gc():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        assert not any(o is kept for o in gc.get_objects())  # frozen: no collection walks it
    assert gc.get_threshold() == before


def test_a_higher_threshold_or_automatic_collection_off_is_left_alone() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(10 * YOUNG_THRESHOLD, *before[1:])
        with serving_gc():
            assert gc.get_threshold()[0] == 10 * YOUNG_THRESHOLD
        gc.set_threshold(0, *before[1:])  # automatic collection off
        with serving_gc():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)


async def test_the_server_runs_with_it() -> None:
    app = make_app()
    before = gc.get_threshold()
    async with app.router.lifespan_context(app):
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert gc.get_threshold() == before
