"""The sweep spec: what it accepts, and one clear line for each thing it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocker.errors import ConfigError
from mocker.sweep.spec import MAX_POINTS, MAX_SPEC_BYTES, Slo, flag_name, load_spec
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
        ({"slo": {}}, "slo: give at least one bound"),
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
    with pytest.raises(ConfigError, match=r"missing\.yaml: no such file"):
        load_spec(tmp_path / "missing.yaml")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="cannot read it"):
        load_spec(bad_yaml)
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_spec(bad)


def test_aliases_are_refused_before_they_expand(tmp_path: Path) -> None:
    path = write_spec(tmp_path)
    text = path.read_text()
    path.write_text("x: &a [1, 1, 1]\ny: &b [*a, *a, *a]\n" + text)
    with pytest.raises(ConfigError, match="aliases"):
        load_spec(path)


def test_a_spec_or_trace_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sweep spec /dev/zero: no such file"):
        load_spec("/dev/zero")
    with pytest.raises(ConfigError, match="trace: no such file: /dev/zero"):
        load_spec(write_spec(tmp_path, trace="/dev/zero"))
    big = tmp_path / "big.yaml"
    big.write_text("#" * (MAX_SPEC_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_spec(big)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"axes": {"num-engines": [float("nan"), 2]}}, "nan is not a finite number"),
        ({"flags": {"max-num-seqs": float("inf")}}, "inf is not a finite number"),
        ({"slo": {1: 2, "x": 3, "ttft": 1}}, "slo: unknown key '1'"),
    ],
)
def test_values_no_flag_takes_are_refused(
    tmp_path: Path, parts: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_spec(write_spec(tmp_path, **parts))


def test_percentile_bounds_are_part_of_the_slo(tmp_path: Path) -> None:
    spec = load_spec(write_spec(tmp_path, slo={"ttft-p99": 2.0, "tpot-p50": 0.05}))
    assert spec.slo.percentiles == (("ttft_p99_s", 2.0), ("tpot_p50_s", 0.05))
    assert spec.slo.ttft is None
    assert spec.slo.describe() == "ttft p99 <= 2 s; tpot p50 <= 0.05 s"
