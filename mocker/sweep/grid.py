"""The grid: every combination of the axes as a `mocker replay` command line, checked."""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass
from functools import cache
from typing import Any, NoReturn

from mocker.errors import ConfigError
from mocker.replay.command import add_replay_parser, engine_values, replay_config
from mocker.sweep.identity import file_digest, point_key
from mocker.sweep.spec import SweepSpec

__all__ = ["Point", "argv_of", "parse_point", "points"]


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises its complaint instead of printing usage and exiting, and takes
    no abbreviated flag (a spec's flag names its column)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _replay_parser() -> argparse.ArgumentParser:
    top = _RaisingParser(prog="mocker")
    sub = top.add_subparsers(dest="command", parser_class=_RaisingParser)
    add_replay_parser(sub)
    return sub.choices["replay"]


def parse_point(argv: list[str]) -> argparse.Namespace:
    """A point's command line as `mocker replay` reads it (a ConfigError if it cannot)."""
    return _replay_parser().parse_args(argv)


@cache
def _negatable(name: str) -> bool:
    """Whether `--no-NAME` is a flag (an on/off flag's), not only `--NAME`."""
    return _accepts(f"--no-{name}")


@cache
def _accepts(flag: str) -> bool:
    """Whether `mocker replay` knows the flag (given alone: a value-taking one then asks for
    its value, which still says it knows it)."""
    try:
        parse_point([flag])
    except ConfigError as exc:
        return not str(exc).startswith("unrecognized arguments")
    return True


def _arg(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if value is True:
        return [f"--{name}"]
    if value is False:  # off: --no-NAME, or nothing for a flag that is off unless given
        return [f"--no-{name}"] if _negatable(name) else []
    if isinstance(value, dict | list):
        return [f"--{name}", json.dumps(value, separators=(",", ":"))]
    return [f"--{name}", str(value)]


def argv_of(trace: str | None, flags: dict[str, Any]) -> list[str]:
    """The `mocker replay` arguments of a point (outputs off: the sweep keeps the rows)."""
    args = [] if trace is None else [trace]
    for name, value in flags.items():
        args += _arg(name, value)
    return [*args, "--quiet", "--no-plots"]


@dataclass(frozen=True, slots=True)
class Point:
    """One configuration: its place in the grid, its axis values, its replay command line,
    the GPUs it holds, and the key its finished result is filed under (or why it cannot
    run)."""

    index: int
    values: dict[str, Any]
    argv: list[str]
    gpu: str
    gpus: int
    key: str
    invalid: str | None = None

    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items())


def _check(argv: list[str]) -> tuple[str, int]:
    """The point's GPU and GPU count, its configuration checked as `mocker replay` would."""
    args = parse_point(argv)
    values = engine_values(args, environ={})
    if "list" in (str(values["gpu"]).lower(), str(values["model"]).lower()):
        raise ConfigError("--gpu list and --model list print tables; a point names one")
    replay_config(args, values)
    per_engine = values["tensor_parallel_size"] * values["pipeline_parallel_size"]
    return str(values["gpu"]), args.num_engines * per_engine


def points(spec: SweepSpec) -> list[Point]:
    """Every point of the grid, in the axes' order (the last axis varies fastest).

    A point whose configuration fails (a 70B model on one small GPU) is kept, marked
    invalid; an axis value no point can run with is the spec's error, as is a flag that no
    point accepts."""
    trace = None if spec.trace is None else str(spec.trace)
    _refuse_unknown_flags(spec)
    digest = None if spec.trace is None else file_digest(spec.trace)
    names = list(spec.axes)
    out: list[Point] = []
    for index, combo in enumerate(itertools.product(*spec.axes.values())):
        values = dict(zip(names, combo, strict=True))
        flags = {**spec.flags, **values}
        argv = argv_of(trace, flags)
        gpu, gpus, invalid = "", 0, None
        try:
            gpu, gpus = _check(argv)
        except ConfigError as exc:
            invalid = str(exc)
        out.append(Point(index, values, argv, gpu, gpus, point_key(digest, flags), invalid))
    _refuse_bad_values(spec, out)
    return out


def _refuse_unknown_flags(spec: SweepSpec) -> None:
    for where, names in (("flags", spec.flags), ("axes", spec.axes)):
        for name in names:
            if not _accepts(f"--{name}"):
                raise ConfigError(f"{where}: unknown flag --{name} (the flags of "
                                  "`mocker replay --help`)")  # fmt: skip


def _refuse_bad_values(spec: SweepSpec, grid: list[Point]) -> None:
    if all(p.invalid for p in grid):
        first = grid[0]
        raise ConfigError(f"no point of the grid can run; the first ({first.label()}): "
                          f"{first.invalid}")  # fmt: skip
    # Point i's value of axis a is its (i // stride)-th value, counted round: by position,
    # not by equality (values of other types can compare equal).
    stride = len(grid)
    for name, choices in spec.axes.items():
        stride //= len(choices)
        for position, value in enumerate(choices):
            mine = [p for p in grid if (p.index // stride) % len(choices) == position]
            if all(p.invalid for p in mine):
                raise ConfigError(f"axes: --{name} {value}: no point can run with it; "
                                  f"{mine[0].invalid}")  # fmt: skip
