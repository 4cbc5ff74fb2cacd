"""Values a careless or hostile user gives: for property tests of every parser."""

from __future__ import annotations

from hypothesis import strategies as st

# Numbers at and past every edge, as text: zero, negatives, huge, not finite, not numbers.
EDGES = ("0", "-1", "1", "2", "3", "7", "64", "0.5", "-0.5", "1e-300", "1e300", "1e400",
         "inf", "-inf", "nan", "NaN", "Infinity", "10000000", "1000000000000",
         "9223372036854775808", "1" + "0" * 40, "abc", "", " ", "{", "[]", '{"a": 1}',
         "/nonexistent", "true", "null", "\u0000", "0x10")  # fmt: skip

values = st.one_of(
    st.sampled_from(EDGES),
    st.integers(-(10**20), 10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)
