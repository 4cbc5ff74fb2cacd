"""The grid: points in order, their command lines, GPUs and keys; bad flags and values."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocker.errors import ConfigError
from mocker.sweep.grid import argv_of, parse_point, points
from mocker.sweep.identity import point_key
from mocker.sweep.spec import load_spec
from tests.sweep.specs import TRACE_FLAGS, write_spec


def test_points_are_every_combination_last_axis_fastest(tmp_path: Path) -> None:
    grid = points(load_spec(write_spec(tmp_path)))
    assert [p.values for p in grid] == [
        {"num-engines": 1, "max-num-seqs": 2},
        {"num-engines": 1, "max-num-seqs": 8},
        {"num-engines": 2, "max-num-seqs": 2},
        {"num-engines": 2, "max-num-seqs": 8},
    ]
    assert [p.index for p in grid] == [0, 1, 2, 3]
    assert [p.gpus for p in grid] == [1, 1, 2, 2]
    assert len({p.key for p in grid}) == 4 and not any(p.invalid for p in grid)
    args = parse_point(grid[3].argv)
    assert args.num_engines == 2 and args.max_num_seqs == 8 and args.quiet and args.no_plots


def test_gpus_count_the_parallelism_of_every_engine(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, flags={"trace-block-size": 64, "model":
                      "meta-llama/Llama-3.1-70B", "gpu": "h100_sxm", "quantization": "fp8"},
                      axes={"num-engines": [1, 3], "tensor-parallel-size": [2, 4]})  # fmt: skip
    assert [p.gpus for p in points(load_spec(spec))] == [2, 4, 6, 12]
    assert {p.gpu for p in points(load_spec(spec))} == {"h100_sxm"}


def test_a_key_follows_the_trace_content_and_flags_not_the_path(tmp_path: Path) -> None:
    first = [p.key for p in points(load_spec(write_spec(tmp_path)))]
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "trace.jsonl").write_bytes((tmp_path / "trace.jsonl").read_bytes())
    assert [p.key for p in points(load_spec(write_spec(moved)))] == first
    (moved / "trace.jsonl").write_text((tmp_path / "trace.jsonl").read_text()[:-200] + "\n")
    changed = [p.key for p in points(load_spec(moved / "sweep.yaml"))]
    assert set(changed).isdisjoint(first)


def test_a_combination_that_cannot_run_is_kept_as_invalid(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, axes={"num-engines": [1, 2], "prefill-engines": [0, 1]})
    grid = points(load_spec(spec))
    assert [p.invalid is None for p in grid] == [True, False, True, True]
    assert grid[1].invalid is not None and "--prefill-engines (1)" in grid[1].invalid


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ({"axes": {"num-engines": [1, 2], "nonsense-flag": [1]}},
         "axes: unknown flag --nonsense-flag"),
        ({"flags": {"max-num": 4}}, "flags: unknown flag --max-num"),  # no abbreviations
        ({"axes": {"num-engines": [1, 0]}}, "axes: --num-engines 0: no point can run with it; "
         "invalid num_engines=0"),
        ({"axes": {"max-num-seqs": [4, "many"]}}, "--max-num-seqs many: no point can run"),
        ({"axes": {"gpu": ["list"]}}, "no point of the grid can run"),
    ],
)  # fmt: skip
def test_a_bad_flag_or_value_is_the_specs_error(
    tmp_path: Path, parts: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        points(load_spec(write_spec(tmp_path, **parts)))


def test_argv_spells_each_value_as_the_command_line_would() -> None:
    argv = argv_of("t.jsonl", {"synthetic": True, "enable-prefix-caching": False, "c": None,
                               "d": {"k": 1}, "e": 2.5})  # fmt: skip
    assert argv == ["t.jsonl", "--synthetic", "--no-enable-prefix-caching", "--d", '{"k":1}',
                    "--e", "2.5", "--quiet", "--no-plots"]  # fmt: skip


def test_a_model_too_big_for_one_gpu_is_invalid_there_only(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, flags={"trace-block-size": 64, "model":
                      "meta-llama/Llama-3.1-70B"}, axes={"gpu": ["h100_sxm", "b200_sxm"],
                      "tensor-parallel-size": [1, 4]})  # fmt: skip
    grid = points(load_spec(spec))
    assert [p.invalid is None for p in grid] == [False, True, True, True]
    assert grid[0].invalid is not None and "memory" in grid[0].invalid.lower()


def test_false_leaves_an_on_flag_off_and_negates_an_on_off_one() -> None:
    assert argv_of(None, {"skip-bad-lines": False, "enable-prefix-caching": False}) == [
        "--no-enable-prefix-caching", "--quiet", "--no-plots"]  # fmt: skip


def test_a_flag_given_null_is_still_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="flags: unknown flag --bogus-flag"):
        points(load_spec(write_spec(tmp_path, flags={**TRACE_FLAGS, "bogus-flag": None})))


def test_a_file_a_flag_names_is_part_of_the_key(tmp_path: Path) -> None:
    profile = tmp_path / "correction.json"
    profile.write_text("{}")
    first = point_key("t", {"timing-profile": str(profile)})
    assert point_key("t", {"timing-profile": str(profile)}) == first
    profile.write_text('{"scale": 2}')
    assert point_key("t", {"timing-profile": str(profile)}) != first
    assert point_key("u", {"timing-profile": str(profile)}) != first  # the trace's digest
