"""serving_gc: the start-up heap frozen, collections of what is in flight rare while serving,
restored after."""

from __future__ import annotations

import gc

from mocker.api.gc_tuning import MIDDLE_THRESHOLD, YOUNG_THRESHOLD, serving_gc
from tests.support.servers import make_app


class _Kept:
    pass


def test_middle_collections_are_rare_while_serving_and_restored_after() -> None:
    original = gc.get_threshold()
    try:
        # CPython 3.11's and 3.12's defaults (3.13's young threshold is 2,000 already).
        gc.set_threshold(700, 10, original[2])
        before = gc.get_threshold()
        kept = _Kept()  # a tracked object built before
        assert gc.is_tracked(kept)
        with serving_gc():
            assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, before[2])
            assert not any(o is kept for o in gc.get_objects())  # frozen: no walk reaches it
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*original)


def test_a_higher_threshold_or_automatic_collection_off_is_left_alone() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(10 * YOUNG_THRESHOLD, 10 * MIDDLE_THRESHOLD, before[2])
        with serving_gc():
            assert gc.get_threshold()[:2] == (10 * YOUNG_THRESHOLD, 10 * MIDDLE_THRESHOLD)
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
        assert gc.get_threshold()[:2] == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD)
    assert gc.get_threshold() == before
