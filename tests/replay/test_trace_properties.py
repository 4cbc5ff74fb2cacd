"""Any trace line: read, or refused with its file and line (skippable), never a traceback and
never memory sized by its numbers; what is read replays."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.cli import main
from mocker.replay.trace import MAX_TRACE_TOKENS, TraceError, load_trace

MEMORY_BOUND = 64 * 2**20
KEYS = ("timestamp", "arrival", "input_length", "input_tokens", "output_length",
        "output_tokens", "hash_ids", "lora_name")  # fmt: skip
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 7, 512, 10**6, 10**12, 2**63, 2**64 + 1, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
field: st.SearchStrategy[object] = st.one_of(
    numbers,
    numbers.map(str),
    st.sampled_from(["inf", "nan", "1e400", "", "many", None, True, [], {}]),
    st.lists(st.one_of(numbers, st.text(max_size=3)), max_size=6),
    st.text(max_size=8),
)
# Mostly a valid row with a field or two of anything: the checks past the first get reached.
rows = st.one_of(
    st.fixed_dictionaries(
        {
            "timestamp": st.integers(0, 10**6) | field,
            "input_length": st.integers(1, 4000)
            | st.sampled_from([2**25, 10**12, 2**63])
            | numbers
            | field,
            "output_length": st.integers(1, 64) | numbers | field,
        },
        optional={"hash_ids": st.lists(st.integers(0, 50), max_size=8) | field, "lora_name": field},
    ),
    st.dictionaries(st.sampled_from(KEYS), field, max_size=len(KEYS)),
)


def _jsonl(path: Path, lines: list[dict[str, Any]]) -> None:
    # Python's json writes NaN and Infinity, as some trace writers do.
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(lines=st.lists(rows, min_size=1, max_size=4), skip=st.booleans())
def test_any_line_is_read_or_refused_with_its_line(
    lines: list[dict[str, Any]], skip: bool, tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    _jsonl(path, lines)
    tracemalloc.start()
    try:
        try:
            requests, skipped = load_trace(path, trace_block_size=512, skip_bad_lines=skip)
        except TraceError as exc:
            assert not skip and "t.jsonl:" in str(exc) and "\n" not in str(exc)
            return
        finally:
            peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_BOUND, peak
    assert len(requests) + len(skipped) == len(lines)
    for r in requests:
        assert r.input_length in range(1, MAX_TRACE_TOKENS + 1)
        assert r.output_length in range(1, MAX_TRACE_TOKENS + 1)
        given = "hash_ids" in lines[r.line - 1]  # (else its own ids, above 2^40)
        assert all(0 <= h < 1 << 40 for h in r.hash_ids) or not given


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(lines=st.lists(rows, min_size=1, max_size=3))
def test_what_is_read_replays_or_is_refused_in_one_line(
    lines: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    _jsonl(path, lines)
    tracemalloc.start()
    try:
        code = main(["replay", str(path), "--skip-bad-lines", "--model", "mocker",
                     "--timing-model", "polynomial", "--max-model-len", "4096",
                     "--output-dir", str(tmp_path / "o"), "--quiet", "--no-plots"])  # fmt: skip
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert "Traceback" not in err and code in (0, 2), err
    assert peak < 4 * MEMORY_BOUND, peak
    if code == 2:
        assert len([x for x in err.splitlines() if not x.startswith("mocker: skipped")]) == 1
