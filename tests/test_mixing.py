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


def test_arrays_wrap_without_a_warning_and_scalars_too() -> None:
    # The array form runs without numpy's errstate (it costs more than the mixing): arrays
    # of any shape wrap silently; a 0-d array (numpy scalars warn) still gets one.
    import warnings

    xs = [MASK64, MASK64 - 1, 0x9E3779B97F4A7C15]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for shape in ((3,), (3, 1), (1, 3)):
            got = splitmix64_array(np.asarray(xs, dtype=np.uint64).reshape(shape))
            assert got.shape == shape and got.ravel().tolist() == [splitmix64(x) for x in xs]
        assert int(splitmix64_array(np.asarray(MASK64, dtype=np.uint64))) == splitmix64(MASK64)
