"""Layered settings: defaults < YAML file < MOCKER_* environment < command-line flags."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from mocker.config import ConfigError
from mocker.settings.option import Option, parse_float, parse_int
from mocker.settings.vllm_compat import IGNORED_PREFIX, IGNORED_VLLM_FLAGS

__all__ = ["add_options", "resolve"]


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option], title: str) -> None:
    """Add options as flags whose absence is visible (default SUPPRESS), for layering."""
    group = parser.add_argument_group(title)
    for opt in options:
        shown = opt.default is not None and opt.kind != "flag"
        default_note = f" (default: {_show(opt.default)})" if shown else ""
        common: dict[str, Any] = {
            "dest": opt.dest,
            "default": argparse.SUPPRESS,
            "help": f"{opt.help}{default_note} [env {opt.env}]",
        }
        if opt.kind == "bool":
            group.add_argument(opt.flag, action=argparse.BooleanOptionalAction, **common)
        elif opt.kind == "flag":
            group.add_argument(opt.flag, action="store_true", **common)
        elif opt.kind == "names":
            group.add_argument(opt.flag, nargs="+", metavar=opt.metavar or "NAME", **common)
        else:
            metavar = opt.metavar or {"int": "N", "float": "X"}.get(opt.kind)
            group.add_argument(
                opt.flag, type=_argparse_type(opt), choices=opt.choices, metavar=metavar, **common
            )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _argparse_type(opt: Option) -> Callable[[str], Any]:
    parse = {"int": parse_int, "float": parse_float}.get(opt.kind, str)

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def resolve(
    namespace: argparse.Namespace,
    options: Sequence[Option],
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Final values of `options` and the warnings to print (ignored flags or keys).

    Precedence: command-line flag > MOCKER_* environment variable > YAML file > default.
    Raises ConfigError naming the setting and where it came from.
    """
    environ = os.environ if environ is None else environ
    values = {o.dest: o.default for o in options}
    warnings: list[str] = []
    if config_file is not None:
        values.update(_from_yaml(config_file, options, warnings))
    for opt in options:
        if opt.env in environ:
            values[opt.dest] = _convert(opt, environ[opt.env], opt.env)
    given = vars(namespace)
    for opt in options:
        if opt.dest in given:
            values[opt.dest] = given[opt.dest]
    for key in sorted(given):
        if key.startswith(IGNORED_PREFIX):
            flag = "--" + key.removeprefix(IGNORED_PREFIX).replace("_", "-")
            warnings.append(f"ignoring {flag}: no meaning for a mock engine")
    return values, warnings


def _from_yaml(path: str, options: Sequence[Option], warnings: list[str]) -> dict[str, Any]:
    known = {o.dest: o for o in options}
    values: dict[str, Any] = {}
    for dest, value in _read_yaml(path).items():
        if dest in IGNORED_VLLM_FLAGS:
            warnings.append(f"ignoring {dest!r} in {path}: no meaning for a mock engine")
            continue
        opt = known.get(dest)
        if opt is None:
            raise ConfigError(f"{path}: unknown setting {dest!r}")
        values[dest] = _convert(opt, value, f"{dest!r} in {path}", yaml_value=True)
    return values


def _convert(opt: Option, value: Any, where: str, *, yaml_value: bool = False) -> Any:
    try:
        return opt.parse_yaml(value) if yaml_value else opt.parse_text(value)
    except ValueError as exc:
        raise ConfigError(f"invalid {where}={value!r}: {exc}") from None


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path!r} must hold a mapping of setting: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}
