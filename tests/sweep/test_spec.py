"""The sweep spec: what it accepts, and one clear line for each thing it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocker.errors import ConfigError
from mocker.sweep.spec import MAX_POINTS, Slo, flag_name, load_spec
from tests.sweep.specs import write_spec


def test_a_spec_reads_its_trace_relative_to_itself(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path))
    assert spec.trace == tmp_path / "trace.jsonl"
    assert spec.axes == {"num-engines": [1, 2], "max-num-seqs": [2, 8]}
    assert spec.num_points == 4
    assert spec.slo == Slo(ttft=5.0, attainment=0.5)
    assert spec.flags["timing-model"] == "polynomial"


def test_flag_names_take_any_of_the_spellings() -> None:
    for key in ("--max-num-seqs", "max_num_seqs", "max-num-seqs"):
        assert flag_name(key, "axes") == "max-num-seqs"


def test_a_synthetic_workload_becomes_flags(tmp_path: Path) -> None:
    path = write_spec(tmp_path, trace=None, synthetic={"num-requests": 10, "rate": 2})
    spec = load_spec(path)
    assert spec.trace is None
    assert spec.flags["synthetic"] is True and spec.flags["num-requests"] == 10


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"axes": {"num-engines": []}}, "axes: --num-engines must be a non-empty list"),
        ({"axes": {"num-engines": 2}}, "axes: --num-engines must be a non-empty list"),
        ({"axes": {}}, "axes: name at least one flag"),
        ({"axes": {"num-engines": [1, 1]}}, "lists a value twice"),
        ({"axes": {"max-requests": [1, 2]}}, "shapes the trace every point shares"),
        ({"axes": {"output-dir": ["a"]}}, "--output-dir is the sweep's own"),
        ({"axes": {"a": list(range(101)), "b": list(range(100))}},
         f"10,100 points; at most {MAX_POINTS:,}"),
        ({"slo": {}}, "slo: give at least one of ttft, tpot, e2e"),
        ({"slo": {"ttft": -1}}, "slo: ttft must be a finite number > 0"),
        ({"slo": {"ttft": 1, "attainment": 1.5}}, "slo: attainment must be in (0, 1]"),
        ({"slo": {"ttft": 1, "p90": 2}}, "slo: unknown key 'p90'"),
        ({"gpu-hour-price": {"h100_sxm": "cheap"}}, "gpu-hour-price: h100_sxm: must be"),
        ({"trace": None}, "give a trace (a file) or synthetic"),
        ({"synthetic": {"rate": 1}}, "give a trace (a file) or synthetic"),
        ({"flags": {"num-engines": 2}}, "axes: --num-engines is also under flags"),
        ({"extra": 1}, "unknown key 'extra'"),
    ],
)  # fmt: skip
def test_bad_specs_are_one_clear_line(
    tmp_path: Path, parts: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_spec(write_spec(tmp_path, **parts))


def test_an_unreadable_spec_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_spec(bad)
