"""The grid: every combination of the axes as a `mocker replay` command line, checked."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from mocker import __version__
from mocker.errors import ConfigError
from mocker.replay.command import add_replay_parser, engine_values, replay_config
from mocker.sweep.spec import SweepSpec

__all__ = ["Point", "argv_of", "parse_point", "points", "trace_digest"]


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


def _arg(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if value is True:
        return [f"--{name}"]
    if value is False:
        return [f"--no-{name}"]
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


def trace_digest(path: Path | None) -> str | None:
    """The trace file's SHA-256 (a finished point is only reused for the same trace)."""
    if path is None:
        return None
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as exc:
        raise ConfigError(f"trace: cannot read {path}: {exc.strerror or exc}") from None
    return digest.hexdigest()


def _key(digest: str | None, flags: dict[str, Any]) -> str:
    # The trace's content and not its path: a moved trace keeps its finished points.
    identity = {"mocker": __version__, "trace": digest, "flags": flags}
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


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
    _refuse_unknown_flags(spec, trace)
    digest = trace_digest(spec.trace)
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
        out.append(Point(index, values, argv, gpu, gpus, _key(digest, flags), invalid))
    _refuse_bad_values(spec, out)
    return out


def _refuse_unknown_flags(spec: SweepSpec, trace: str | None) -> None:
    sections = [("flags", spec.flags), ("axes", {k: v[0] for k, v in spec.axes.items()})]
    for where, flags in sections:
        for name, value in flags.items():
            try:
                parse_point(argv_of(trace, {name: value}))
            except ConfigError as exc:
                if str(exc).startswith("unrecognized arguments"):
                    raise ConfigError(f"{where}: unknown flag --{name} (the flags of "
                                      "`mocker replay --help`)") from None  # fmt: skip


def _refuse_bad_values(spec: SweepSpec, grid: list[Point]) -> None:
    if all(p.invalid for p in grid):
        first = grid[0]
        raise ConfigError(f"no point of the grid can run; the first ({first.label()}): "
                          f"{first.invalid}")  # fmt: skip
    for name, choices in spec.axes.items():
        for value in choices:
            mine = [p for p in grid if p.values[name] == value]
            if all(p.invalid for p in mine):
                raise ConfigError(f"axes: --{name} {value}: no point can run with it; "
                                  f"{mine[0].invalid}")  # fmt: skip
