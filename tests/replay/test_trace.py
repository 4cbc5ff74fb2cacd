"""Trace loading: Mooncake and simple rows, line-numbered errors, scaling, synthesis."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from mocker.replay.trace import (
    SyntheticSpec,
    TraceError,
    load_trace,
    scale_trace,
    synthetic_trace,
)


def write(path: Path, rows: Sequence[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_mooncake_rows(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.jsonl", [
        {"timestamp": 1500, "input_length": 700, "output_length": 9, "hash_ids": [0, 1]},
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]},
    ])  # fmt: skip
    requests, skipped = load_trace(trace)
    assert skipped == []
    assert [(r.arrival, r.input_length, r.output_length, r.hash_ids, r.line) for r in requests] == [
        (0.0, 512, 1, (0,), 2),
        (1.5, 700, 9, (0, 1), 1),
    ]  # sorted by arrival; timestamps are milliseconds


def test_simple_jsonl_and_csv_get_unique_blocks(tmp_path: Path) -> None:
    jsonl = write(tmp_path / "s.jsonl", [
        {"arrival": 0.25, "input_tokens": 600, "output_tokens": 3},
        {"arrival": 0.5, "input_tokens": 10, "output_tokens": 2},
    ])  # fmt: skip
    csv = tmp_path / "s.csv"
    csv.write_text("arrival,input_tokens,output_tokens\n0.25,600,3\n0.5,10,2\n")
    for path in (jsonl, csv):
        requests, _ = load_trace(path, trace_block_size=512)
        assert [(r.arrival, r.input_length, r.output_length) for r in requests] == [
            (0.25, 600, 3),
            (0.5, 10, 2),
        ]
        assert len(requests[0].hash_ids) == 2 and len(requests[1].hash_ids) == 1
        assert not set(requests[0].hash_ids) & set(requests[1].hash_ids)  # nothing shared


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"timestamp": 0, "output_length": 3}', "missing input length"),
        ('{"timestamp": -5, "input_length": 3, "output_length": 3}', "timestamp must be"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 3}', "input length must be"),
        ('{"timestamp": 0, "input_length": 3, "output_length": 1.5}', "whole number"),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]}',
            "cover fewer",
        ),
        (
            '{"timestamp": 0, "input_length": 6, "output_length": 3, "hash_ids": ["a"]}',
            "hash_ids must be",
        ),
        ('{"timestamp": 0, "input_length": 6, "output_length": 3, "lora_name": 7}', "lora_name"),
        # Not finite, or beyond any context: refused before a block id is counted out.
        ('{"timestamp": 0, "input_length": Infinity, "output_length": 3}', "finite number"),
        ('{"timestamp": 0, "input_length": 1e400, "output_length": 3}', "finite number"),
        ('{"timestamp": 0, "input_length": NaN, "output_length": 3}', "finite number"),
        ('{"timestamp": 0, "input_length": 1000000000000, "output_length": 3}', "more than"),
        ('{"timestamp": 0, "input_length": 3, "output_length": "inf"}', "finite number"),
    ],
)
def test_a_bad_line_is_reported_with_its_number(tmp_path: Path, row: str, why: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1}'
    trace = write(tmp_path / "t.jsonl", [good, "", row, good])
    with pytest.raises(TraceError, match=rf"t\.jsonl:3: .*{why}.*--skip-bad-lines"):
        load_trace(trace)
    requests, skipped = load_trace(trace, skip_bad_lines=True)
    assert [r.line for r in requests] == [1, 4]
    assert len(skipped) == 1 and ":3: " in skipped[0]


def test_a_csv_infinity_is_a_bad_line(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("arrival,input_length,output_length\n0,5,1\n0,inf,10\n")
    with pytest.raises(TraceError, match=r"t\.csv:3: input_length must be a finite number"):
        load_trace(csv)
    requests, skipped = load_trace(csv, skip_bad_lines=True)
    assert len(requests) == 1 and len(skipped) == 1


def test_large_hash_ids_are_renumbered_apart_from_generated_ones(tmp_path: Path) -> None:
    big, huge = (1 << 40) + 7, (1 << 64) + 1  # (2^64 + 1 once wrapped onto id 1)
    trace = write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [huge, big]},
        {"timestamp": 1, "input_length": 1024, "output_length": 1, "hash_ids": [1, big]},
        {"timestamp": 2, "input_length": 1024, "output_length": 1, "hash_ids": [huge, 2]},
        {"timestamp": 3, "input_length": 600, "output_length": 1},
    ])  # fmt: skip
    a, b, c, generated = load_trace(trace)[0]
    assert a.hash_ids[0] == c.hash_ids[0] and a.hash_ids[1] == b.hash_ids[1]  # equal stay equal
    assert len(set(a.hash_ids) | {1, 2}) == 4  # a 64-bit id does not wrap onto a small one
    assert not set(a.hash_ids) & set(generated.hash_ids)  # nor meets a row's unique blocks
    assert max(a.hash_ids) < 1 << 40 <= min(generated.hash_ids)


def test_missing_file_and_max_requests(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "nope.jsonl")
    rows = [{"timestamp": i, "input_length": 5, "output_length": 1} for i in range(10)]
    requests, _ = load_trace(write(tmp_path / "t.jsonl", rows), max_requests=3)
    assert len(requests) == 3


def test_time_scale_multiplies_gaps(tmp_path: Path) -> None:
    rows = [{"timestamp": t, "input_length": 5, "output_length": 1} for t in (0, 1000, 3000)]
    requests, _ = load_trace(write(tmp_path / "t.jsonl", rows))
    assert [r.arrival for r in scale_trace(requests, 0.5)] == [0.0, 0.5, 1.5]
    for bad in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ValueError, match="finite number > 0"):
            scale_trace(requests, bad)
    with pytest.raises(ValueError, match="beyond any finite time"):
        scale_trace(requests, 1e308)


def test_synthetic_is_seeded_and_shares_prefixes() -> None:
    spec = SyntheticSpec(num_requests=50, rate=5.0, input_length=2048, output_length=16,
                         shared_prefix_fraction=0.5, num_prefixes=2, seed=3)  # fmt: skip
    a, b = synthetic_trace(spec), synthetic_trace(spec)
    assert a == b
    assert all(r.input_length == 2048 and len(r.hash_ids) == 4 for r in a)
    firsts = {r.hash_ids[:2] for r in a}
    assert len(firsts) == 2  # two shared 1024-token prefixes
    assert len({h for r in a for h in r.hash_ids[2:]}) == 100  # the rest is unique
    arrivals = [r.arrival for r in a]
    assert arrivals == sorted(arrivals) and 5 < arrivals[-1] < 20  # ~10 s at 5/s
    assert synthetic_trace(SyntheticSpec(num_requests=5, seed=4)) != synthetic_trace(
        SyntheticSpec(num_requests=5, seed=5)
    )


def test_rows_may_name_a_lora_adapter(tmp_path: Path) -> None:
    trace = write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 5, "output_length": 1, "lora_name": "sql"},
        {"timestamp": 1, "input_length": 5, "output_length": 1, "adapter": "chat"},
        {"timestamp": 2, "input_length": 5, "output_length": 1},
    ])  # fmt: skip
    requests, _ = load_trace(trace)
    assert [r.lora for r in requests] == ["sql", "chat", None]
