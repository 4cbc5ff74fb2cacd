"""splitmix64: the reference output, and the array form agreeing with the scalar one."""

from __future__ import annotations

import numpy as np

from mocker.mixing import MASK64, splitmix64, splitmix64_array


def test_known_answer() -> None:
    # The first output of Vigna's splitmix64 generator seeded with 0.
    assert splitmix64(0) == 0xE220A8397B1DCDAF


def test_array_form_equals_the_scalar_one() -> None:
    xs = [0, 1, 2, 12345, MASK64, MASK64 - 1, 0x9E3779B97F4A7C15]
    got = splitmix64_array(np.asarray(xs, dtype=np.uint64)).tolist()
    assert got == [splitmix64(x) for x in xs]
